"""Prefix caching on CUDA under each prefill graph backend (full, breakable, tc_piecewise) with
the default ladders: the same greedy tokens with caching on as with it off.

A cached prefix is only more KV pages in the attention metadata (``seq_len > query_len``), so
the prefill graphs replay batches whose requests start past a cached head, mixed with fresh
requests and zero-length sentinel slots. float32 keeps greedy ties out of the comparison, so
tokens must be identical; the second wave must hit the cache and replay prefill graphs.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CONFIG = dict(
    dtype="float32", page_size=16, chunked_prefill_size=512, cuda_graph_max_bs=16,
    max_num_seqs=32, mem_fraction=0.3, progress=False, cuda_graph_capture="startup",
)  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(small_qwen3):
    return small_qwen3("qwen3-prefix", max_positions=4096)


def waves():
    """Two waves: the second resends the first's prompts grown by new turns, identical
    prompts, strict prefixes (one inside a page), and unrelated prompts."""
    from nanograph import SamplingParams

    g = torch.Generator().manual_seed(0)

    def ids(n: int) -> list[int]:
        return torch.randint(0, 4096, (n,), generator=g).tolist()

    system = ids(700)  # longer than a 512-token chunk
    first = [system + ids(k) for k in (40, 130, 9)] + [ids(300), ids(33)]
    second = [p + ids(k) for p, k in zip(first, (25, 70, 600, 12, 3))]
    second += [first[0], first[1][:350], first[3][:290], system[:40] + ids(5), ids(64)]
    params = [SamplingParams(max_tokens=m, temperature=0, ignore_eos=True)
              for m in (16, 7, 24, 12, 5, 9, 20, 3, 14, 11)]  # fmt: skip
    return [first, second], [params[: len(first)], params[: len(second)]]


@pytest.fixture(scope="module")
def uncached(model_dir):
    from nanograph import LLM

    llm = LLM(model_dir, disable_prefix_caching=True, prefill_cuda_graph="none", **CONFIG)
    return [[o.token_ids for o in llm.generate(p, s)] for p, s in zip(*waves())]


@pytest.mark.parametrize("prefill", ["full", "breakable", "tc_piecewise"])
def test_cached_prefixes_under_each_prefill_backend(model_dir, uncached, prefill):
    from nanograph import LLM

    llm = LLM(model_dir, prefill_cuda_graph=prefill, **CONFIG)
    runner = llm.engine.runner.graph_runners["prefill"]
    prompts, params = waves()
    first = llm.generate(prompts[0], params[0])
    replays = runner.replays
    second = llm.generate(prompts[1], params[1])
    stats = llm.engine.prefix_cache.stats()
    print(f"\nprefill={prefill}: {runner}, cache {stats.as_dict()}")
    assert [o.token_ids for o in first] == uncached[0]
    assert [o.token_ids for o in second] == uncached[1]
    assert sum(o.num_cached_tokens for o in second) >= 3 * 688  # the system prompt, 43 pages
    assert runner.replays > replays  # the graphs served batches with cached prefixes
    engine = llm.engine
    assert engine.scheduler.num_available_pages == engine.kv_cache.allocator.num_usable
