"""Every path x graph backend against eager on CUDA: same greedy tokens for a mixed batch
(prompts longer than a chunk, varied max_tokens), slot-count edge cases, and replay counters.

A small random Qwen3 keeps tc_piecewise compiles short; agreement figures print with -s.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SMALL = dict(
    page_size=16, chunked_prefill_size=256, prefill_graph_tokens=(64, 128, 256),
    prefill_graph_slots=4, cuda_graph_max_bs=8, max_num_seqs=16, mem_fraction=0.3,
    progress=False, cuda_graph_capture="startup",
)  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(small_qwen3):
    return small_qwen3("qwen3-small")


def requests(n: int, seed: int):
    from nanograph import SamplingParams

    g = torch.Generator().manual_seed(seed)
    lengths = [300, 40, 7, 128, 90, 520, 16, 64][:n]  # some longer than the 256-token chunk
    prompts = [torch.randint(0, 4096, (k,), generator=g).tolist() for k in lengths]
    params = [SamplingParams(max_tokens=m, temperature=0, ignore_eos=True)
              for m in (24, 9, 17, 30, 5, 12, 20, 8)[:n]]  # fmt: skip
    return prompts, params


@pytest.fixture(scope="module")
def eager_tokens(model_dir):
    """Per request count, the eager engine's tokens: with the fused few-row layers (the default)
    and without (what tc_piecewise's compiled decode runs: dynamo does not trace the fused
    kernels, and they round elsewhere, so a random model's near-ties fall another way)."""
    from nanograph import LLM
    from nanograph.layers import ops

    tokens = {}
    for fused in (True, False):
        ops.set_fused_rows("auto" if fused else "off")
        try:
            llm = LLM(model_dir, decode_cuda_graph="none", prefill_cuda_graph="none", **SMALL)
            tokens[fused] = {n: [o.token_ids for o in llm.generate(*requests(n, seed=n))]
                             for n in (3, 4, 5, 8)}  # fmt: skip
        finally:
            ops.set_fused_rows("auto")
        del llm
    return tokens


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    pairs = [(x, y) for ta, tb in zip(a, b) for x, y in zip(ta, tb)]
    return sum(x == y for x, y in pairs) / len(pairs)


CASES = [
    ("full", "none", False), ("breakable", "none", False), ("tc_piecewise", "none", False),
    ("none", "full", False), ("none", "breakable", False), ("none", "tc_piecewise", False),
    ("full", "breakable", True),  # debug mode: both paths as one eager break
]  # fmt: skip


@pytest.mark.parametrize("decode, prefill, debug", CASES)
def test_path_backend_matches_eager(model_dir, eager_tokens, decode, prefill, debug):
    from nanograph import LLM

    llm = LLM(model_dir, decode_cuda_graph=decode, prefill_cuda_graph=prefill,
              debug_cuda_graph=debug, **SMALL)  # fmt: skip
    runners = llm.engine.runner.graph_runners
    for n in (3, 4, 5, 8):  # fewer requests than the 4 slots, exactly 4, one more, many more
        got = [o.token_ids for o in llm.generate(*requests(n, seed=n))]
        want = eager_tokens[decode != "tc_piecewise"][n]
        rate = agreement(got, want)
        print(f"\ndecode={decode} prefill={prefill} debug={debug} n={n}: agreement {rate:.3f}")
        assert [len(t) for t in got] == [len(t) for t in want]
        assert rate >= 0.9
    for path, runner in runners.items():
        print(f"  {runner}")
        assert runner.replays > 0, path
        assert not runner.failed, (path, runner.failed)  # every shape of the ladder captured
    if "prefill" in runners:
        assert runners["prefill"].fallbacks > 0  # 5+ requests in one forward > 4 slots


def test_graphs_off_runs_a_graph_engine_eagerly(model_dir, eager_tokens):
    """``ModelRunner.graphs_off`` (``bench prefill --eager-beside``): inside it an engine with
    decode and prefill graphs replays none and gives the eager engine's tokens (the same eager
    forwards, so exactly); after it the graphs replay again."""
    from nanograph import LLM

    llm = LLM(model_dir, decode_cuda_graph="full", prefill_cuda_graph="full", **SMALL)
    runner = llm.engine.runner
    before = runner.forward_counts()
    with runner.graphs_off():
        got = [o.token_ids for o in llm.generate(*requests(5, seed=5))]
    during = runner.forward_counts()
    llm.generate(*requests(3, seed=3))
    after = runner.forward_counts()
    assert got == eager_tokens[True][5]
    for path in ("decode", "prefill"):
        assert during[path]["graph"] == before[path]["graph"], (path, before, during)
        assert during[path]["eager"] > before[path]["eager"], (path, before, during)
        assert after[path]["graph"] > during[path]["graph"], (path, during, after)


def test_largest_chunk_replays_a_graph(model_dir):
    from nanograph import LLM, SamplingParams
    from nanograph.runners.shapes import ShapeKey

    llm = LLM(model_dir, decode_cuda_graph="none", prefill_cuda_graph="full", **SMALL)
    prefill = llm.engine.runner.graph_runners["prefill"]
    assert ShapeKey(256, 4) in prefill.graphs
    before = prefill.replays
    llm.generate([list(range(1, 600))], SamplingParams(max_tokens=1, temperature=0))
    assert prefill.replays - before == 3  # 599 tokens = chunks of 256, 256, 87
    assert prefill.fallbacks == 0


def test_full_prefill_refuses_host_planned_attention(model_dir):
    from nanograph import LLM

    with pytest.raises(ValueError, match="reads Python lengths"):
        LLM(model_dir, attention_backend="torch_native", prefill_cuda_graph="full", **SMALL)
    # breakable takes it: the attention split op is an eager break
    llm = LLM(model_dir, attention_backend="torch_native", prefill_cuda_graph="breakable",
              decode_cuda_graph="breakable", **SMALL)  # fmt: skip
    assert llm.engine.runner.graph_runners["prefill"].graphs


def test_memory_report(model_dir):
    from nanograph import LLM

    llm = LLM(model_dir, **SMALL)
    report = llm.engine.memory
    print("\n" + report.table())
    assert report.kv_pool > 0 and report.weights > 0 and report.activation_peak > 0
    assert set(report.graph_pools) == {"decode", "prefill"}
    assert all(n > 0 for n in report.graph_pools.values())
