"""Where qwen3-0.6b's draft loop (a 2-token draft-extend, then the k-1 steps of the loop graph)
spends its time beside the drafter's plain decode step (stop 40, calls 1-2): synced times of
each piece, and with a second argument torch.profiler's kernels of 10 loops and a Chrome
trace. Run from a tree's root with its ``nanograph`` on the path: ``python3 prof_draft.py
OUTDIR [profile]``."""

import dataclasses
import json
import sys

import torch

from nanograph import LLM
from nanograph.bench.common import STARTUP_CAPTURE, median, timed
from nanograph.bench.spec import draft_loop_ms, drafter_decode_ms, scratch_batch
from nanograph.runners.forward_batch import ForwardBatch

out = sys.argv[1]
PROFILE = len(sys.argv) > 2  # call 1 profiled (and ran three rounds); call 2 did not (two)
K = 4


def synced(ms):
    """bench spec's synchronised figure: 079c0a8 on return (synced, back to back) pairs."""
    return ms[0] if isinstance(ms, tuple) else ms


llm = LLM(
    "qwen3-0.6b", load_format="dummy", prefill_cuda_graph="none", cuda_graph_bs=(1, 4),
    max_num_seqs=4, max_model_len=700, disable_prefix_caching=True, chunked_prefill_size=8192,
    progress=False, speculative_algorithm="draft_model", speculative_draft_model_path="qwen3-0.6b",
    speculative_num_draft_tokens=K, **STARTUP_CAPTURE,
)  # fmt: skip
engine = llm.engine
runner, page = engine.draft_runner, engine.config.page_size
loop = runner.graph_runners.get("draft")
print("draft runners:", {p: repr(r) for p, r in runner.graph_runners.items()})


def measure(bs: int) -> list[dict[str, float]]:
    extend = scratch_batch(bs, 2, 512, page, all_rows=False)
    step = ForwardBatch.build([[0]] * bs, [514] * bs, extend.page_tables, page, [True] * bs,
                              list(range(bs)))  # fmt: skip
    step = dataclasses.replace(step, slot_mapping=[-1] * bs)
    first = runner.forward(extend, path="draft_extend").argmax(-1)

    def run_loop() -> None:
        loop.draft_loop(step, runner.forward(extend, path="draft_extend").argmax(-1))

    def extend_only() -> None:
        runner.forward(extend, path="draft_extend").argmax(-1)

    rows = []
    for r in range(2):
        row = {
            "decode": synced(drafter_decode_ms(engine, bs, 512, 40)),
            "loop": synced(draft_loop_ms(engine, bs, K, 512, 40)),
            "extend": 1e3 * median(timed(extend_only, 40)),
            "loop_replay": 1e3 * median(timed(lambda: loop.draft_loop(step, first), 40)),
        }
        row["ratio"] = row["loop"] / (K * row["decode"])
        print(bs, r, {k: round(v, 4) for k, v in row.items()}, flush=True)
        rows.append(row)
    if PROFILE:
        for _ in range(5):
            run_loop()
        torch.cuda.synchronize()
        activities = [torch.profiler.ProfilerActivity.CUDA, torch.profiler.ProfilerActivity.CPU]
        with torch.profiler.profile(activities=activities) as p:
            for _ in range(10):
                run_loop()
                torch.cuda.synchronize()
        p.export_chrome_trace(f"{out}/trace_loop_b{bs}.json")
        kernels = sorted(((e.key, e.device_time_total / 10, e.count // 10)
                          for e in p.key_averages() if e.device_time_total > 0),
                         key=lambda r: -r[1])  # fmt: skip
        print(f"== batch {bs}: kernels {sum(r[1] for r in kernels) / 1000:.3f} ms a loop")
        for key, us, n in kernels[:25]:
            print(f"  {us:8.1f} us  x{n:4d}  {key[:100]}")
    return rows


results = {bs: measure(bs) for bs in (1, 4)}
with open(f"{out}/prof_draft.json", "w") as f:
    json.dump(results, f, indent=1)
