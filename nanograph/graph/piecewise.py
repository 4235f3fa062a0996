"""`tc_piecewise`: torch.compile(fullgraph=True) over fn, split at split ops, a graph per piece.

Invariants:
- dynamo traces fn once per capture (fullgraph, static shapes). The FX graph is split so that
  every split-op call sits alone in its own submodule; each other submodule (a "piece") is
  compiled with `compile_backend` and, at capture, captured as its own CUDA graph in the pool.
- Split ops run eagerly on every call, between pieces, as plain calls of their Python
  implementation (the dispatcher's bookkeeping for a custom op that mutates arguments cost
  ~100 us a call on the dev CPU). A piece input that comes from a split op has a fresh address
  each call: it is copied into the tensor the piece was captured with.
- Piece outputs are held by weak alias when this capture allocated them (capture order = replay
  order, as in breakable.py); the graph keeps `out` alive itself.
- Replay calls the compiled function: dynamo's guards and the split graph's Python run every time
  (the per-forward cost the reference measures against BCG). A guard failure after capture would
  recompile into a different program, so it raises instead.
"""

from __future__ import annotations

import operator
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch.fx.passes.split_module import split_module

from nanograph.graph.base import (
    Backend,
    Graph,
    GraphCaptureError,
    GraphStats,
    capture_error,
    paused_gc,
    require_cuda,
)
from nanograph.graph.breaks import SPLIT_IMPLS, SPLIT_OPS, break_name, use_capture_stub
from nanograph.graph.capture import SegmentRecorder
from nanograph.graph.memory import GraphPool, new_pool, weak_alias
from nanograph.graph.structure import OutputCopy, flatten, map_tensors

_HINT = "Declare the call as a split op (nanograph.graph.split_op) or use 'breakable'."


def split_graph(
    gm: torch.fx.GraphModule, split_ops: Mapping[Any, str]
) -> tuple[torch.fx.GraphModule, list[str], dict[str, str]]:
    """Split `gm` so that every call to a split op sits alone in its own submodule.

    Returns the split module, the piece submodule names in execution order, and
    {split submodule name: op name}.
    """
    partition: dict[torch.fx.Node, int] = {}
    split_parts: dict[int, str] = {}
    current = 0
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op == "call_function" and node.target in split_ops:
            current += 1
            partition[node] = current
            split_parts[current] = split_ops[node.target]
            current += 1
        else:
            partition[node] = current
    split_gm = split_module(gm, gm, lambda node: partition[node], keep_original_order=True)
    splits = {f"submod_{part}": name for part, name in split_parts.items()}
    pieces = [n.target for n in split_gm.graph.nodes if n.op == "call_module"]
    return split_gm, [p for p in pieces if p not in splits], splits


def _split_fed_inputs(split_gm: torch.fx.GraphModule, splits: Mapping[str, str]) -> dict:
    """For each submodule, the positions of its arguments that a split op produced."""

    def from_split(arg: Any) -> bool:
        if not isinstance(arg, torch.fx.Node):
            return False
        if arg.op == "call_module":
            return arg.target in splits
        return arg.target is operator.getitem and from_split(arg.args[0])

    return {
        n.target: tuple(i for i, a in enumerate(n.args) if from_split(a))
        for n in split_gm.graph.nodes
        if n.op == "call_module"
    }


class _DirectSplit:
    """A split submodule (placeholders -> one split-op call -> its result) run as a plain call
    of the op's Python implementation, skipping the dispatcher. Same function, same arguments."""

    def __init__(self, impl: Callable[..., Any], spec: tuple, kwargs: dict, returns: bool) -> None:
        self.impl, self.spec, self.kwargs, self.returns = impl, spec, kwargs, returns

    @classmethod
    def of(cls, module: torch.fx.GraphModule) -> _DirectSplit | None:
        nodes = list(module.graph.nodes)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        calls = [n for n in nodes if n.op not in ("placeholder", "output")]
        output = nodes[-1]
        if len(calls) != 1 or output.op != "output":
            return None
        # The submodule returns the op's result, or nothing (an op that only mutates inputs).
        returns = output.args[0] is calls[0]
        if not returns and output.args[0] not in ((), None):
            return None
        call = calls[0]
        impl = SPLIT_IMPLS.get(call.target)
        if impl is None or any(isinstance(v, torch.fx.Node) for v in call.kwargs.values()):
            return None
        index = {node: i for i, node in enumerate(placeholders)}
        if any(isinstance(a, torch.fx.Node) and a not in index for a in call.args):
            return None
        # (True, i): the i-th input of the submodule; (False, value): a constant of the trace
        spec = tuple((True, index[a]) if isinstance(a, torch.fx.Node) else (False, a)
                     for a in call.args)  # fmt: skip
        return cls(impl, spec, dict(call.kwargs), returns)

    def __call__(self, *args: Any) -> Any:
        result = self.impl(
            *[args[v] if is_input else v for is_input, v in self.spec], **self.kwargs
        )
        return result if self.returns else ()


class _Piece:
    """One compiled piece: runs compiled until capture, then replays its own CUDA graph."""

    def __init__(self, module: torch.fx.GraphModule, owner: PiecewiseCompiler, fed: tuple):
        self.module, self.owner, self.split_fed = module, owner, fed
        # Compilers want tuple outputs (aot_autograd insists): make single outputs 1-tuples.
        output = next(n for n in module.graph.nodes if n.op == "output")
        self.single = not isinstance(output.args[0], (tuple, list))
        if self.single:
            output.args = ((output.args[0],),)
            module.recompile()
        self.compiled: Callable[..., Any] | None = None
        self.captured = False
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: dict[int, torch.Tensor] = {}
        self.outputs: Any = None

    def __call__(self, *args: Any) -> Any:
        if self.captured:
            for i in self.split_fed:
                if args[i].data_ptr() != self.static[i].data_ptr():
                    self.static[i].copy_(args[i])
            if self.graph is not None:
                self.graph.replay()
            return self.outputs
        if self.compiled is None:
            start = time.perf_counter()
            self.compiled = self.owner.lookup_backend()(self.module, list(args))
            self.owner.piece_compile_s += time.perf_counter() - start
        if not self.owner.capturing:
            return self._run(args)
        recorder = self.owner.recorder
        assert recorder is not None
        recorder.begin()
        try:
            out = self._run(args)
        except Exception as exc:
            recorder.abort()
            raise capture_error("tc_piecewise", exc, _HINT) from exc
        self.graph = recorder.end()
        self.static = {i: args[i] for i in self.split_fed}
        owned = recorder.pool.address_ranges(self.owner.preexisting)
        self.outputs = map_tensors(lambda t: weak_alias(t) if owned.owns(t) else t, out)
        self.captured = True
        return out

    def _run(self, args: tuple) -> Any:
        # Backends return what dynamo itself calls unboxed (inductor's `_boxed_call` attribute
        # describes an inner function and is misleading here).
        out = self.compiled(*args)
        return out[0] if self.single else out


class PiecewiseCompiler:
    """The torch.compile backend: split dynamo's graph, compile pieces, capture when asked."""

    def __init__(
        self,
        compile_backend: str | Callable[..., Any] = "inductor",
        split_ops: Mapping[Any, str] | None = None,
        recorder: SegmentRecorder | None = None,
    ) -> None:
        self.compile_backend = compile_backend
        self.split_ops = dict(SPLIT_OPS if split_ops is None else split_ops)
        self.recorder = recorder
        self.capturing = False
        self.finalized = False
        self.preexisting: frozenset[int] = frozenset()
        self.split_gm: torch.fx.GraphModule | None = None
        self.pieces: list[_Piece] = []
        self.splits: Counter[str] = Counter()
        self.piece_compile_s = 0.0

    def release(self) -> None:
        """Drop every piece's graph and buffers. Dynamo's cache keeps the split module alive
        after the graph object is gone, so without this the pool memory would never return."""
        for piece in self.pieces:
            piece.graph, piece.outputs, piece.static, piece.compiled = None, None, {}, None
        self.pieces = []
        if self.recorder is not None:
            self.recorder.graphs.clear()
            self.recorder.steps.clear()
            self.recorder = None  # it holds the pool

    def lookup_backend(self) -> Callable[..., Any]:
        if callable(self.compile_backend):
            return self.compile_backend
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend(self.compile_backend)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        if self.finalized:
            raise GraphCaptureError(
                "tc_piecewise: dynamo recompiled fn after capture (a guard failed: a shape, "
                "dtype or Python value fn reads changed). Capture one graph per variant."
            )
        split_gm, names, splits = split_graph(gm, self.split_ops)
        fed = _split_fed_inputs(split_gm, splits)
        self.pieces = [_Piece(split_gm.get_submodule(n), self, fed[n]) for n in names]
        for name, piece in zip(names, self.pieces, strict=True):
            # Shadow the child module: plain callables skip nn.Module's call machinery.
            split_gm.__dict__[name] = piece
        for name in splits:
            direct = _DirectSplit.of(split_gm.get_submodule(name))
            if direct is not None:
                split_gm.__dict__[name] = direct
        self.splits = Counter(splits.values())
        self.split_gm = split_gm
        return split_gm


@contextmanager
def _recompile_limit(limit: int = 4096) -> Iterator[None]:
    """Every capture of the same fn code is one more dynamo cache entry (a runner captures
    dozens of shapes); lift the limit while compiling so none silently falls back to eager."""
    config = torch._dynamo.config
    names = [n for n in ("recompile_limit", "accumulated_recompile_limit") if hasattr(config, n)]
    with config.patch(**{n: max(getattr(config, n), limit) for n in names}):
        yield


def trace_and_split(fn: Callable[[], Any], compiler: PiecewiseCompiler) -> Callable[[], Any]:
    """torch.compile `fn` with `compiler` as backend and run it once (trace, split, compile)."""
    compiled = torch.compile(fn, fullgraph=True, dynamic=False, backend=compiler)
    try:
        with _recompile_limit():
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


class PiecewiseGraph(Graph):
    def __init__(
        self, compiled: Callable[[], Any], compiler: PiecewiseCompiler, out: Any, stats: GraphStats
    ) -> None:
        super().__init__(out, stats)
        self._compiled, self._compiler = compiled, compiler
        self.pool = compiler.recorder.pool if compiler.recorder else None
        tensors = [x for x in flatten(out) if isinstance(x, torch.Tensor)]
        self._copy_out = OutputCopy(break_name(compiled), out, tensors)

    def replay(self) -> None:
        with torch.no_grad():
            self._copy_out(self._compiled(), skip_same_address=True)

    def __del__(self) -> None:
        if hasattr(self, "_compiler"):
            self._compiler.release()


class TcPiecewiseBackend(Backend):
    name = "tc_piecewise"

    def __init__(
        self,
        compile_backend: str | Callable[..., Any] = "inductor",
        split_ops: Mapping[Any, str] | None = None,
        warmup: int = 2,
    ) -> None:
        self.compile_backend = compile_backend
        self.split_ops = split_ops
        self.warmup = max(1, warmup)

    def capture(
        self, fn: Callable[[], Any], pool: GraphPool | None = None
    ) -> tuple[PiecewiseGraph, Any]:
        require_cuda(self.name)
        pool = pool if pool is not None else new_pool()
        compiler = PiecewiseCompiler(self.compile_backend, self.split_ops, SegmentRecorder(pool))
        try:
            compiled, compile_s = self._compile(fn, compiler, pool)
            out, capture_s = self._capture(compiled, compiler, pool)
        except BaseException:
            compiler.release()  # dynamo's cache keeps the compiler: let go of graphs and pool
            raise
        compiler.finalized = True
        stats = GraphStats(
            backend=self.name,
            segments=sum(p.graph is not None for p in compiler.pieces),
            breaks=dict(compiler.splits),
            capture_s=capture_s,
            compile_s=compile_s,
            pool_bytes=pool.reserved_bytes(),
        )
        return PiecewiseGraph(compiled, compiler, out, stats), out

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
            for _ in range(self.warmup - 1):
                compiled()
            pool.stream.synchronize()
        return compiled, compile_s

    def _capture(
        self, compiled: Callable[[], Any], compiler: PiecewiseCompiler, pool: GraphPool
    ) -> tuple[Any, float]:
        """One call with every piece capturing its graph (and replaying it once)."""
        compiler.preexisting = pool.live_blocks()
        compiler.capturing = True
        token = use_capture_stub.set(True)
        start = time.perf_counter()
        try:
            with paused_gc(), torch.no_grad(), torch.cuda.stream(pool.stream):
                with _recompile_limit():
                    out = compiled()
        finally:
            compiler.capturing = False
            use_capture_stub.reset(token)
        torch.cuda.current_stream().wait_stream(pool.stream)
        return out, time.perf_counter() - start
