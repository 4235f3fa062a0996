"""Breakable CUDA graphs (BCG): graph segments separated by eager breaks placed during capture.

How a capture goes: fn runs once with a segment open. When it calls an `eager_on_graph` function,
the open segment closes (and replays once, so values are real), the function runs eagerly (or its
capture stub), its output is copied into boundary buffers allocated in the pool, a new segment
opens, and fn continues with the boundary buffers. Replay runs the same program: segment, break,
segment, ... where each break calls the function again on the same inputs and copies its fresh
output into the boundary buffers that the following segments were captured against.

Invariants:
- Replay order is capture order, and every pool block is live (in the allocator's view) during
  capture exactly where replay needs it. Hence tensors that cross a break are held by
  `weak_alias` when this capture allocated them in the pool: break inputs are read (or, for
  an output buffer passed in, written) at the break's position, boundary buffers are written
  there, and each is free for later segments to reuse once the capture stopped using it, as in
  a full graph. Everything else (caller buffers, weights, CPU tensors,
  pool blocks alive before this capture began) is held strongly.
- A break's output keeps its structure, shapes, dtypes and non-tensor values across replays;
  otherwise replay raises naming the function. Its internals are never traced or inspected:
  host syncs, data-dependent shapes and host-side planning are all fine inside.
- Debug mode makes the whole fn one break: it runs eagerly, through the same static inputs,
  replay path and output copy, with no graph at all.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch

from nanograph.graph.base import Backend, Graph, GraphStats
from nanograph.graph.breaks import break_handler, break_name, eager_on_graph
from nanograph.graph.capture import WARMUP_RUNS, SegmentRecorder, capture_segments, warm_up
from nanograph.graph.factory import require_cuda
from nanograph.graph.memory import AddressRanges, GraphPool, new_pool, weak_alias
from nanograph.graph.structure import OutputCopy, map_tensors

_HINT = (
    "Move the call into a function decorated with @eager_on_graph (it then runs eagerly between "
    "graph segments), or use get_backend('eager')."
)


class _Break:
    """One eager region of the replay program."""

    __slots__ = ("fn", "args", "kwargs", "copy_out")

    def __init__(self, fn: Callable[..., Any], args: tuple, kwargs: dict, copy_out: OutputCopy):
        self.fn, self.args, self.kwargs, self.copy_out = fn, args, kwargs, copy_out

    def run(self) -> None:
        self.copy_out(self.fn(*self.args, **self.kwargs))


def _boundary(result: Any, pool: GraphPool, name: str) -> tuple[Any, OutputCopy]:
    """Boundary buffers for a break's capture-time output, and the copy that refills them."""
    kept: list[torch.Tensor] = []

    def buffer(t: torch.Tensor) -> torch.Tensor:
        if not t.is_cuda:
            kept.append(t.clone())
            return kept[-1]
        with pool.allocating():
            b = torch.empty_like(t)
        b.copy_(t)
        kept.append(weak_alias(b))  # live exactly as long as fn uses it (module docstring)
        return b

    boundary = map_tensors(buffer, result)
    return boundary, OutputCopy(name, result, kept)


class _Session:
    """A breakable capture in progress; installed as the `eager_on_graph` handler."""

    def __init__(self, recorder: SegmentRecorder) -> None:
        self.recorder = recorder
        self.breaks: Counter[str] = Counter()
        # Pool blocks alive before this capture (e.g. an earlier capture's `out`) are owned by
        # someone else: tensors in them are never held weakly.
        self.preexisting = recorder.pool.live_blocks()

    def __call__(
        self, fn: Callable[..., Any], stub: Callable[..., Any] | None, args: tuple, kwargs: dict
    ) -> Any:
        self.recorder.end()
        token = break_handler.set(None)  # breaks inside this break are plain calls
        try:
            result = (stub or fn)(*args, **kwargs)
        finally:
            break_handler.reset(token)
        name = break_name(fn)
        boundary, copy_out = _boundary(result, self.recorder.pool, name)
        args, kwargs = self._hold_inputs(args, kwargs)
        self.recorder.steps.append(_Break(fn, args, kwargs, copy_out).run)
        self.breaks[name] += 1
        self.recorder.begin()
        return boundary

    def _hold_inputs(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        ranges: AddressRanges | None = None

        def hold(t: torch.Tensor) -> torch.Tensor:
            nonlocal ranges
            if not t.is_cuda:
                return t
            if ranges is None:
                ranges = self.recorder.pool.address_ranges(self.preexisting)
            return weak_alias(t) if ranges.owns(t) else t

        return map_tensors(hold, (args, kwargs))


class BreakableGraph(Graph):
    """Segments and eager breaks, replayed alternately."""

    def __init__(self, recorder: SegmentRecorder, out: Any, stats: GraphStats) -> None:
        super().__init__(out, stats)
        self._graphs = recorder.graphs
        self._steps = recorder.steps
        self.pool = recorder.pool  # set last: released after the graphs that use it

    def replay(self) -> None:
        with torch.no_grad():
            for step in self._steps:
                step()


class BreakableBackend(Backend):
    """`breakable`: segments closed at every eager break reached during capture."""

    name = "breakable"

    def __init__(
        self,
        debug: bool = False,
        warmup: int = WARMUP_RUNS,
        side_streams: Sequence[torch.cuda.Stream] = (),
    ) -> None:
        self.debug = debug
        self.warmup = warmup
        self.side_streams = tuple(side_streams)

    def capture(
        self, fn: Callable[[], Any], pool: GraphPool | None = None
    ) -> tuple[BreakableGraph, Any]:
        require_cuda(self.name)
        pool = pool if pool is not None else new_pool()
        warm_up(fn, pool.stream, self.warmup)
        target = eager_on_graph(fn) if self.debug else fn
        recorder = SegmentRecorder(pool, self.side_streams)
        session = _Session(recorder)
        out = capture_segments(target, recorder, session, self.name, _HINT)
        stats = GraphStats(
            backend=self.name + (" (debug)" if self.debug else ""),
            segments=len(recorder.graphs),
            breaks=dict(session.breaks),
            capture_s=recorder.capture_s,
            pool_bytes=pool.reserved_bytes(),
        )
        return BreakableGraph(recorder, out, stats), out
