"""What the LM head and the argmax inside the decode graph would save (stop 60; run on the device
from the repo root: ``python3 docs/wip/lm_head_graph_probe.py [models] [batches]``).

Why: a decode step replays the graph (final hidden states), then runs eagerly the sampled rows'
index (a pageable 8-byte copy and a gather), the LM head GEMV and the argmax. On an H100 at
bd9bd52 qwen3-0.6b's graph replays back to back in 0.680 ms and ``runner.forward`` + argmax in
0.827 (stop 59): 0.147 ms past the graph for ~0.105 of kernels (LM head ~98 us, gather ~3.7,
argmax ~2.9). Stop 59's note guessed ~10 us a step from moving them into the graph; the gap says
up to ~40. Stop 37 found a "slow state" on qwen3-30b-a3b (replays ~6% slower after eager kernels
read the graph's output in place), so each model runs the current step, then the in-graph step,
then the current step again.

For each model and batch: (a) ``runner.forward(batch)`` + ``ops.argmax``, back to back (the
engine's greedy step without its host sync); (b) the decode graph alone, replayed back to back;
(c) a graph of the same forward + LM head + argmax (captured by the runner's backend into its
pool, over its static inputs), with the input copy ``replay`` does, back to back; (d) (c)'s graph
alone; (a) again. Checks (c)'s tokens equal (a)'s. Not wired into the engine.
PREDICTED (H100, before any run): qwen3-0.6b batch 1 (c) 0.79-0.80 ms against (a) 0.827 (-4%);
batch 8 -2%; qwen3-8b batch 1 -0.5 to -1%; qwen3-30b-a3b (c) no slower than (a), (a) unchanged
after (c).
MEASURED (stop 60, H100, ``h100/stop60_c25a30c/lm_head_probe/``): (c) against (a), tokens equal
everywhere: qwen3-0.6b batch 1 0.7809 against 0.7957 ms (**-1.9%**; this machine's (a) is
faster than stop 59's 0.827), batch 8 -0.9%; qwen3-30b-a3b -0.4% / -0.1%; qwen3-8b -0.2% /
-0.2%. (a) and (b) the same before and after (c): no slow state. The eager tail costs ~15 us a
step more than the same kernels in the graph (stop 59's note guessed ~10), not ~40: not worth
a logits buffer per runner in the memory plan. Not wired in.
"""

import sys
import time

import torch

from nanograph import LLM
from nanograph.attention.op import forward_context
from nanograph.bench.common import STARTUP_CAPTURE, sync
from nanograph.bench.floor import step_batch
from nanograph.layers import ops

MODELS = sys.argv[1].split(",") if len(sys.argv) > 1 else ["qwen3-0.6b", "qwen3-30b-a3b"]
BATCHES = [int(b) for b in sys.argv[2].split(",")] if len(sys.argv) > 2 else [1, 8]
REPEATS = 300


def timed_ms(fn, repeats: int = REPEATS) -> float:
    """Median of five runs of ``repeats`` calls back to back, ms a call."""
    runs = []
    for _ in range(5):
        sync()
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        sync()
        runs.append(1000 * (time.perf_counter() - start) / repeats)
    return sorted(runs)[2]


def replay_ms(graph, ctx) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with forward_context(ctx):
        graph.replay()
        start.record()
        for _ in range(REPEATS):
            graph.replay()
        end.record()
    sync()
    return start.elapsed_time(end) / REPEATS


def measure(llm, bs: int) -> str:
    runner = llm.engine.runner
    decode = runner.graph_runners["decode"]
    batch, pages = step_batch(llm, 512, bs)
    shape = decode.dispatch(batch)
    ctx = decode.contexts[shape]
    n = shape.num_tokens
    ids, pos = decode.static.input_ids[:n], decode.static.positions[:n]
    tokens = torch.zeros(n, dtype=torch.long, device="cuda")

    def whole_step() -> torch.Tensor:
        hidden = decode.model(ids, pos)
        return ops.argmax(decode.model.compute_logits(hidden), out=tokens)

    decode.static.copy_from(batch, shape)
    with forward_context(ctx), torch.inference_mode():
        graph, _ = decode.backend.capture(whole_step, pool=decode.pool)

    def current() -> torch.Tensor:
        return ops.argmax(runner.forward(batch))

    def in_graph() -> torch.Tensor:
        decode.static.copy_from(batch, shape)
        batch.fill_future(decode.static.input_ids, None)
        with forward_context(ctx):
            graph.replay()
        return tokens[: batch.num_requests]

    with torch.inference_mode():
        want = current().clone()
        got = in_graph().clone()
        same = torch.equal(want, got)
        a = timed_ms(current)
        b = replay_ms(decode.graphs[shape], ctx)
        c = timed_ms(in_graph)
        d = replay_ms(graph, ctx)
        a2 = timed_ms(current)
        b2 = replay_ms(decode.graphs[shape], ctx)
    for p in pages:
        llm.engine.kv_cache.allocator.free(p)
    return (
        f"batch {bs}: (a) forward + argmax {a:.4f} ms, (b) graph {b:.4f}, (c) in-graph step "
        f"{c:.4f} ({100 * (c / a - 1):+.1f}%), (d) its graph {d:.4f}, (a) again {a2:.4f}, "
        f"(b) again {b2:.4f}; tokens equal: {same}"
    )


for model in MODELS:
    llm = LLM(model, load_format="dummy", prefill_cuda_graph="none", cuda_graph_bs=tuple(BATCHES),
              max_num_seqs=max(BATCHES), max_model_len=1024, disable_prefix_caching=True,
              progress=False, **STARTUP_CAPTURE)  # fmt: skip
    for bs in BATCHES:
        print(model, measure(llm, bs), flush=True)
    del llm
    torch.cuda.empty_cache()
