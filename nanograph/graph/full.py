"""`full`: the whole fn as one CUDA graph, no eager region (fewest launches at replay).

Invariant: `eager_on_graph` functions are ordinary calls here, so they are captured like the
rest; anything uncapturable inside them fails the capture with an error that says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from nanograph.graph.base import Backend, Graph, GraphStats
from nanograph.graph.capture import WARMUP_RUNS, SegmentRecorder, capture_segments, warm_up
from nanograph.graph.factory import require_cuda
from nanograph.graph.memory import GraphPool, new_pool

_HINT = (
    "The 'full' backend captures everything, eager_on_graph functions included: use "
    "get_backend('breakable') with the call inside an @eager_on_graph function, or 'eager'."
)


class FullGraph(Graph):
    def __init__(self, recorder: SegmentRecorder, out: Any, stats: GraphStats) -> None:
        super().__init__(out, stats)
        self._graph = recorder.graphs[0] if recorder.graphs else None
        self.pool = recorder.pool  # set last: released after the graph that uses it

    def replay(self) -> None:
        if self._graph is not None:
            self._graph.replay()


class FullBackend(Backend):
    name = "full"

    def __init__(
        self, warmup: int = WARMUP_RUNS, side_streams: Sequence[torch.cuda.Stream] = ()
    ) -> None:
        self.warmup = warmup
        self.side_streams = tuple(side_streams)

    def capture(
        self, fn: Callable[[], Any], pool: GraphPool | None = None
    ) -> tuple[FullGraph, Any]:
        require_cuda(self.name)
        pool = pool if pool is not None else new_pool()
        warm_up(fn, pool.stream, self.warmup)
        recorder = SegmentRecorder(pool, self.side_streams)
        out = capture_segments(fn, recorder, None, self.name, _HINT)
        stats = GraphStats(
            backend=self.name,
            segments=len(recorder.graphs),
            capture_s=recorder.capture_s,
            pool_bytes=pool.reserved_bytes(),
        )
        return FullGraph(recorder, out, stats), out
