"""Where a batch-1 decode graph's time goes, kernel by kernel of a layer (stop 57; run on the
device from the repo root: ``python3 docs/wip/decode_breakdown.py OUT_DIR [models]``).

``bench floor`` attributes busy time by kernel name, which puts the q/k/v, o, gate/up and down
GEMVs under one name. Here the profiled replays of the decode graph (the engine's own,
``runner.forward`` on a batch-1 step at 511 tokens of context, or the environment's CONTEXT
less one) are walked in start order and each kernel gets the time it runs past every kernel
before it (under programmatic dependent launch a kernel starts early and waits: its own
duration overstates it). Kernels are labelled by their place in a layer (the period between
two attention kernels), so each product of the layer gets its own line: microseconds a layer
and a step, against the weight bytes it streams. Writes ``OUT_DIR/decode_breakdown.json``
and prints a table per model. ``NEW_TOKENS=n`` (stop 59) profiles instead an eager extend of
n tokens of one request after CONTEXT - n cached ones: the shape of speculative decoding's
draft-extend catch-up (n = 2), whose kernels (few-row products, separate norms and rope,
the extend attention) are those its graph holds. ``BATCH=b`` (stop 61) profiles a decode
step of b requests (their graph), ``FUSED_ROWS=0`` / ``1`` with the fused few-row layers
(the default since stop 61, ``ops.set_fused_rows``) off / on.
"""

import json
import os
import statistics
import sys
from pathlib import Path

import torch

from nanograph import LLM
from nanograph.bench.common import STARTUP_CAPTURE, free_engine
from nanograph.bench.floor import graph_replay_ms, step_batch

out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
models = (sys.argv[2] if len(sys.argv) > 2 else "qwen3-8b,qwen3-0.6b").split(",")
REPEATS = 20
CONTEXT = int(os.environ.get("CONTEXT", 512))  # tokens the step's row follows
BATCH = int(os.environ.get("BATCH", 1))  # requests a decode step takes
NEW_TOKENS = int(os.environ.get("NEW_TOKENS", 1))  # > 1: an eager extend of that many tokens
# idle that separates two synchronised forwards: an eager extend's own launches are host-bound,
# 20-80 us apart on an H100 (stop 59's NEW_TOKENS=2 run split every forward at 25 us)
GAP_US = 25.0 if NEW_TOKENS == 1 else 200.0


def kernels_of(trace_path: Path) -> list[list[tuple[float, float, str]]]:
    """Per profiled forward: (start us, end us, label) of each kernel, in start order. The
    forwards are synchronised apart, so a new one starts after a gap of the host's whole
    forward (tens of us; kernels inside a forward are queued ahead of the GPU)."""
    events = json.loads(trace_path.read_text())["traceEvents"]
    ks = sorted(
        (e["ts"], e["ts"] + e["dur"], e["name"] + f" grid={tuple(e['args'].get('grid', ()))}")
        for e in events if e.get("cat") == "kernel"
    )  # fmt: skip
    forwards: list[list[tuple[float, float, str]]] = []
    reach = None
    for k in ks:
        if reach is None or k[0] - reach > GAP_US:
            forwards.append([])
        forwards[-1].append(k)
        reach = k[1] if reach is None else max(reach, k[1])
    return forwards


def attribute(forward: list[tuple[float, float, str]]) -> tuple[list[float], float]:
    """Each kernel's busy time past every kernel before it; the idle time inside the forward."""
    out, reach, idle = [], None, 0.0
    for start, end, _ in forward:
        if reach is not None and start > reach:
            idle += start - reach
        out.append(max(end - max(start, reach if reach is not None else start), 0.0))
        reach = end if reach is None else max(reach, end)
    return out, idle


def breakdown(model: str) -> dict:
    from torch.profiler import ProfilerActivity, profile

    if "FUSED_ROWS" in os.environ:
        from nanograph.layers import ops

        ops.set_fused_rows("auto" if os.environ["FUSED_ROWS"] == "1" else "off")
    llm = LLM(model, load_format="dummy", prefill_cuda_graph="none", cuda_graph_bs=(BATCH,),
              max_num_seqs=BATCH, max_model_len=CONTEXT + 64, progress=False,
              **STARTUP_CAPTURE)  # fmt: skip
    runner = llm.engine.runner
    batch, pages = step_batch(llm, CONTEXT, BATCH, new_tokens=NEW_TOKENS)
    for _ in range(5):
        runner.forward(batch)
    torch.cuda.synchronize()
    replay_ms = graph_replay_ms(runner, batch, BATCH, 200) if NEW_TOKENS == 1 else None
    trace = out_dir / f"trace_{model}.json"
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPEATS):
            runner.forward(batch)
            torch.cuda.synchronize()  # forwards apart: each one's kernels are its own
    prof.export_chrome_trace(str(trace))
    for p in pages:
        llm.engine.kv_cache.allocator.free(p)
    forwards = [f for f in kernels_of(trace) if len(f) > 10][1:]  # the first may be cut
    n = statistics.mode(len(f) for f in forwards)
    forwards = [f for f in forwards if len(f) == n]
    labels = [k[2] for k in forwards[0]]
    per_kernel = [statistics.median(attribute(f)[0][i] for f in forwards) for i in range(n)]
    idle = statistics.median(attribute(f)[1] for f in forwards)
    span = statistics.median(f[-1][1] - f[0][0] for f in forwards)
    att = [i for i, name in enumerate(labels) if "attention" in name.lower()]
    period = att[1] - att[0] if len(att) > 1 else n
    lo, hi = att[0], att[-1] + period  # the layers: from the first attention, whole periods
    rows: dict[str, list[float]] = {}
    for i in range(n):
        if lo <= i < hi:
            key = f"layer[{(i - lo) % period}] {labels[i]}"
        else:
            key = f"{'head' if i < lo else 'tail'} {labels[i]}"
        rows.setdefault(key, []).append(per_kernel[i])
    free_engine(llm)
    table = {k: {"count": len(v), "us_each": statistics.median(v), "us_step": sum(v)}
             for k, v in rows.items()}  # fmt: skip
    return {"kernels": n, "period": period, "layers": len(att), "span_us": span,
            "idle_us": idle, "busy_us": sum(per_kernel), "replay_ms": replay_ms,
            "table": table}  # fmt: skip


results = {}
for model in models:
    r = results[model] = breakdown(model)
    print(f"\n{model}: {r['kernels']} kernels a forward, {r['layers']} layers of {r['period']}; "
          f"span {r['span_us']:.1f} us (busy {r['busy_us']:.1f}, idle {r['idle_us']:.1f}); "
          f"graph replayed back to back {r['replay_ms']} ms")  # fmt: skip
    for key, row in r["table"].items():
        each, count, step = row["us_each"], row["count"], row["us_step"]
        print(f"  {each:7.2f} us x {count:3d} = {step:8.1f}  {key[:110]}")
    (out_dir / "decode_breakdown.json").write_text(json.dumps(results, indent=1))
