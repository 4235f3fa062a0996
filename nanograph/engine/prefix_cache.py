"""Prefix caching: a radix tree from token ids to the KV pages that hold them.

Edges are runs of whole pages (a node holds ``k * page_size`` token ids and their ``k`` pages);
a node splits only at a page boundary. A request reuses the longest cached run of whole pages
in front of its tokens and computes only the rest.

Invariants:
- Every page is in exactly one place: the allocator's free list, one tree node, or one
  request's private tail (``request.pages[request.num_shared_pages:]``). A request's shared
  head ``request.pages[:num_shared_pages]`` is exactly the pages on the path from the root to
  its locked node ``request.prefix_node``.
- A tree page is never written: it holds positions below ``num_computed`` of every request that
  reads it, and forwards write only at ``num_computed`` and after. A match stops one token short
  of the request's tokens (rounded down to a page), so the last token is always computed and
  its logits exist.
- ``ref`` of a node counts the requests whose locked node is it or below it. Only leaves with
  ``ref == 0`` are evicted, least recently used first, from their tail, and only when the pool
  is short (``allocate``); a node whose last page goes leaves the tree, and its parent may then
  become an evictable leaf.
- Only resolved token ids enter the tree: the overlap schedule's tokens still on the device
  (``UNRESOLVED``, always at the end of ``output_ids``) and tokens past ``num_tokens`` (computed
  in vain after a stop) are never cached.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

from nanograph.engine.kv_cache import PageAllocator
from nanograph.engine.request import UNRESOLVED, Request


class _Node:
    __slots__ = ("key", "pages", "children", "parent", "ref", "last_used")

    def __init__(self, key: list[int], pages: list[int], parent: _Node | None) -> None:
        self.key = key  # token ids, len(pages) * page_size of them
        self.pages = pages
        self.children: dict[tuple[int, ...], _Node] = {}  # by the child's first page of ids
        self.parent = parent
        self.ref = 0
        self.last_used = 0


@dataclass(frozen=True)
class PrefixCacheStats:
    queried_tokens: int  # tokens a match could have covered, summed over admissions
    hit_tokens: int  # tokens a match did cover
    cached_pages: int  # pages held by the tree
    evictable_pages: int  # of those, pages no request reads
    evicted_pages: int  # pages given back to the pool so far

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    def as_dict(self) -> dict:
        return {
            "queried_tokens": self.queried_tokens, "hit_tokens": self.hit_tokens,
            "hit_rate": self.hit_rate, "cached_pages": self.cached_pages,
            "evictable_pages": self.evictable_pages, "evicted_pages": self.evicted_pages,
        }  # fmt: skip


class PrefixCache:
    def __init__(self, allocator: PageAllocator, page_size: int) -> None:
        self.allocator = allocator
        self.page_size = page_size
        self.root = _Node([], [], None)
        # eviction candidates, lazily: an entry is stale once its node is touched, locked, given
        # a child or evicted (its state no longer matches); every change that makes a node an
        # unlocked leaf, or touches one, pushes a fresh entry
        self._heap: list[tuple[int, int, _Node]] = []
        self._pushes = itertools.count()  # tie-break: nodes never compare
        self._clock = itertools.count(1)
        self._num_pages = 0
        self._num_evictable = 0
        self._queried = self._hits = self._evicted = 0

    # ---- requests -------------------------------------------------------------------------
    def acquire(self, request: Request) -> int:
        """Gives a request that holds no pages the longest cached prefix of its tokens (whole
        pages, at most all tokens but the last) and locks it; sets ``num_computed`` to the
        tokens it covers and returns how many tokens a match could have covered."""
        assert not request.pages and request.prefix_node is None
        ps = self.page_size
        limit = min(request.num_tokens - 1, _num_resolved(request)) // ps * ps
        node, pages = self._match(request.token_ids[:limit])
        self._lock(node)
        request.prefix_node, request.pages = node, pages
        request.num_shared_pages = len(pages)
        request.num_computed = len(pages) * ps
        return limit

    def count(self, queried: int, hit: int) -> None:
        """Records an admitted request's match (``stats``): a match undone because the request
        could not be admitted yet does not count."""
        self._queried += queried
        self._hits += hit

    def commit(self, request: Request) -> None:
        """Puts the request's computed, resolved whole pages into the tree. Where the tree
        already holds the same tokens (another request computed them too), the request
        switches to the tree's pages and its own copies go back to the pool."""
        ps = self.page_size
        full = min(request.num_computed, _num_resolved(request)) // ps
        start = request.num_shared_pages
        if full <= start:
            return
        node = request.prefix_node or self.root
        tokens = request.token_slice(start * ps, full * ps)
        node, pages = self._insert(node, tokens, request.pages[start:full])
        duplicates = [p for p, q in zip(request.pages[start:full], pages) if p != q]
        request.pages[start:full] = pages
        self._lock(node)
        self._unlock(request.prefix_node)
        self.allocator.free(duplicates)
        request.prefix_node, request.num_shared_pages = node, full

    def release(self, request: Request, keep: bool) -> None:
        """Drops the request's hold on its pages: with ``keep`` its computed pages stay cached
        first; the private tail goes back to the pool. ``request.pages`` ends empty."""
        if keep:
            self.commit(request)
        self._unlock(request.prefix_node, touch=True)
        self.allocator.free(request.pages[request.num_shared_pages :])
        request.pages, request.prefix_node, request.num_shared_pages = [], None, 0

    # ---- the pool -------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int] | None:
        """``n`` pages from the pool, evicting unused cached pages first if it is short;
        None (nothing evicted) if even that is not enough."""
        short = n - self.allocator.num_free
        if short > 0:
            if short > self._num_evictable:
                return None
            self.evict(short)
        return self.allocator.allocate(n)

    def evict(self, n: int) -> int:
        """Frees up to ``n`` pages no request reads, least recently used leaves first, each
        from its tail; returns how many were freed."""
        freed = 0
        while freed < n and self._heap:
            used, _, node = heapq.heappop(self._heap)
            if used != node.last_used or not self._evictable(node):
                continue  # a stale entry
            k = min(len(node.pages), n - freed)
            freed += k
            self._num_pages -= k
            self._num_evictable -= k
            if k < len(node.pages):  # only the tail goes; the node stays a leaf
                cut = len(node.pages) - k
                self.allocator.free(node.pages[cut:])
                del node.pages[cut:], node.key[cut * self.page_size :]
                self._push(node)
                break
            self.allocator.free(node.pages)
            parent = node.parent
            del parent.children[tuple(node.key[: self.page_size])]
            node.pages, node.key = [], []
            self._push(parent)
        self._evicted += freed
        if len(self._heap) > 2 * self._num_pages + 64:  # mostly stale: rebuild
            self._heap = []
            stack = [self.root]
            while stack:
                node = stack.pop()
                stack += node.children.values()
                self._push(node)
        return freed

    def stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(
            self._queried, self._hits, self._num_pages, self._num_evictable, self._evicted
        )

    @property
    def num_evictable(self) -> int:
        return self._num_evictable

    # ---- the tree -------------------------------------------------------------------------
    def _match(self, tokens: list[int]) -> tuple[_Node, list[int]]:
        """The deepest node whose path is a prefix of ``tokens`` (splitting a node where the
        match ends inside it) and the pages along that path."""
        ps, node, pages, pos = self.page_size, self.root, [], 0
        while pos < len(tokens):
            child = node.children.get(tuple(tokens[pos : pos + ps]))
            if child is None:
                break
            k = self._common_pages(child, tokens, pos)
            if k < len(child.pages):
                child = self._split(child, k)
            node, pos = child, pos + k * ps
            pages += child.pages
        return node, pages

    def _insert(self, node: _Node, tokens: list[int], pages: list[int]) -> tuple[_Node, list[int]]:
        """Adds ``tokens`` (whole pages, with their ``pages``) below ``node``; returns the
        deepest node of the result and the tree's pages for ``tokens``."""
        ps, out, pos = self.page_size, [], 0
        clock = next(self._clock)
        while pos < len(tokens):
            node.last_used = clock
            child = node.children.get(tuple(tokens[pos : pos + ps]))
            if child is None:
                child = _Node(tokens[pos:], pages[pos // ps :], node)
                child.last_used = clock
                node.children[tuple(tokens[pos : pos + ps])] = child
                self._num_pages += len(child.pages)
                self._num_evictable += len(child.pages)
                self._push(child)
                return child, out + child.pages
            k = self._common_pages(child, tokens, pos)
            if k < len(child.pages):
                child = self._split(child, k)
            out += child.pages
            node, pos = child, pos + k * ps
        node.last_used = clock
        self._push(node)
        return node, out

    def _common_pages(self, node: _Node, tokens: list[int], pos: int) -> int:
        """How many of ``node``'s pages ``tokens[pos:]`` matches (at least one: the caller
        found the node by its first page)."""
        ps, n = self.page_size, len(node.pages)
        if tokens[pos : pos + n * ps] == node.key:
            return n
        k = 1
        while (
            k < n and tokens[pos + k * ps : pos + (k + 1) * ps] == node.key[k * ps : (k + 1) * ps]
        ):
            k += 1
        return k

    def _split(self, node: _Node, k: int) -> _Node:
        """Splits ``node`` after its first ``k`` pages; returns the new upper node. The lower
        part keeps the node's identity, so requests locking it keep their place."""
        ps = self.page_size
        upper = _Node(node.key[: k * ps], node.pages[:k], node.parent)
        upper.ref, upper.last_used = node.ref, node.last_used
        node.parent.children[tuple(node.key[:ps])] = upper
        node.key, node.pages, node.parent = node.key[k * ps :], node.pages[k:], upper
        upper.children[tuple(node.key[:ps])] = node
        return upper

    def _evictable(self, node: _Node) -> bool:
        return node.ref == 0 and not node.children and bool(node.pages)

    def _push(self, node: _Node) -> None:
        if node is not self.root and self._evictable(node):
            heapq.heappush(self._heap, (node.last_used, next(self._pushes), node))

    def _lock(self, node: _Node | None) -> None:
        clock = next(self._clock)
        while node is not None and node is not self.root:
            if node.ref == 0:
                self._num_evictable -= len(node.pages)
            node.ref += 1
            node.last_used = clock
            node = node.parent

    def _unlock(self, node: _Node | None, touch: bool = False) -> None:
        clock = next(self._clock)
        while node is not None and node is not self.root:
            node.ref -= 1
            if node.ref == 0:
                self._num_evictable += len(node.pages)
            if touch:
                node.last_used = clock
            self._push(node)
            node = node.parent


def _num_resolved(request: Request) -> int:
    """Tokens of the request whose ids the host knows (in-flight ones sit at the end)."""
    out = request.output_ids
    unresolved = 0
    while unresolved < len(out) and out[-1 - unresolved] == UNRESOLVED:
        unresolved += 1
    return request.num_tokens - unresolved
