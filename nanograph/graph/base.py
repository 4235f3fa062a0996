"""The interface every graph backend shares, and what backends have in common.

Invariants:
- `Backend.capture(fn, pool)` returns `(graph, out)`; `graph.replay()` recomputes `out` in place
  from the static inputs `fn` reads. Static inputs must keep their addresses: refill them with
  `copy_`, never rebind them. `out` and every tensor in it keep their identity for the life of
  the graph.
- Graphs that share a pool may reuse each other's memory for temporaries: replay one graph at a
  time and read its `out` before replaying another graph of the same pool (or have `fn` write
  into a caller-owned output buffer).
- Capture and replay run under `torch.no_grad()`: graphs are for inference.
- Asking for a graph backend on a machine without CUDA fails in `get_backend`, with the fix.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

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


def get_backend(name: str, *, debug: bool = False, **options: Any) -> Backend:
    """The backend called `name`: "eager", "full", "breakable" or "tc_piecewise".

    `debug=True` (breakable only) makes the whole fn one eager break: it runs eagerly through the
    same static buffers and replay path. Options: `warmup` (eager runs before capture, default 2)
    for the graph backends, `side_streams` for full/breakable, `compile_backend` (default
    "inductor") and `split_ops` for tc_piecewise.
    """
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown graph backend {name!r}; choose one of {BACKEND_NAMES}")
    if debug and name != "breakable":
        raise ValueError("debug=True is a mode of the 'breakable' backend")
    if name == "eager":
        from nanograph.graph.eager import EagerBackend

        return EagerBackend()
    require_cuda(name)
    if name == "full":
        from nanograph.graph.full import FullBackend

        return FullBackend(**options)
    if name == "breakable":
        from nanograph.graph.breakable import BreakableBackend

        return BreakableBackend(debug=debug, **options)
    from nanograph.graph.piecewise import TcPiecewiseBackend

    return TcPiecewiseBackend(**options)


def require_cuda(backend: str) -> None:
    if not torch.cuda.is_available():
        raise GraphCaptureError(
            f"graph backend {backend!r} needs CUDA, but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}). Use get_backend('eager') on this machine."
        )


def warm_up(fn: Callable[[], Any], stream: torch.cuda.Stream, times: int) -> None:
    """Run fn eagerly on the capture stream, so lazy initialisation (cuBLAS workspaces, autotune,
    caches) happens before capture and on the stream the graphs will be captured on."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(stream):
        for _ in range(times):
            fn()
    stream.synchronize()


@contextmanager
def paused_gc() -> Iterator[None]:
    """No Python GC during capture: collections there are slow and can free graph inputs."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_STDLIB_DIR = os.path.dirname(os.__file__) + os.sep  # contextlib, functools, ...
_GRAPH_DIR = os.path.dirname(__file__) + os.sep


def _is_internal(filename: str) -> bool:
    if filename.startswith((_TORCH_DIR, _GRAPH_DIR)):
        return True
    return filename.startswith(_STDLIB_DIR) and "site-packages" not in filename


def call_site(exc: BaseException) -> str:
    """The innermost frame of `exc` outside torch, the stdlib and nanograph.graph."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if not _is_internal(frame.filename):
            return f"{frame.filename}:{frame.lineno} in {frame.name}: `{frame.line}`"
    return "an unknown call site"


def capture_error(backend: str, exc: BaseException, hint: str) -> GraphCaptureError:
    """Wrap an exception raised while a CUDA graph was capturing into an actionable error."""
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return GraphCaptureError(
        f"{backend}: capture failed at {call_site(exc)}: {type(exc).__name__}: {detail}\n"
        "Operations that sync with the host or have data-dependent shapes (.item(), .tolist(), "
        ".cpu(), nonzero, boolean-mask indexing, printing a tensor) cannot run inside a CUDA "
        f"graph. {hint} The capture was cleaned up; the pool and the process remain usable."
    )
