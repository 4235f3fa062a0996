"""`tc_piecewise`: torch.compile(fullgraph=True) over fn, split at split ops, a graph per piece.

The FX splitting is ``fx_split``; the torch.compile backend that compiles and captures the
pieces, and the ``CaptureSession`` that tells them what to do, are ``piecewise_compiler``.
This module is the graph backend over them.

Invariants:
- A backend instance owns one compiler: captures of closures of the same function at other
  sizes (a runner's shapes) reuse its compiled pieces and only capture.
- Every capture gets a key and opens one capturing session; every replay opens a replaying
  session for its key and calls the split program recorded at capture directly, so each piece
  replays the graph of the shape being replayed. (Through dynamo, a newer, more general
  compile whose guards also pass would run pieces that never captured this key.)
- Split ops run eagerly on every call, between pieces, as plain calls of their Python
  implementation. A piece input that comes from a split op has a fresh address each call: it
  is copied into the tensor the piece was captured with.
- Replay skips dynamo (no guards): like any CUDA graph it replays what was captured, and fn's
  Python side effects outside the traced graph are not repeated. What remains per forward is
  the split program's Python, the piece replays and the split ops. fn's output tensors must be
  graph outputs or live in buffers fn was given (checked at capture).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from nanograph.graph.base import Backend, Graph, GraphCaptureError, GraphStats
from nanograph.graph.breaks import use_capture_stub
from nanograph.graph.capture import WARMUP_RUNS, SegmentRecorder, paused_gc
from nanograph.graph.factory import require_cuda
from nanograph.graph.memory import GraphPool, new_pool
from nanograph.graph.piecewise_compiler import (
    CaptureSession,
    PiecewiseCompiler,
    dynamo_settings,
    trace_and_split,
)
from nanograph.graph.structure import flatten


class PiecewiseGraph(Graph):
    """Replays one capture key: the split program dynamo ran at capture, called directly with
    the same arguments (no guards: a newer compile whose guards also pass would otherwise run
    pieces that never captured this key), then fresh outputs copied into `out` where needed."""

    def __init__(self, backend: TcPiecewiseBackend, key: int, out: Any, stats: GraphStats,
                 pool: GraphPool) -> None:  # fmt: skip
        super().__init__(out, stats)
        # the backend owns the compiled pieces: a graph keeps it (and them) alive
        self._backend, self._compiler, self._key = backend, backend.compiler, key
        self.pool = pool
        if key not in self._compiler.programs:
            raise GraphCaptureError("tc_piecewise: the capture ran no compiled program")
        self._program, self._args, flat = self._compiler.programs.pop(key)
        self._session = CaptureSession(self._compiler, key)  # replays open it
        self._copies = _output_copies(out, flat, self._args)

    def replay(self) -> None:
        with self._session, torch.no_grad():
            flat = self._program(*self._args)
        for i, leaf in self._copies:
            if flat[i].data_ptr() != leaf.data_ptr():
                leaf.copy_(flat[i])

    def __del__(self) -> None:
        if hasattr(self, "_compiler"):
            self._compiler.release(self._key)


def _output_copies(out: Any, flat: Any, args: tuple) -> list[tuple[int, torch.Tensor]]:
    """(graph output index, leaf of `out`) for every tensor of fn's output that a graph output
    produced; leaves that live in a graph input (fn wrote into a buffer it was given) need no
    copy. Anything else cannot be refreshed without dynamo: refuse it at capture."""
    outputs = list(flat) if isinstance(flat, (tuple, list)) else [flat]
    inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
    copies = []
    for leaf in (x for x in flatten(out) if isinstance(x, torch.Tensor)):
        index = next((i for i, o in enumerate(outputs) if o is leaf), None)
        if index is None:
            index = next((i for i, o in enumerate(outputs) if isinstance(o, torch.Tensor)
                          and o.data_ptr() == leaf.data_ptr() and o.shape == leaf.shape
                          and o.stride() == leaf.stride()), None)  # fmt: skip
        if index is not None:
            copies.append((index, leaf))
        elif leaf.untyped_storage().data_ptr() not in inputs:
            raise GraphCaptureError(
                "tc_piecewise: fn returns a tensor that is neither a graph output nor in a "
                "buffer fn was given; return graph results (or write into a given buffer)"
            )
    return copies


class TcPiecewiseBackend(Backend):
    name = "tc_piecewise"

    def __init__(
        self,
        compile_backend: str | Callable[..., Any] = "inductor",
        split_ops: Mapping[Any, str] | None = None,
        warmup: int = WARMUP_RUNS,
    ) -> None:
        self.warmup = max(1, warmup)
        # one compiler for every capture: closures of one function at other sizes reuse its
        # compiled pieces (module docstring)
        self.compiler = PiecewiseCompiler(compile_backend, split_ops)
        self._keys = itertools.count()

    def capture(
        self, fn: Callable[[], Any], pool: GraphPool | None = None
    ) -> tuple[PiecewiseGraph, Any]:
        require_cuda(self.name)
        pool = pool if pool is not None else new_pool()
        compiler, key = self.compiler, next(self._keys)
        compile_before = compiler.piece_compile_s
        try:
            compiled, compile_s = self._compile(fn, compiler, pool)
            session = CaptureSession(compiler, key, SegmentRecorder(pool), pool.live_blocks())
            out, capture_s = self._capture(compiled, session, pool)
            stats = GraphStats(
                backend=self.name,
                segments=sum(
                    p.captures[key].graph is not None for p in compiler.pieces if key in p.captures
                ),  # fmt: skip
                breaks=dict(compiler.splits),
                capture_s=capture_s,
                # the first run's time when it compiled (dynamo + pieces); 0 when it reused them
                compile_s=compile_s if compiler.piece_compile_s > compile_before else 0.0,
                pool_bytes=pool.reserved_bytes(),
            )
            graph = PiecewiseGraph(self, key, out, stats, pool)
        except BaseException:
            compiler.release(key)  # dynamo's cache keeps the compiler: let go of this capture
            raise
        return graph, out

    def __del__(self) -> None:
        # Dynamo's cache keeps the compiler; the compiled pieces go with the backend (and
        # every graph it captured, which hold it).
        if hasattr(self, "compiler"):
            self.compiler.release()

    def _compile(
        self, fn: Callable[[], Any], compiler: PiecewiseCompiler, pool: GraphPool
    ) -> tuple[Callable[[], Any], float]:
        """Trace, split and compile (the first run), then the remaining warm-up runs."""
        pool.stream.wait_stream(torch.cuda.current_stream())
        start = time.perf_counter()
        with torch.no_grad(), torch.cuda.stream(pool.stream):
            compiled = trace_and_split(fn, compiler)
            pool.stream.synchronize()
            compile_s = time.perf_counter() - start
            with dynamo_settings():
                for _ in range(self.warmup - 1):
                    compiled()
            pool.stream.synchronize()
        return compiled, compile_s

    def _capture(
        self, compiled: Callable[[], Any], session: CaptureSession, pool: GraphPool
    ) -> tuple[Any, float]:
        """One call with every piece capturing its graph under the session's key."""
        token = use_capture_stub.set(True)
        start = time.perf_counter()
        try:
            with session, paused_gc(), torch.no_grad(), torch.cuda.stream(pool.stream):
                with dynamo_settings():
                    out = compiled()
        finally:
            use_capture_stub.reset(token)
        torch.cuda.current_stream().wait_stream(pool.stream)
        return out, time.perf_counter() - start
