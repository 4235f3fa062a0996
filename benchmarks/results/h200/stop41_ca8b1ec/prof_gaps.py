"""Where a forward's GPU idle sits (stop 41): qwen3-8b's verify (k + 1 = 5 tokens a request)
and decode forwards at batch 1 and 4, ten issued back to back under torch.profiler; per forward:
span, busy, and the largest gaps between consecutive kernels by the kernels around them."""

import collections
import sys

import torch
from torch.autograd import DeviceType

from nanograph import LLM
from nanograph.bench.common import STARTUP_CAPTURE
from nanograph.bench.spec import scratch_batch

llm = LLM(
    "qwen3-8b", load_format="dummy", prefill_cuda_graph="none", cuda_graph_bs=(1, 4),
    max_num_seqs=4, max_model_len=700, disable_prefix_caching=True, chunked_prefill_size=8192,
    progress=False, speculative_algorithm="ngram", speculative_num_draft_tokens=4,
    **STARTUP_CAPTURE,
)  # fmt: skip
runner, page = llm.engine.runner, llm.engine.config.page_size
N = 10


def short(name: str) -> str:
    return name.split("(")[0][:48]


for path, tokens in (("verify", 5), ("decode", 1)):
    for bs in (1, 4):
        b = scratch_batch(bs, tokens, 512, page, all_rows=True)
        for _ in range(5):
            runner.forward(b, path=path).argmax(-1)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
            for _ in range(N):
                runner.forward(b, path=path).argmax(-1)
            torch.cuda.synchronize()
        ks = sorted(
            (e.time_range.start, e.time_range.end, e.name)
            for e in p.events()
            if e.device_type == DeviceType.CUDA
        )
        span = (ks[-1][1] - ks[0][0]) / N
        busy_end, busy = ks[0][0], 0.0
        gaps = collections.Counter()
        counts = collections.Counter()
        prev = None
        for start, end, name in ks:
            if start > busy_end and prev is not None:
                gap = start - busy_end
                gaps[(short(prev), short(name))] += gap / N
                counts[(short(prev), short(name))] += 1
            busy += max(0.0, end - max(start, busy_end))
            if end > busy_end:
                busy_end, prev = end, name
        print(f"== {sys.argv[1]} {path} batch {bs}: {span / 1e3:.3f} ms a forward, busy "
              f"{busy / N / 1e3:.3f}, idle {(span - busy / N) / 1e3:.3f}; kernels "
              f"{len(ks) / N:.0f}")  # fmt: skip
        for (a, c), us in gaps.most_common(8):
            print(f"  {us:7.1f} us idle a forward  x{counts[(a, c)] / N:5.1f}  {a} -> {c}")
