"""The `tc_piecewise` compiler: the torch.compile backend that compiles pieces and captures them.

Invariants:
- One compiler compiles each function once for every size it is captured at: dynamo traces
  with dynamic shapes (sizes 0 and 1 aside, which dynamo specializes: one more compile), the
  FX graph is split (``fx_split``) and each piece is compiled with ``compile_backend`` for
  symbolic sizes, from the fake inputs the split graph propagates.
- What the pieces do on a call is decided by the one ``CaptureSession`` open on the compiler
  (``compiler.session``), opened by the backend for one capture or one replay and closed after
  it: none open, pieces run their compiled code; a session with a recorder, each piece
  captures its graph under the session's key; a session without one, each piece replays the
  key's graph. At most one session is open at a time.
- Each piece keeps one CUDA graph, its split-fed inputs and its outputs per capture key, in
  the capture's pool. Piece outputs are held by weak alias when this capture allocated them
  (capture order = replay order, as in breakable.py).
- The split program dynamo called at capture is recorded with its arguments and outputs
  (``programs[key]``): replay calls it directly, without dynamo's guards.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from nanograph.graph.base import GraphCaptureError
from nanograph.graph.breaks import SPLIT_OPS
from nanograph.graph.capture import SegmentRecorder, capture_error
from nanograph.graph.fx_split import DirectSplit, piece_inputs, split_fed_inputs, split_graph
from nanograph.graph.memory import weak_alias
from nanograph.graph.structure import map_tensors

HINT = "Declare the call as a split op (nanograph.graph.split_op) or use 'breakable'."


class CaptureSession:
    """One capture (``recorder`` set) or one replay of capture key ``key``, open on its
    compiler for the duration of a ``with`` block."""

    __slots__ = ("compiler", "key", "recorder", "preexisting")

    def __init__(
        self,
        compiler: PiecewiseCompiler,
        key: int,
        recorder: SegmentRecorder | None = None,
        preexisting: frozenset[int] = frozenset(),
    ) -> None:
        self.compiler, self.key = compiler, key
        self.recorder = recorder  # capturing: records each piece's graph; None: replaying
        # pool blocks alive before this capture (an earlier capture's `out`): never held weakly
        self.preexisting = preexisting

    def __enter__(self) -> CaptureSession:
        if self.compiler.session is not None:
            raise RuntimeError("tc_piecewise: a capture or replay is already in progress")
        self.compiler.session = self
        return self

    def __exit__(self, *exc: object) -> None:
        self.compiler.session = None


class _Capture:
    """What one capture key left in a piece: its graph (None if it captured no work), the
    tensors split-op outputs are copied into, and the outputs to return at replay."""

    __slots__ = ("graph", "static", "outputs")

    def __init__(self, graph: torch.cuda.CUDAGraph | None, static: dict, outputs: Any) -> None:
        self.graph, self.static, self.outputs = graph, static, outputs


class _Piece:
    """One compiled piece: runs compiled code, captures per key, replays the key's graph."""

    def __init__(self, module: torch.fx.GraphModule, owner: PiecewiseCompiler, fed: tuple,
                 example_inputs: tuple) -> None:  # fmt: skip
        self.module, self.owner, self.split_fed = module, owner, fed
        # Compilers want tuple outputs (aot_autograd insists): make single outputs 1-tuples.
        output = next(n for n in module.graph.nodes if n.op == "output")
        self.single = not isinstance(output.args[0], (tuple, list))
        if self.single:
            output.args = ((output.args[0],),)
            module.recompile()
        start = time.perf_counter()
        self.compiled: Callable[..., Any] | None = owner.lookup_backend()(
            module, list(example_inputs)
        )
        owner.piece_compile_s += time.perf_counter() - start
        self.captures: dict[int, _Capture] = {}

    def __call__(self, *args: Any) -> Any:
        session = self.owner.session
        if session is None:
            return self._run(args)
        capture = self.captures.get(session.key)
        if capture is not None:
            for i in self.split_fed:
                if args[i].data_ptr() != capture.static[i].data_ptr():
                    capture.static[i].copy_(args[i])
            if capture.graph is not None:
                capture.graph.replay()
            return capture.outputs
        recorder = session.recorder
        if recorder is None:  # replaying a key this piece never captured (a newer compile)
            return self._run(args)
        recorder.begin()
        try:
            out = self._run(args)
        except Exception as exc:
            recorder.abort()
            raise capture_error("tc_piecewise", exc, HINT) from exc
        graph = recorder.end()
        owned = recorder.pool.address_ranges(session.preexisting)
        outputs = map_tensors(lambda t: weak_alias(t) if owned.owns(t) else t, out)
        self.captures[session.key] = _Capture(graph, {i: args[i] for i in self.split_fed}, outputs)
        return out

    def _run(self, args: tuple) -> Any:
        # Backends return what dynamo itself calls unboxed (inductor's `_boxed_call` attribute
        # describes an inner function and is misleading here).
        assert self.compiled is not None, "piece used after release"
        out = self.compiled(*args)
        return out[0] if self.single else out


class PiecewiseCompiler:
    """The torch.compile backend: split dynamo's graph, compile pieces, capture when asked.

    One instance serves every capture of a backend; `session` is the capture or replay in
    progress (None: pieces run their compiled code)."""

    def __init__(
        self,
        compile_backend: str | Callable[..., Any] = "inductor",
        split_ops: Mapping[Any, str] | None = None,
    ) -> None:
        self.compile_backend = compile_backend
        self.split_ops = dict(SPLIT_OPS if split_ops is None else split_ops)
        self.session: CaptureSession | None = None  # the capture or replay in progress
        # per capture key: the split program dynamo called, its arguments and its outputs
        self.programs: dict[int, tuple[torch.fx.GraphModule, tuple, Any]] = {}
        self.split_gm: torch.fx.GraphModule | None = None  # the latest compile
        self.pieces: list[_Piece] = []  # every compile's pieces
        self.splits: Counter[str] = Counter()
        self.compiles = 0
        self.piece_compile_s = 0.0

    def release(self, key: int | None = None) -> None:
        """Drop the graphs and buffers of capture `key` (None: of every capture, and the
        compiled pieces: the backend is gone). Dynamo's cache keeps the split modules alive
        after the graph objects are gone, so without this the pool memory would never return."""
        for piece in self.pieces:
            if key is None:
                piece.captures.clear()
                piece.compiled = None
            else:
                piece.captures.pop(key, None)
        if key is None:
            self.programs.clear()
            self.pieces = []
            self.session = None  # its recorder holds the pool
        else:
            self.programs.pop(key, None)

    def lookup_backend(self) -> Callable[..., Any]:
        if callable(self.compile_backend):
            return self.compile_backend
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend(self.compile_backend)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        split_gm, names, splits = split_graph(gm, self.split_ops)
        fed = split_fed_inputs(split_gm, splits)
        inputs = piece_inputs(split_gm, names, example_inputs)
        pieces = [_Piece(split_gm.get_submodule(n), self, fed[n], inputs[n]) for n in names]
        for name, piece in zip(names, pieces, strict=True):
            # Shadow the child module: plain callables skip nn.Module's call machinery.
            split_gm.__dict__[name] = piece
        for name in splits:
            direct = DirectSplit.of(split_gm.get_submodule(name))
            if direct is not None:
                split_gm.__dict__[name] = direct
        self.pieces += pieces
        self.splits = Counter(splits.values())
        self.split_gm = split_gm
        self.compiles += 1

        def program(*args: Any) -> Any:
            out = split_gm(*args)
            session = self.session
            if session is not None and session.recorder is not None:
                # replay calls this program directly, without dynamo
                self.programs[session.key] = (split_gm, args, out)
            return out

        return program


@contextmanager
def dynamo_settings(limit: int = 256) -> Iterator[None]:
    """Floats stay constants under dynamic shapes (a module's float attribute would otherwise
    become a graph input, and e.g. nn.Embedding's `norm_type` then fails), and a few compiles
    per function (dynamic sizes, then sizes 0/1, other closures) never fall back to eager."""
    config = torch._dynamo.config
    names = [n for n in ("recompile_limit", "accumulated_recompile_limit") if hasattr(config, n)]
    settings = {n: max(getattr(config, n), limit) for n in names}
    if hasattr(config, "specialize_float"):
        settings["specialize_float"] = True
    with config.patch(**settings):
        yield


def trace_and_split(fn: Callable[[], Any], compiler: PiecewiseCompiler) -> Callable[[], Any]:
    """torch.compile `fn` with `compiler` as backend and run it once (trace, split, compile)."""
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend=compiler)
    try:
        with dynamo_settings():
            compiled()
    except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError) as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GraphCaptureError(
            f"tc_piecewise: dynamo cannot trace fn with fullgraph=True ({detail}). Use "
            "get_backend('breakable') and mark the untraceable call @eager_on_graph, or declare "
            "it with split_op so tc_piecewise splits around it."
        ) from exc
    if compiler.split_gm is None:
        raise GraphCaptureError("tc_piecewise: torch.compile ran fn without compiling it")
    return compiled


__all__ = ["CaptureSession", "PiecewiseCompiler", "dynamo_settings", "trace_and_split"]
