"""Device-time A/B (stop 41): qwen3-0.6b decode at batch 1-8 and the draft loop's pieces
(self-draft, k = 4), forwards issued back to back. ``python3 ab_rows.py NAME`` from a tree."""

import dataclasses
import sys
import time

import torch

from nanograph import LLM
from nanograph.bench.common import STARTUP_CAPTURE
from nanograph.bench.spec import draft_loop_ms, drafter_decode_ms, scratch_batch
from nanograph.runners.forward_batch import ForwardBatch

K = 4
llm = LLM(
    "qwen3-0.6b", load_format="dummy", prefill_cuda_graph="none", cuda_graph_bs=(1, 2, 3, 4, 8),
    max_num_seqs=8, max_model_len=700, disable_prefix_caching=True, chunked_prefill_size=8192,
    progress=False, speculative_algorithm="draft_model", speculative_draft_model_path="qwen3-0.6b",
    speculative_num_draft_tokens=K, **STARTUP_CAPTURE,
)  # fmt: skip
engine = llm.engine
draft, target, page = engine.draft_runner, engine.runner, engine.config.page_size
loop = draft.graph_runners["draft"]


def back_to_back(fn, n=40):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / n * 1e3)
    return sorted(samples)[2]


def decode_ms(bs):
    decode = scratch_batch(bs, 1, 512, page, False)
    return back_to_back(lambda: target.forward(decode).argmax(-1))


def loop_costs(bs):
    r = {"decode_b2b": decode_ms(bs)}
    for catch_up in (2, 1):
        extend = scratch_batch(bs, catch_up, 512, page, all_rows=False)
        step = ForwardBatch.build([[0]] * bs, [512 + catch_up] * bs, extend.page_tables, page,
                                  [True] * bs, list(range(bs)))  # fmt: skip
        step = dataclasses.replace(step, slot_mapping=[-1] * bs)

        def ext(extend=extend):
            return draft.forward(extend, path="draft_extend").argmax(-1)

        r[f"extend{catch_up}_b2b"] = back_to_back(ext)
        r[f"loop{catch_up}_b2b"] = back_to_back(lambda s=step, e=ext: loop.draft_loop(s, e()), 20)
        r[f"loop{catch_up}_ratio_b2b"] = r[f"loop{catch_up}_b2b"] / (K * r["decode_b2b"])
        loop_s = draft_loop_ms(engine, bs, K, 512, 40, catch_up=catch_up)
        step_s = drafter_decode_ms(engine, bs, 512, 40)[0]
        r[f"loop{catch_up}_ratio_synced"] = loop_s[0] / (K * step_s)
    return r


for bs in (1, 4):
    costs = loop_costs(bs)
    figures = " ".join(f"{k} {v:.4f}" for k, v in costs.items())
    print(f"{sys.argv[1]} batch {bs}: {figures}", flush=True)
figures = " ".join(f"b{bs} {decode_ms(bs):.4f}" for bs in (1, 2, 3, 4, 8))
print(f"{sys.argv[1]} decode b2b: {figures}")
print(f"{sys.argv[1]} replays: " + str({p: r.replays for p, r in draft.graph_runners.items()}))
