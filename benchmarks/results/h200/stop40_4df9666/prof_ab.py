"""Device-time A/B of qwen3-0.6b's draft loop pieces (stop 40, call 3): forwards issued back to
back (the host runs ahead; ms per forward on the device) and the synced figures bench spec
times. Target and drafter are qwen3-0.6b (self-draft, k = 4). Run from a tree's root with its
``nanograph`` on the path: ``python3 prof_ab.py NAME``."""

import dataclasses
import sys
import time

import torch

from nanograph import LLM
from nanograph.bench.common import STARTUP_CAPTURE
from nanograph.bench.spec import draft_loop_ms, drafter_decode_ms, scratch_batch
from nanograph.runners.forward_batch import ForwardBatch

K = 4


def synced(ms):
    """bench spec's synchronised figure: 079c0a8 on return (synced, back to back) pairs."""
    return ms[0] if isinstance(ms, tuple) else ms


llm = LLM(
    "qwen3-0.6b", load_format="dummy", prefill_cuda_graph="none", cuda_graph_bs=(1, 2, 4, 8),
    max_num_seqs=8, max_model_len=700, disable_prefix_caching=True, chunked_prefill_size=8192,
    progress=False, speculative_algorithm="draft_model", speculative_draft_model_path="qwen3-0.6b",
    speculative_num_draft_tokens=K, **STARTUP_CAPTURE,
)  # fmt: skip
engine = llm.engine
draft, target, page = engine.draft_runner, engine.runner, engine.config.page_size
loop = draft.graph_runners["draft"]


def back_to_back(fn, n: int = 40) -> float:
    """Ms per call of ``fn`` issued n times with one sync at the end (median of 3)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / n * 1e3)
    return sorted(samples)[1]


def decode_ms(bs: int) -> float:
    decode = scratch_batch(bs, 1, 512, page, False)
    return back_to_back(lambda: target.forward(decode).argmax(-1))


def loop_costs(bs: int) -> dict[str, float]:
    extend = scratch_batch(bs, 2, 512, page, all_rows=False)
    step = ForwardBatch.build([[0]] * bs, [514] * bs, extend.page_tables, page, [True] * bs,
                              list(range(bs)))  # fmt: skip
    step = dataclasses.replace(step, slot_mapping=[-1] * bs)

    def ext():
        return draft.forward(extend, path="draft_extend").argmax(-1)

    r = {
        "extend_b2b": back_to_back(ext),
        "decode_b2b": decode_ms(bs),
        "loop_b2b": back_to_back(lambda: loop.draft_loop(step, ext()), 20),
    }
    r["loop_over_k_decode_b2b"] = r["loop_b2b"] / (K * r["decode_b2b"])
    r["synced_decode"] = synced(drafter_decode_ms(engine, bs, 512, 40))
    r["synced_loop"] = synced(draft_loop_ms(engine, bs, K, 512, 40))
    r["synced_ratio"] = r["synced_loop"] / (K * r["synced_decode"])
    return r


for bs in (1, 4):
    costs = loop_costs(bs)
    print(f"{sys.argv[1]} batch {bs}: " + " ".join(f"{k} {v:.4f}" for k, v in costs.items()))
for bs in (2, 8):
    print(f"{sys.argv[1]} decode batch {bs}: b2b {decode_ms(bs):.4f} ms")
