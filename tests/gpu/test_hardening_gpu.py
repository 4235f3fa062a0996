"""Hardening on CUDA: preemption under KV pressure in float32 with graphs on."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def prompts(n: int, seed: int, vocab: int = 256, lo: int = 3, hi: int = 60) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi, (n,), generator=g).tolist()
    return [torch.randint(0, vocab, (k,), generator=g).tolist() for k in lengths]


def test_kv_pressure_float32_graphs_equal_an_ample_pool(tiny_model_dir):
    """A pool of 20 pages of 8 for 8 requests of up to 90 tokens: requests are preempted and
    recomputed, through full decode and breakable prefill graphs, in float32; greedy tokens
    equal an engine whose pool holds everything, and every page comes back."""
    from nanograph import LLM, SamplingParams

    path = str(tiny_model_dir("qwen3"))
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    batch = prompts(8, seed=5)
    common = dict(dtype="float32", page_size=8, max_num_seqs=8, chunked_prefill_size=64,
                  cuda_graph_max_bs=8, progress=False)  # fmt: skip
    ample = LLM(path, **common)
    ref = [o.token_ids for o in ample.generate(batch, params)]
    small = LLM(path, max_total_tokens=160, **common)
    assert small.engine.kv_cache.allocator.num_usable == 20
    assert small.engine.runner.graph_runners.keys() == {"decode", "prefill"}
    outs = small.generate(batch, params)
    assert sum(o.num_preemptions for o in outs) > 0
    assert [o.token_ids for o in outs] == ref
    engine = small.engine  # every page free, or cached with no request reading it
    assert engine.scheduler.num_available_pages == engine.kv_cache.allocator.num_usable
