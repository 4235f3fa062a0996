"""Graph memory: one shared pool per runner, and non-owning tensor aliases.

Invariants:
- Every capture (and its warm-up) runs on one side stream per device, `capture_stream()`. The
  allocator only reuses a freed block for an allocation on the same stream, so captures sharing a
  pool must share the stream, or later shapes would not reuse earlier memory; one stream for all
  pools also means one set of cuBLAS workspaces (they are cached per stream) instead of one each.
- Creating a pool touches no CUDA; the pool and stream appear at the first capture into it, so
  `new_pool()` works on a machine without CUDA.
- A pool keeps one empty graph captured into it for as long as it lives (see `_open`), and moves
  to a fresh allocator pool after a failed capture (see `retire`), so a failure never poisons it.
- The pool's memory lives while the `GraphPool` object or any graph captured into it lives; when
  all are gone, `torch.cuda.empty_cache()` hands it back to the driver. Graphs keep their pool
  alive and release it after their CUDA graphs (some torch versions assert, when a MemPool dies,
  that no graph still uses it).
- `weak_alias(t)` is a tensor at `t`'s address that does not own the memory. It is only safe
  where something else guarantees the memory stays valid: here, a graph pool, whose blocks stay
  reserved while a graph uses them and whose reuse follows capture order (see breakable.py).
"""

from __future__ import annotations

import bisect
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class GraphPool:
    """A CUDA memory pool shared by every segment, piece and shape captured into it."""

    def __init__(self) -> None:
        # Allocator pools this GraphPool has used: normally one; a failed capture retires the
        # current one (see `retire`). Each has an empty keep-alive graph captured into it.
        self._mempools: list[torch.cuda.MemPool] = []
        self._keepalive: list[torch.cuda.CUDAGraph] = []
        self._need_fresh = True

    def __del__(self) -> None:
        self._keepalive.clear()  # graphs before the MemPools they use

    @property
    def mempool(self) -> torch.cuda.MemPool:
        if self._need_fresh:
            self._open()
        return self._mempools[-1]

    @property
    def id(self) -> tuple[int, int]:
        """The allocator's pool id, as `CUDAGraph.capture_begin(pool=...)` takes it."""
        return self.mempool.id

    def _open(self) -> None:
        """A fresh MemPool plus an empty graph captured into it and kept while the pool lives.

        torch (2.11) also routes pinned host allocations of a capture into a pool of the same id,
        and that pool has no MemPool holding it: once every graph of the id is gone, the next
        capture into it fails an internal assertion. The keep-alive graph holds it open; its
        capture also leaves torch's CUDA RNG capture state clean (see capture.py).
        """
        mempool = torch.cuda.MemPool()
        keepalive = torch.cuda.CUDAGraph()
        with torch.cuda.stream(capture_stream()), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "The CUDA Graph is empty"
            keepalive.capture_begin(pool=mempool.id, capture_error_mode="thread_local")
            keepalive.capture_end()
        self._mempools.append(mempool)
        self._keepalive.append(keepalive)
        self._need_fresh = False

    def retire(self) -> None:
        """After a failed capture: later captures go to a fresh allocator pool, because torch
        can leave the failed capture's allocation routing behind for the old id. Graphs already
        captured keep using (and keeping alive) the old one."""
        self._open()

    @property
    def stream(self) -> torch.cuda.Stream:
        """The side stream every capture into this pool (and its warm-up) runs on."""
        return capture_stream()

    @contextmanager
    def allocating(self) -> Iterator[None]:
        """Route this thread's CUDA allocations into the pool (outside any capture)."""
        with torch.cuda.use_mem_pool(self.mempool):
            yield

    def segments(self) -> list[dict]:
        """The allocator's segments that belong to this pool (empty before the first capture)."""
        ids = {tuple(m.id) for m in self._mempools}
        if not ids:
            return []
        try:
            snapshots = [torch.cuda.memory_snapshot(pool_id) for pool_id in ids]
        except TypeError:  # older signature without a pool filter
            snapshots = [torch.cuda.memory_snapshot()]
        return [s for snap in snapshots for s in snap if tuple(s.get("segment_pool_id", ())) in ids]

    def reserved_bytes(self) -> int:
        """Device memory the pool holds (what graph memory costs the process)."""
        return sum(s["total_size"] for s in self.segments())

    def address_ranges(self, exclude: frozenset[int] = frozenset()) -> AddressRanges:
        """The pool's address ranges now, minus blocks starting at `exclude`, for `owns` checks."""
        ranges = [(s["address"], s["address"] + s["total_size"]) for s in self.segments()]
        return AddressRanges(ranges, exclude)

    def live_blocks(self) -> frozenset[int]:
        """Start addresses of the pool's blocks in use now (e.g. earlier captures' outputs)."""
        return frozenset(
            b["address"]
            for s in self.segments()
            for b in s.get("blocks", ())
            if b.get("state") == "active_allocated"
        )

    def __repr__(self) -> str:
        if not self._mempools:
            return "GraphPool(unused)"
        ids = [m.id for m in self._mempools]
        return f"GraphPool(ids={ids}, reserved={self.reserved_bytes() / 2**20:.1f} MiB)"


class AddressRanges:
    """Sorted, disjoint [start, end) address ranges with a membership test for tensors."""

    def __init__(
        self,
        ranges: list[tuple[int, int]],
        exclude: frozenset[int] = frozenset(),
    ) -> None:
        pairs = sorted(ranges)
        self._starts = [a for a, _ in pairs]
        self._ends = [b for _, b in pairs]
        self._exclude = exclude

    def owns(self, t: torch.Tensor) -> bool:
        """True if `t`'s storage lies in the ranges and does not start at an excluded address."""
        if not t.is_cuda or t.untyped_storage().nbytes() == 0:
            return False
        ptr = t.untyped_storage().data_ptr()
        i = bisect.bisect_right(self._starts, ptr) - 1
        return i >= 0 and ptr < self._ends[i] and ptr not in self._exclude


_CAPTURE_STREAMS: dict[int, torch.cuda.Stream] = {}


def capture_stream() -> torch.cuda.Stream:
    """The side stream all captures on the current device run on (CUDA forbids the default)."""
    device = torch.cuda.current_device()
    if device not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[device] = torch.cuda.Stream(device)
    return _CAPTURE_STREAMS[device]


def replace_capture_stream() -> None:
    """Use a new capture stream from now on (after a failure left the old one capturing)."""
    _CAPTURE_STREAMS.pop(torch.cuda.current_device(), None)


def new_pool() -> GraphPool:
    """A fresh pool for one runner: pass it to every `capture` of that runner, largest first."""
    return GraphPool()


def weak_alias(t: torch.Tensor) -> torch.Tensor:
    """A tensor viewing `t`'s memory without keeping that memory alive.

    Pure torch has no public non-owning tensor; `_construct_storage_from_data_pointer` (used by
    torch.compile's own CUDA-graph trees for the same purpose) builds a storage whose data
    pointer has no deleter. Where it is missing we return `t` itself: correct, but the block then
    stays allocated and cannot be reused by later segments (more pool memory, never wrong).
    """
    make_storage = getattr(torch._C, "_construct_storage_from_data_pointer", None)
    if make_storage is None:
        return t
    storage = t.untyped_storage()
    alias_storage = make_storage(storage.data_ptr(), t.device, storage.nbytes())
    alias = torch.empty(0, dtype=t.dtype, device=t.device)
    return alias.set_(alias_storage, t.storage_offset(), t.size(), t.stride())
