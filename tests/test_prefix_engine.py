"""Prefix caching in the engine: the same tokens as with caching off (greedy and seeded, with
chunked prefill, preemption, eviction and aborts in tight pools), fewer prefilled tokens by
exactly the cached amount, odd inputs, and no page leaked."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_pages_back, make_llm

from nanograph import LLM, SamplingParams

PER_PAGE = 4 * 2 * 2 * 2 * 16 * 4  # page_size x k/v x layers x kv heads x head_dim x fp32


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return tiny_model_dir("qwen3")


def count_prefilled(llm: LLM) -> list[int]:
    """Counts the tokens every forward computes (a one-element list, updated in place)."""
    runner, total = llm.engine.runner, [0]
    forward = runner.forward

    def counted(batch, *args, **kwargs):
        total[0] += batch.num_tokens
        return forward(batch, *args, **kwargs)

    runner.forward = counted
    return total


def shared_workload(g: torch.Generator, n: int) -> list[list[int]]:
    """Prompts built from a few shared heads: identical prompts, strict prefixes of others,
    shared heads with different tails, and unrelated prompts."""
    heads = [torch.randint(0, 256, (int(k),), generator=g).tolist() for k in (5, 13, 30)]
    batch = []
    for _ in range(n):
        kind = int(torch.randint(0, 4, (1,), generator=g))
        head = heads[int(torch.randint(0, len(heads), (1,), generator=g))]
        tail = torch.randint(0, 256, (int(torch.randint(1, 20, (1,), generator=g)),), generator=g)
        if kind == 0:
            batch.append(list(head))  # identical to other requests
        elif kind == 1 and batch:
            other = batch[int(torch.randint(0, len(batch), (1,), generator=g))]
            batch.append(other[: max(1, len(other) - int(torch.randint(0, 9, (1,), generator=g)))])
        elif kind == 2:
            batch.append(head + tail.tolist())
        else:
            batch.append(tail.tolist())
    return batch


def mixed_params(g: torch.Generator, n: int) -> list[SamplingParams]:
    params = []
    for i in range(n):
        m = int(torch.randint(1, 14, (1,), generator=g))
        if i % 2:
            params.append(SamplingParams(max_tokens=m, temperature=0.9, top_k=30, seed=i,
                                         ignore_eos=True))  # fmt: skip
        else:
            params.append(SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True))
    return params


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_shared_workloads_match_caching_off(tiny, seed):
    """Two waves of requests (the second reuses what the first cached) in a tight pool with
    random chunk sizes and seat limits: the tokens equal caching off's, the cache hits, pages
    are evicted under pressure, and no page leaks."""
    g = torch.Generator().manual_seed(300 + seed)
    waves = [shared_workload(g, int(torch.randint(4, 9, (1,), generator=g))) for _ in range(2)]
    params = [mixed_params(g, len(w)) for w in waves]
    config = dict(
        kv_cache_bytes=int(torch.randint(20, 32, (1,), generator=g)) * PER_PAGE,
        chunked_prefill_size=int(torch.randint(3, 40, (1,), generator=g)),
        max_num_seqs=int(torch.randint(2, 6, (1,), generator=g)),
    )
    results = {}
    for disable in (True, False):
        llm = make_llm(tiny, disable_prefix_caching=disable, **config)
        outs = [llm.generate(w, p) for w, p in zip(waves, params)]
        results[disable] = [[o.token_ids for o in wave] for wave in outs]
        assert all(o.ok for wave in outs for o in wave), [o.error for w in outs for o in w]
        assert_pages_back(llm)
        if disable:
            assert llm.engine.prefix_cache is None
            assert all(o.num_cached_tokens == 0 for wave in outs for o in wave)
        else:
            stats = llm.engine.prefix_cache.stats()
            assert stats.hit_tokens > 0
            cached = llm
    assert results[False] == results[True]
    assert cached.engine.prefix_cache.stats().evicted_pages > 0  # the pool was tight


def test_preemption_with_shared_prefixes(tiny):
    """Requests sharing a head in a pool far too small for all of them: preempted requests
    put their computed pages back in the tree and recompute the same tokens."""
    g = torch.Generator().manual_seed(11)
    head = torch.randint(0, 256, (18,), generator=g).tolist()
    batch = [head + torch.randint(0, 256, (int(k),), generator=g).tolist()
             for k in torch.randint(1, 12, (8,), generator=g)]  # fmt: skip
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    outs = {}
    for disable in (True, False):
        llm = make_llm(tiny, kv_cache_bytes=17 * PER_PAGE, disable_prefix_caching=disable)
        outs[disable] = llm.generate(batch, params)
        assert sum(o.num_preemptions for o in outs[disable]) > 0
        assert_pages_back(llm)
    assert [o.token_ids for o in outs[False]] == [o.token_ids for o in outs[True]]
    # requests admitted in the same step as the first compute the head themselves; those
    # admitted later (after a preemption freed pages) take it from the tree
    assert sum(o.num_cached_tokens for o in outs[False]) > 0


def test_prefilled_tokens_drop_by_the_cached_amount(tiny):
    g = torch.Generator().manual_seed(7)
    system = torch.randint(0, 256, (37,), generator=g).tolist()
    turns = [system + torch.randint(0, 256, (k,), generator=g).tolist() for k in (5, 9, 3)]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outputs, counts = {}, {}
    for disable in (True, False):
        llm = make_llm(tiny, disable_prefix_caching=disable, chunked_prefill_size=16)
        counted = count_prefilled(llm)
        first = llm.generate(turns[0], params)[0]
        rest = llm.generate(turns[1:], params)
        outputs[disable], counts[disable] = [first, *rest], counted[0]
    on = outputs[False]
    assert [o.token_ids for o in on] == [o.token_ids for o in outputs[True]]
    # the later two share the 37-token system prompt with the first: 9 whole pages (36 tokens)
    # of each come from the cache and are not computed
    assert [o.num_cached_tokens for o in on] == [0, 36, 36]
    assert counts[True] - counts[False] == sum(o.num_cached_tokens for o in on)


def test_requests_sharing_a_head_submitted_together_compute_it_once(tiny):
    """The first request prefills the shared head; the others wait one step (their next page
    is being computed) and take it from the tree."""
    g = torch.Generator().manual_seed(12)
    head = torch.randint(0, 256, (32,), generator=g).tolist()
    batch = [head + torch.randint(0, 256, (5,), generator=g).tolist() for _ in range(4)]
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    outs, counts = {}, {}
    for disable in (True, False):
        llm = make_llm(tiny, disable_prefix_caching=disable)
        counted = count_prefilled(llm)
        outs[disable], counts[disable] = llm.generate(batch, params), counted[0]
        assert_pages_back(llm)
    assert [o.token_ids for o in outs[False]] == [o.token_ids for o in outs[True]]
    assert [o.num_cached_tokens for o in outs[False]] == [0, 32, 32, 32]
    assert counts[True] - counts[False] == 96


def test_identical_and_strict_prefix_prompts(tiny):
    g = torch.Generator().manual_seed(8)
    prompt = torch.randint(0, 256, (24,), generator=g).tolist()  # exactly 6 pages
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    ref = make_llm(tiny, disable_prefix_caching=True)
    llm = make_llm(tiny)
    for p in (prompt, prompt, prompt[:10], prompt[:4], prompt[:1], prompt + [3, 4]):
        out = llm.generate(p, params)[0]
        assert out.token_ids == ref.generate(p, params)[0].token_ids
        assert out.num_cached_tokens <= (len(p) - 1) // 4 * 4  # the last token is always computed
    assert llm.engine.prefix_cache.stats().hit_tokens == 20 + 8 + 0 + 0 + 24
    assert_pages_back(llm)


def test_a_pool_full_of_cached_pages_serves_a_request_that_needs_all_of_it(tiny):
    llm = make_llm(tiny, kv_cache_bytes=13 * PER_PAGE)  # 12 usable pages: 48 tokens
    g = torch.Generator().manual_seed(9)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    for _ in range(3):  # fill the pool with cached pages
        llm.generate(torch.randint(0, 256, (40,), generator=g).tolist(), params)
    assert llm.engine.kv_cache.allocator.num_free < 10
    big = torch.randint(0, 256, (44,), generator=g).tolist()
    out = llm.generate(big, params)[0]
    ref = make_llm(tiny, kv_cache_bytes=13 * PER_PAGE, disable_prefix_caching=True)
    assert out.ok and out.token_ids == ref.generate(big, params)[0].token_ids
    too_long = llm.generate(big + [1] * 8, params)[0]  # longer than the pool: a clear error
    assert too_long.finish_reason == "error" and "KV" in too_long.error
    assert_pages_back(llm)


def test_aborting_a_request_that_shares_its_prefix(tiny):
    """A request aborted mid-way while another reads the same cached pages: the other one
    finishes with its reference tokens and nothing leaks or is freed twice."""
    g = torch.Generator().manual_seed(10)
    head = torch.randint(0, 256, (20,), generator=g).tolist()
    a_prompt, b_prompt = head + [1, 2, 3], head + [7, 8]
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    ref = make_llm(tiny, disable_prefix_caching=True).generate(b_prompt, params)[0].token_ids
    llm = make_llm(tiny, chunked_prefill_size=8)
    engine = llm.engine
    llm.generate(head + [5], SamplingParams(max_tokens=1))  # cache the head
    a = engine.add_request(a_prompt, params)
    b = engine.add_request(b_prompt, params)
    for _ in range(3):
        engine.step()
    assert a.num_shared_pages and a.pages[:5] == b.pages[:5]  # both read the cached head
    engine.abort(a)
    engine.abort(a)  # twice: nothing happens
    engine.run([b])
    assert b.output_ids == ref and a.finish_reason == "abort"
    assert_pages_back(llm)


def test_disable_prefix_caching_frees_every_page(tiny):
    llm = make_llm(tiny, disable_prefix_caching=True)
    llm.generate([[1, 2, 3, 4, 5, 6, 7, 8, 9]] * 2, SamplingParams(max_tokens=3))
    allocator = llm.engine.kv_cache.allocator
    assert allocator.num_free == allocator.num_usable
    assert llm.engine.memory_report().prefix_cache == {}


def test_memory_report_shows_the_cache(tiny):
    llm = make_llm(tiny)
    llm.generate([[1, 2, 3, 4, 5, 6, 7, 8, 9]] * 2, SamplingParams(max_tokens=3))
    report = llm.engine.memory_report()
    stats = llm.engine.prefix_cache.stats()
    assert report.prefix_cache["cached_pages"] == stats.cached_pages == 2
    assert report.prefix_cache["hit_rate"] == stats.hit_rate
    assert "prefix cache" in report.table() and "hit rate" in report.table()
