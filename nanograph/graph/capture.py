"""Capturing CUDA-graph segments: consecutive graphs on one stream and pool, cleaned up on error.

Invariants:
- At most one segment is open at a time; all segments and all captures into a pool use the
  pool's stream, so the allocator can reuse blocks across segments and shapes.
- Each segment is replayed once right after it is captured. Eager code that runs between
  segments at capture time (breaks, split ops) therefore sees real values, never the garbage a
  captured-but-not-executed graph leaves behind, and `out` is valid when capture returns.
- Side streams listed in `side_streams` that are forked into a segment are joined before it
  closes, and forked again when the next segment opens, so work that spans a break stays
  captured.
- If anything fails while a segment is open, `abort()` ends the stream capture; if CUDA had
  already invalidated it, `_recover()` also stops the allocator routing to the pool, moves the
  pool to a fresh allocator id and resets torch's RNG capture state: the pool and the process
  remain usable. A segment that captured nothing is dropped (no empty-graph launches).
"""

from __future__ import annotations

import gc
import os
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from nanograph.graph.base import GraphCaptureError
from nanograph.graph.breaks import BreakHandler, break_handler
from nanograph.graph.memory import GraphPool, replace_capture_stream

# eager runs before a capture (the backends' default ``warmup``): the first initialises lazily,
# the second runs as every later call will
WARMUP_RUNS = 2


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


def _is_capturing(stream: torch.cuda.Stream) -> bool:
    with torch.cuda.stream(stream):
        return torch.cuda.is_current_stream_capturing()


def _release_routing(device: int, pool_id: tuple[int, int]) -> None:
    """Undo what a failed `capture_end` left behind in the caching allocator.

    `CUDAGraph.capture_end` raises before it stops routing allocations to the pool when the
    capture was invalidated (e.g. by a host sync); the graph's destructor then releases nothing
    because the capture never ended. Ending the routing ourselves tells us which case we are in.
    """
    end_routing = getattr(torch._C, "_cuda_endAllocateToPool", None) or getattr(
        torch._C,
        "_cuda_endAllocateCurrentStreamToPool",
        None,  # torch < 2.7 spelling
    )
    if end_routing is None:
        return
    try:
        end_routing(device, pool_id)
    except Exception:
        return  # capture_end got past this point: the graph's destructor releases the pool
    torch._C._cuda_releasePool(device, pool_id)


class SegmentRecorder:
    """Captures consecutive segments of one forward; `steps` is the replay program so far."""

    def __init__(self, pool: GraphPool, side_streams: Sequence[torch.cuda.Stream] = ()) -> None:
        self.pool = pool
        self.stream = pool.stream
        self.side_streams = tuple(side_streams)
        self.device = torch.cuda.current_device()
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.steps: list[Callable[[], None]] = []
        self.capture_s = 0.0
        self._graph: torch.cuda.CUDAGraph | None = None
        self._spanning: list[torch.cuda.Stream] = []  # side streams open when a segment closed

    @property
    def is_open(self) -> bool:
        return self._graph is not None

    def begin(self) -> None:
        current = torch.cuda.current_stream()
        if current != self.stream:
            self.stream.wait_stream(current)  # eager work on another stream comes first
        pool_id = self.pool.id  # may capture the pool's keep-alive graph: before ours begins
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(self.stream):
            try:
                graph.capture_begin(pool=pool_id, capture_error_mode="thread_local")
            except Exception as exc:
                del graph
                self._recover()
                raise GraphCaptureError(f"starting a graph segment failed: {exc}") from exc
            self._graph = graph
            for side in self._spanning:
                side.wait_stream(self.stream)

    def end(self) -> torch.cuda.CUDAGraph | None:
        """Close the open segment and replay it once; None if it captured no work."""
        graph, self._graph = self._graph, None
        assert graph is not None, "no open segment"
        with torch.cuda.stream(self.stream):
            self._spanning = [s for s in self.side_streams if _is_capturing(s)]
            for side in self._spanning:
                self.stream.wait_stream(side)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    graph.capture_end()
                    failure = None
                except Exception as exc:
                    failure = exc
            if failure is not None:
                del graph  # not kept alive by the traceback below
                self._recover()
                raise GraphCaptureError(
                    f"closing a graph segment failed: {failure}. If fn forks side streams, "
                    "join them before the segment ends or pass them as side_streams=."
                ) from failure
            if any("CUDA Graph is empty" in str(w.message) for w in caught):
                return None
            graph.replay()
        self.graphs.append(graph)
        self.steps.append(graph.replay)
        return graph

    def abort(self) -> None:
        """Clean up after an exception raised while a segment was open (see module docstring)."""
        self.graphs.clear()
        self.steps.clear()
        graph, self._graph = self._graph, None
        if graph is None:
            return
        with torch.cuda.stream(self.stream), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for side in self.side_streams:
                try:
                    if _is_capturing(side):
                        self.stream.wait_stream(side)
                except RuntimeError:
                    pass
            try:
                graph.capture_end()  # the capture may still be valid (error raised before CUDA)
                return
            except RuntimeError:
                pass
        del graph
        self._recover()

    def _recover(self) -> None:
        """Leave no trace of a capture whose `capture_end` (or `capture_begin`) failed.

        Such a capture leaves torch's allocator routing allocations to the pool, the pool's use
        count raised, and (torch 2.11) the CUDA RNG in capture mode, so that every later random
        op fails with "Offset increment outside graph capture". We end the routing, move the pool
        to a fresh allocator id, and capture that id's keep-alive graph: one good capture, which
        resets the RNG state.
        """
        _release_routing(self.device, self.pool.id)
        if _is_capturing(self.stream):
            replace_capture_stream()
            self.stream = self.pool.stream
        try:
            self.pool.retire()
        except Exception as exc:
            raise GraphCaptureError(
                f"CUDA graph capture state could not be restored after a failed capture ({exc}); "
                "restart the process"
            ) from exc


def capture_segments(
    fn: Callable[[], Any],
    recorder: SegmentRecorder,
    handler: BreakHandler | None,
    backend: str,
    hint: str,
) -> Any:
    """Run fn once with a segment open from start to end, `handler` deciding what breaks do.

    Returns fn's output; on error nothing of the capture survives (see SegmentRecorder.abort).
    """
    if break_handler.get() is not None or torch.cuda.is_current_stream_capturing():
        raise GraphCaptureError(f"{backend}: capture() called inside another capture")
    token = break_handler.set(handler)
    start = time.perf_counter()
    try:
        with paused_gc(), torch.no_grad(), torch.cuda.stream(recorder.stream):
            recorder.begin()
            out = fn()
            recorder.end()
    except BaseException as exc:
        was_open = recorder.is_open
        recorder.abort()
        if was_open and isinstance(exc, Exception) and not isinstance(exc, GraphCaptureError):
            raise capture_error(backend, exc, hint) from exc
        raise
    finally:
        break_handler.reset(token)
    torch.cuda.current_stream().wait_stream(recorder.stream)
    recorder.capture_s = time.perf_counter() - start
    return out
