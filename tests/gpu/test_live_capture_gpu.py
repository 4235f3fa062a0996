"""Serve while capturing on CUDA: a stream of mixed requests that starts the moment the engine
is ready gives the same greedy tokens under background and lazy capture as an all-eager engine
and a start-up-capture engine; memory stops growing once capture is done; eviction under a
small budget keeps tokens identical; left at auto, the capture mode on CUDA is background with
the learned ladder.

float32 keeps greedy ties out of the comparison (as in test_prefix_gpu.py), so tokens must be
identical whether a request ran before, during or after its shape was captured. Full decode and
breakable prefill graphs (the defaults) on a small random Qwen3; 16 prefill request slots, so
the mixed batches of a stream (new prompts beside decoding requests) fit prefill graphs.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CONFIG = dict(
    dtype="float32", page_size=16, chunked_prefill_size=256,
    prefill_graph_tokens=(32, 64, 128, 256), prefill_graph_slots=16, cuda_graph_max_bs=16,
    max_num_seqs=16, mem_fraction=0.3, disable_prefix_caching=True, progress=False,
)  # fmt: skip
WAIT_S = 300  # for the capture thread to finish the ladder (seconds; ~20 small shapes)


@pytest.fixture(scope="module")
def model_dir(small_qwen3):
    return small_qwen3("qwen3-live")


def workload(n: int, seed: int):
    """``n`` requests: prompts of 3-400 tokens (some longer than a 256-token chunk), 4-40 new
    tokens each, one arriving every 3 steps: decode batches grow and shrink through the ladder."""
    from nanograph import SamplingParams

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 400, (n,), generator=g).tolist()
    prompts = [torch.randint(0, 4096, (k,), generator=g).tolist() for k in lengths]
    params = [
        SamplingParams(max_tokens=int(m), temperature=0.0, ignore_eos=True)
        for m in torch.randint(4, 41, (n,), generator=g)
    ]
    return [(3 * i, p, s) for i, (p, s) in enumerate(zip(prompts, params))]


def run_stream(engine, requests) -> list[list[int]]:
    """Steps the engine, adding each request at its step; the tokens of each, in order."""
    from nanograph.engine.request import Status

    pending, added, step = list(requests), [], 0
    while pending or engine.has_work():
        while pending and pending[0][0] <= step:
            _, prompt, params = pending.pop(0)
            added.append(engine.add_request(prompt, params))
        engine.step()
        step += 1
    assert all(r.status is Status.FINISHED and r.finish_reason == "length" for r in added)
    return [list(r.output_ids) for r in added]


def engine(model_dir, **overrides):
    import gc

    from nanograph import LLM

    # an earlier test's engine (live runners and their controller refer to each other) must
    # be gone before this one sizes its KV pool from the memory left
    gc.collect()
    torch.cuda.empty_cache()
    return LLM(model_dir, **{**CONFIG, **overrides}).engine


@pytest.fixture(scope="module")
def eager_tokens(model_dir):
    e = engine(model_dir, decode_cuda_graph="none", prefill_cuda_graph="none")
    return {seed: run_stream(e, workload(24, seed)) for seed in (0, 1)}


def test_startup_capture_matches_eager(model_dir, eager_tokens):
    e = engine(model_dir, cuda_graph_capture="startup")
    assert run_stream(e, workload(24, 0)) == eager_tokens[0]
    assert all(r.replays > 0 for r in e.runner.graph_runners.values())


def test_auto_capture_on_cuda_serves_while_capturing(model_dir):
    """cuda_graph_capture left at auto (the default): a capture thread, started as the engine
    became ready (the modes themselves are checked above and below)."""
    e = engine(model_dir)
    try:
        live = e.live_capture
        assert e.config.capture_mode == "background" and e.config.ladder_mode == "auto"
        assert live is not None and live.mode == "background"
        assert all(r.ladder_mode == "auto" for r in live.runners.values())
        assert live.worker.alive or e.wait_for_graphs(0)  # or it has captured the whole ladder
    finally:
        e.close()


@pytest.mark.parametrize("mode", ["background", "lazy"])
def test_stream_from_ready_matches_eager_before_during_and_after_capture(
    model_dir, eager_tokens, mode
):
    # the configured ladders (background's default is the learned one, tested below)
    e = engine(model_dir, cuda_graph_capture=mode, cuda_graph_ladder="default")
    try:
        during = run_stream(e, workload(24, 0))  # from the moment the engine is ready
        assert e.wait_for_graphs(WAIT_S)
        after = run_stream(e, workload(24, 1))
    finally:
        e.close()
    stats = e.graph_capture_stats()
    print(f"\n{mode}: {e.live_capture.summary()}")
    for path, p in stats["paths"].items():
        print(f"  {path}: busy fallbacks {p['busy_fallbacks']}, histogram {p['histogram']}")
    assert during == eager_tokens[0]
    assert after == eager_tokens[1]
    assert stats["captures"] > 0
    for path, p in stats["paths"].items():
        assert p["states"]["failed"] == 0, (path, p["failed"])
        assert e.runner.graph_runners[path].replays > 0, path
    if mode == "background":  # the configured ladders are complete
        assert all(p["states"]["ready"] == len(p["ladder"]) for p in stats["paths"].values())


def test_background_and_learned_ladder_match_eager(model_dir, eager_tokens):
    import time

    from nanograph.runners.live_runner import REPLAN_S

    e = engine(model_dir, cuda_graph_capture="background", cuda_graph_ladder="auto")
    try:
        first = run_stream(e, workload(24, 0))  # nothing planned before batches are seen
        time.sleep(2 * REPLAN_S)  # the capture thread plans from the histogram and captures
        assert e.wait_for_graphs(WAIT_S)
        second = run_stream(e, workload(24, 1))
    finally:
        e.close()
    assert first == eager_tokens[0] and second == eager_tokens[1]
    decode = e.graph_capture_stats()["paths"]["decode"]
    print(f"\nlearned decode ladder {decode['ladder']} from {decode['histogram']}")
    largest_seen = max(decode["histogram"])
    ceiling = min(b for b in (1, 2, 4, 8, 16) if b >= largest_seen)
    assert decode["ladder"]
    assert max(int(s.split("x")[0]) for s in decode["ladder"]) <= ceiling
    assert e.runner.graph_runners["decode"].replays > 0


@pytest.mark.parametrize("ladder", ["default", "auto"])
def test_no_memory_growth_over_1000_steps_once_captured(model_dir, ladder):
    """With the learned ladder (background's default) the ladder is re-planned from the
    histogram every REPLAN_S; under a steady workload it must settle, not keep capturing."""
    import time

    from nanograph import SamplingParams
    from nanograph.runners.live_runner import REPLAN_S

    e = engine(model_dir, cuda_graph_capture="background", cuda_graph_ladder=ladder)
    try:
        g = torch.Generator().manual_seed(3)
        params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)

        def steps(n: int) -> None:
            for _ in range(n):  # keep ~8 requests of 20-200 prompt tokens in flight
                while len(e.scheduler.running) + len(e.scheduler.waiting) < 8:
                    k = int(torch.randint(20, 200, (1,), generator=g))
                    e.add_request(torch.randint(0, 4096, (k,), generator=g).tolist(), params)
                e.step()

        steps(50)  # serving starts before capture ends
        assert e.wait_for_graphs(WAIT_S)
        if ladder == "auto":  # re-plans from a fuller histogram, captures what they add
            for _ in range(3):
                steps(100)
                time.sleep(2 * REPLAN_S)
                assert e.wait_for_graphs(WAIT_S)
        steps(100)  # every shape of this workload has been replayed once
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        steps(1000)
        torch.cuda.synchronize()
        after = torch.cuda.memory_allocated()
    finally:
        e.close()
    ladders = {p: s["ladder"] for p, s in e.graph_capture_stats()["paths"].items()}
    print(f"\n{ladder} ladder: allocated after warm-up {before / 2**20:.1f} MiB, 1000 steps "
          f"later {after / 2**20:.1f} MiB; ladders {ladders}")  # fmt: skip
    assert after - before <= 2**20  # transient tensors of the step in flight, nothing more


def test_eviction_under_a_small_budget_keeps_tokens(model_dir, eager_tokens):
    e = engine(model_dir, cuda_graph_capture="lazy", cuda_graph_memory="64MiB")
    budget = e.live_capture.budget
    # The budget in units of one graph: at most three graphs live at once, whatever their pool
    # holds (calibration then fits 0 bytes per token). Under test is that evicting graphs and
    # rebuilding pools mid-stream keep tokens identical, not the memory model.
    budget.limit, budget.shape_bytes = 3 * 2**40 + 2**39, 2**40
    try:
        first = run_stream(e, workload(24, 0))
        second = run_stream(e, workload(24, 1))
    finally:
        e.close()
    print(f"\n{e.live_capture.summary()}; rebuilds {budget.rebuilds}")
    assert first == eager_tokens[0] and second == eager_tokens[1]
    assert budget.evictions > 0
    assert sum(len(r.graphs) for r in e.runner.graph_runners.values()) <= 3
