"""The prefix cache's radix tree on its own: match, insert, split, refcounts, LRU eviction, and
the page-accounting invariant (every page free, cached or held by exactly one request)."""

from __future__ import annotations

import random

import pytest

from nanograph.engine.kv_cache import PageAllocator
from nanograph.engine.prefix_cache import PrefixCache
from nanograph.engine.request import UNRESOLVED, Request
from nanograph.engine.sampling_params import SamplingParams

PS = 4  # page size


def make(num_pages: int = 64) -> PrefixCache:
    return PrefixCache(PageAllocator(num_pages), PS)


def compute(cache: PrefixCache, tokens: list[int], output: list[int] = ()) -> Request:
    """A request admitted to ``cache`` whose tokens all got computed (pages allocated)."""
    r = Request(0, list(tokens), SamplingParams(), output_ids=list(output))
    cache.acquire(r)
    r.pages += cache.allocate(-(-r.num_tokens // PS) - len(r.pages))
    r.num_computed = r.num_tokens
    return r


def check_accounting(cache: PrefixCache, requests: list[Request]) -> None:
    """Every usable page is in exactly one place; evictable counts match the tree."""
    tree, evictable, stack = [], 0, [cache.root]
    while stack:
        node = stack.pop()
        stack += node.children.values()
        if node is not cache.root:
            assert len(node.key) == len(node.pages) * PS and node.pages
            tree += node.pages
            evictable += len(node.pages) if node.ref == 0 else 0
            assert node.ref >= sum(c.ref for c in node.children.values())
            if node.ref == 0 and not node.children:  # an eviction candidate has a live entry
                assert any(n is node and t == node.last_used for t, _, n in cache._heap)
    private = [p for r in requests for p in r.pages[r.num_shared_pages :]]
    free = cache.allocator._free
    everything = tree + private + free
    assert sorted(everything) == list(range(1, cache.allocator.num_pages))
    assert evictable == cache.num_evictable
    assert cache.stats().cached_pages == len(tree)


def test_match_takes_whole_pages_and_leaves_the_last_token():
    cache = make()
    a = compute(cache, list(range(10)))  # 2 whole pages + 2 tokens
    pages = list(a.pages)
    cache.release(a, keep=True)
    assert a.pages == []
    assert cache.stats().cached_pages == 2
    b = Request(1, list(range(10)) + [99], SamplingParams())
    assert cache.acquire(b) == 8  # limit: 10 tokens rounded down to pages
    assert b.num_computed == 8 and b.pages == pages[:2]
    # identical prompt of exactly two pages: the last token is computed, so only one page
    c = Request(2, list(range(8)), SamplingParams())
    cache.acquire(c)
    assert c.num_computed == 4 and c.num_shared_pages == 1
    check_accounting(cache, [b, c])


def test_strict_prefix_splits_a_node_mid_edge():
    cache = make()
    a = compute(cache, list(range(17)))  # one node of 4 pages
    pages = list(a.pages[:4])
    cache.release(a, keep=True)
    assert len(cache.root.children) == 1
    (node,) = cache.root.children.values()
    assert node.pages == pages
    b = Request(1, list(range(9)), SamplingParams())  # a strict prefix: 2 pages match
    cache.acquire(b)
    assert b.pages == pages[:2]
    (upper,) = cache.root.children.values()
    assert upper.pages == pages[:2] and upper.ref == 1
    (lower,) = upper.children.values()
    assert lower.pages == pages[2:] and lower.ref == 0 and lower is node  # identity kept
    # diverging after one page: the upper node splits again, the new branch is a sibling
    c = compute(cache, list(range(4)) + [50, 51, 52, 53, 54])
    assert c.num_shared_pages == 1 and c.pages[0] == pages[0]
    cache.commit(c)
    assert c.num_shared_pages == 2 and c.pages[1] != pages[1]
    check_accounting(cache, [b, c])


def test_concurrent_duplicates_switch_to_the_tree_pages():
    cache = make()
    a = compute(cache, list(range(14)))
    b = compute(cache, list(range(14)))  # computed at the same time: nothing cached yet
    assert set(a.pages).isdisjoint(b.pages)
    own = list(b.pages)
    cache.commit(a)
    cache.commit(b)
    assert b.pages == a.pages[:3] + own[3:] and b.num_shared_pages == 3
    assert set(own[:3]) <= set(cache.allocator._free)
    check_accounting(cache, [a, b])
    cache.release(a, keep=True)
    cache.release(b, keep=True)
    check_accounting(cache, [])
    assert cache.allocator.num_free + cache.num_evictable == cache.allocator.num_usable


def test_unresolved_and_vain_tokens_are_not_cached():
    cache = make()
    r = compute(cache, list(range(6)), output=[7, UNRESOLVED])  # 8 tokens, last on the device
    cache.commit(r)
    assert r.num_shared_pages == 1  # the second page holds an unresolved id
    r.output_ids[-1] = 9
    cache.commit(r)
    assert r.num_shared_pages == 2
    s = compute(cache, list(range(20, 26)), output=[1, 2])
    s.output_ids.pop()  # a stop token removed after its KV was computed (num_computed = 8)
    cache.release(s, keep=True)
    assert cache.stats().cached_pages == 3  # r's two pages and s's first page only
    check_accounting(cache, [r])


def test_eviction_is_lru_leaf_first_and_spares_referenced_pages():
    cache = make(num_pages=9)  # 8 usable pages
    shared = list(range(8))
    a = compute(cache, shared + [1, 1, 1, 1, 0])  # 3 pages + 1
    cache.release(a, keep=True)  # tree: shared(2) -> a-tail(1)
    b = compute(cache, shared + [2, 2, 2, 2, 0])
    cache.release(b, keep=True)  # shared(2) -> {a-tail, b-tail}; b used last
    assert cache.allocator.num_free == 4 and cache.num_evictable == 4
    tails = {n.key[0]: n for n in next(iter(cache.root.children.values())).children.values()}
    a_tail, b_tail = list(tails[1].pages), list(tails[2].pages)
    got = cache.allocate(5)  # one page short: the least recently used leaf goes (a's tail)
    assert a_tail[0] in got and b_tail[0] not in got
    cache.allocator.free(got)
    c = Request(3, shared + [2, 2, 2, 2, 5], SamplingParams())  # reads shared + b's tail
    cache.acquire(c)
    assert c.num_shared_pages == 3
    assert cache.allocate(6) is None  # only 5 free: referenced pages are never evicted
    assert cache.allocator.num_free == 5 and cache.num_evictable == 0
    check_accounting(cache, [c])
    cache.release(c, keep=False)
    assert cache.evict(10) == 3  # leaf first: b's tail, then the shared parent
    assert cache.stats().cached_pages == 0 and not cache.root.children
    assert cache.allocator.num_free == cache.allocator.num_usable


def test_refcounts_follow_locks_and_releases():
    cache = make()
    a = compute(cache, list(range(13)))
    cache.commit(a)
    b = Request(1, list(range(13)), SamplingParams())
    cache.acquire(b)
    (node,) = cache.root.children.values()
    assert node.ref == 2 and cache.num_evictable == 0
    cache.release(a, keep=True)
    assert node.ref == 1
    cache.release(b, keep=False)
    assert node.ref == 0 and cache.num_evictable == 3
    check_accounting(cache, [])


@pytest.mark.parametrize("seed", range(4))
def test_random_operations_keep_every_page_in_one_place(seed):
    rng = random.Random(seed)
    cache = make(num_pages=40)
    prefixes = [[rng.randrange(4) for _ in range(rng.randrange(0, 12))] for _ in range(4)]
    live: list[Request] = []
    for _ in range(300):
        op = rng.random()
        if op < 0.45 or not live:
            tokens = rng.choice(prefixes) + [rng.randrange(4) for _ in range(rng.randrange(1, 9))]
            r = Request(0, tokens, SamplingParams())
            cache.acquire(r)
            assert r.token_ids[: r.num_computed] == tokens[: r.num_computed]
            need = -(-r.num_tokens // PS) - len(r.pages)
            got = cache.allocate(need)
            if got is None:
                cache.release(r, keep=False)
            else:
                r.pages += got
                r.num_computed = rng.randrange(r.num_computed, r.num_tokens + 1)
                live.append(r)
        elif op < 0.6:
            cache.commit(rng.choice(live))
        else:
            r = live.pop(rng.randrange(len(live)))
            cache.release(r, keep=rng.random() < 0.8)
        check_accounting(cache, live)
    for r in live:
        cache.release(r, keep=True)
    assert cache.allocator.num_free + cache.num_evictable == cache.allocator.num_usable
