"""Kernel times of qwen3-8b's verify forward (ngram:4) at batch 1 and 4, in this tree (calls 5
and 6 of stop 39; call 5 ran it without the back-to-back line). Run from a tree's root with
its ``nanograph`` on the path: ``python3 prof_verify.py NAME``."""

import sys
import time

import torch

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


def back_to_back_ms(batch, n: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        runner.forward(batch, path="verify").argmax(-1)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / n * 1e3


for bs in (1, 4):
    b = scratch_batch(bs, 5, 512, page, all_rows=True)
    for _ in range(5):
        runner.forward(b, path="verify").argmax(-1)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        for _ in range(10):
            runner.forward(b, path="verify").argmax(-1)
        torch.cuda.synchronize()
    rows = sorted(
        ((e.key, e.device_time_total / 10, e.count // 10) for e in p.key_averages()),
        key=lambda r: -r[1],
    )
    total = sum(r[1] for r in rows)
    shapes = sorted(str(k) for k in runner.graph_runners["verify"].records)
    print(f"== {sys.argv[1]} batch {bs}: back to back {back_to_back_ms(b, 20):.3f} ms; "
          f"counts {runner.forward_counts()}; verify shapes {shapes}")  # fmt: skip
    print(f"== {sys.argv[1]} verify batch {bs}: kernels {total / 1000:.3f} ms a forward")
    for key, us, n in rows[:14]:
        print(f"  {us:8.1f} us  x{n:4d}  {key[:90]}")
