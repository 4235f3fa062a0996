"""The interface every graph backend shares: ``Backend``, ``Graph``, ``GraphStats`` and
``GraphCaptureError``. It imports nothing of the package (the factory is ``factory.py``, the
capture helpers are in ``capture.py``).

Invariants:
- `Backend.capture(fn, pool)` returns `(graph, out)`; `graph.replay()` recomputes `out` in place
  from the static inputs `fn` reads. Static inputs must keep their addresses: refill them with
  `copy_`, never rebind them. `out` and every tensor in it keep their identity for the life of
  the graph.
- Graphs that share a pool may reuse each other's memory for temporaries: replay one graph at a
  time and read its `out` before replaying another graph of the same pool (or have `fn` write
  into a caller-owned output buffer).
- Capture and replay run under `torch.no_grad()`: graphs are for inference.
- Asking for a graph backend on a machine without CUDA fails in `get_backend`
  (``factory.py``), with the fix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

BACKEND_NAMES = ("eager", "full", "breakable", "tc_piecewise")


class GraphCaptureError(RuntimeError):
    """A capture failed (or cannot start); the message says where and what to do instead."""


@dataclasses.dataclass
class GraphStats:
    """What a capture produced and cost."""

    backend: str
    segments: int = 0  # CUDA graphs replayed per replay (non-empty segments or pieces)
    breaks: dict[str, int] = dataclasses.field(default_factory=dict)  # eager regions by name
    capture_s: float = 0.0  # warm-up excluded; for tc_piecewise, compile excluded
    compile_s: float = 0.0  # tc_piecewise only: dynamo + the first (compiling) run
    pool_bytes: int = 0  # bytes the (possibly shared) pool reserves after this capture

    @property
    def num_breaks(self) -> int:
        return sum(self.breaks.values())


class Graph:
    """A captured `fn`: `replay()` recomputes `out` in place."""

    def __init__(self, out: Any, stats: GraphStats) -> None:
        self.out = out
        self.stats = stats

    def replay(self) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        s = self.stats
        breaks = ", ".join(f"{name}: {n}" for name, n in s.breaks.items())
        compile_s = f", compile={s.compile_s:.2f}s" if s.compile_s else ""
        return (
            f"{type(self).__name__}(segments={s.segments}, breaks={s.num_breaks}"
            f"{' {' + breaks + '}' if breaks else ''}, capture={s.capture_s:.3f}s{compile_s}, "
            f"pool={s.pool_bytes / 2**20:.1f} MiB)"
        )


class Backend:
    """Turns a callable over caller-owned static inputs into a replayable graph."""

    name = "base"

    def capture(self, fn: Callable[[], Any], pool: Any = None) -> tuple[Graph, Any]:
        raise NotImplementedError
