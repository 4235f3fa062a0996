"""`eager`: no graph. Replay runs fn and copies its fresh output into `out`.

The baseline, and the path on machines without CUDA. Same contract as the graph backends
(`out` keeps its identity, its structure must not change), so a runner can switch freely.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from nanograph.graph.base import Backend, Graph, GraphStats
from nanograph.graph.breaks import break_name
from nanograph.graph.structure import OutputCopy, flatten


class EagerGraph(Graph):
    def __init__(self, fn: Callable[[], Any], out: Any, stats: GraphStats) -> None:
        super().__init__(out, stats)
        self._fn = fn
        tensors = [x for x in flatten(out) if isinstance(x, torch.Tensor)]
        self._copy_out = OutputCopy(break_name(fn), out, tensors)

    def replay(self) -> None:
        with torch.no_grad():
            self._copy_out(self._fn(), skip_same_address=True)


class EagerBackend(Backend):
    name = "eager"

    def capture(self, fn: Callable[[], Any], pool: Any = None) -> tuple[EagerGraph, Any]:
        start = time.perf_counter()
        with torch.no_grad():
            out = fn()
        stats = GraphStats(backend=self.name, capture_s=time.perf_counter() - start)
        return EagerGraph(fn, out, stats), out
