"""`tc_piecewise`: torch.compile(fullgraph=True) over fn, split at split ops, a graph per piece.

Invariants:
- A backend instance compiles each function once for every size it is captured at: dynamo
  traces with dynamic shapes (sizes 0 and 1 aside, which dynamo specializes: one more compile),
  the FX graph is split so that every split-op call sits alone in its own submodule, and each
  other submodule (a "piece") is compiled with `compile_backend` for symbolic sizes, from the
  fake inputs the split graph propagates. Captures of closures of the same function at other
  sizes (a runner's shapes) reuse that compile and only capture.
- Every capture gets a key; each piece keeps one CUDA graph, its split-fed inputs and its
  outputs per key, captured in the capture's pool. The split program dynamo called at capture
  is recorded with its arguments; replay sets the key and calls that program directly, so each
  piece replays the graph of the shape being replayed. (Through dynamo, a newer, more general
  compile whose guards also pass would run pieces that never captured this key.)
- Split ops run eagerly on every call, between pieces, as plain calls of their Python
  implementation (the dispatcher's bookkeeping for a custom op that mutates arguments cost
  ~100 us a call on the dev CPU). A piece input that comes from a split op has a fresh address
  each call: it is copied into the tensor the piece was captured with.
- Piece outputs are held by weak alias when this capture allocated them (capture order = replay
  order, as in breakable.py); the graph keeps `out` alive itself.
- Replay skips dynamo (no guards): like any CUDA graph it replays what was captured, and fn's
  Python side effects outside the traced graph are not repeated. What remains per forward is
  the split program's Python, the piece replays and the split ops. fn's output tensors must be
  graph outputs or live in buffers fn was given (checked at capture).
"""

from __future__ import annotations

import itertools
import operator
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch.fx.passes.split_module import split_module

from nanograph.graph.base import Backend, Graph, GraphCaptureError, GraphStats
from nanograph.graph.breaks import SPLIT_IMPLS, SPLIT_OPS, use_capture_stub
from nanograph.graph.capture import SegmentRecorder, capture_error, paused_gc
from nanograph.graph.factory import require_cuda
from nanograph.graph.memory import GraphPool, new_pool, weak_alias
from nanograph.graph.structure import flatten, map_tensors

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
        key = self.owner.active
        capture = self.captures.get(key) if key is not None else None
        if capture is not None:
            for i in self.split_fed:
                if args[i].data_ptr() != capture.static[i].data_ptr():
                    capture.static[i].copy_(args[i])
            if capture.graph is not None:
                capture.graph.replay()
            return capture.outputs
        if not self.owner.capturing:
            return self._run(args)
        recorder = self.owner.recorder
        assert recorder is not None and key is not None
        recorder.begin()
        try:
            out = self._run(args)
        except Exception as exc:
            recorder.abort()
            raise capture_error("tc_piecewise", exc, _HINT) from exc
        graph = recorder.end()
        owned = recorder.pool.address_ranges(self.owner.preexisting)
        outputs = map_tensors(lambda t: weak_alias(t) if owned.owns(t) else t, out)
        self.captures[key] = _Capture(graph, {i: args[i] for i in self.split_fed}, outputs)
        return out

    def _run(self, args: tuple) -> Any:
        # Backends return what dynamo itself calls unboxed (inductor's `_boxed_call` attribute
        # describes an inner function and is misleading here).
        assert self.compiled is not None, "piece used after release"
        out = self.compiled(*args)
        return out[0] if self.single else out


def _piece_inputs(split_gm: torch.fx.GraphModule, names: list[str], example_inputs: list) -> dict:
    """Fake (symbolic-size) inputs of each piece: the split graph run under dynamo's fake mode."""
    fake_mode = torch._guards.detect_fake_mode()
    if fake_mode is None:  # called outside dynamo (tests calling the compiler directly)
        fake_mode = torch._subclasses.FakeTensorMode(allow_non_fake_inputs=True)
    # dynamo hands real tensors; its fake mode maps them back to the fakes it traced with
    fakes = [fake_mode.from_tensor(x) if isinstance(x, torch.Tensor) else x
             for x in example_inputs]  # fmt: skip
    wanted, seen = set(names), {}

    class Recorder(torch.fx.Interpreter):
        def call_module(self, target: str, args: tuple, kwargs: dict) -> Any:
            if target in wanted:
                seen[target] = args
            return super().call_module(target, args, kwargs)

    with fake_mode:
        Recorder(split_gm).run(*fakes)
    return seen


class PiecewiseCompiler:
    """The torch.compile backend: split dynamo's graph, compile pieces, capture when asked.

    One instance serves every capture of a backend; `active` names the capture key the pieces
    capture into or replay (None: run the compiled code)."""

    def __init__(
        self,
        compile_backend: str | Callable[..., Any] = "inductor",
        split_ops: Mapping[Any, str] | None = None,
    ) -> None:
        self.compile_backend = compile_backend
        self.split_ops = dict(SPLIT_OPS if split_ops is None else split_ops)
        self.recorder: SegmentRecorder | None = None  # the capture in progress
        self.capturing = False
        self.active: int | None = None
        # per capture key: the split program dynamo called, its arguments and its outputs
        self.programs: dict[int, tuple[torch.fx.GraphModule, tuple, Any]] = {}
        self.preexisting: frozenset[int] = frozenset()
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
            self.recorder = None  # it holds the pool
        else:
            self.programs.pop(key, None)

    def lookup_backend(self) -> Callable[..., Any]:
        if callable(self.compile_backend):
            return self.compile_backend
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend(self.compile_backend)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        split_gm, names, splits = split_graph(gm, self.split_ops)
        fed = _split_fed_inputs(split_gm, splits)
        inputs = _piece_inputs(split_gm, names, example_inputs)
        pieces = [_Piece(split_gm.get_submodule(n), self, fed[n], inputs[n]) for n in names]
        for name, piece in zip(names, pieces, strict=True):
            # Shadow the child module: plain callables skip nn.Module's call machinery.
            split_gm.__dict__[name] = piece
        for name in splits:
            direct = _DirectSplit.of(split_gm.get_submodule(name))
            if direct is not None:
                split_gm.__dict__[name] = direct
        self.pieces += pieces
        self.splits = Counter(splits.values())
        self.split_gm = split_gm
        self.compiles += 1

        def program(*args: Any) -> Any:
            out = split_gm(*args)
            if self.capturing:  # replay calls this program directly, without dynamo
                self.programs[self.active] = (split_gm, args, out)
            return out

        return program


@contextmanager
def _dynamo_settings(limit: int = 256) -> Iterator[None]:
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
        with _dynamo_settings():
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
        self._copies = _output_copies(out, flat, self._args)

    def replay(self) -> None:
        compiler = self._compiler
        compiler.active = self._key
        try:
            with torch.no_grad():
                flat = self._program(*self._args)
        finally:
            compiler.active = None
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
        warmup: int = 2,
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
        compiler.recorder = SegmentRecorder(pool)
        compile_before = compiler.piece_compile_s
        try:
            compiled, compile_s = self._compile(fn, compiler, pool)
            out, capture_s = self._capture(compiled, compiler, pool, key)
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
        finally:
            compiler.recorder = None  # it holds the pool
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
            with _dynamo_settings():
                for _ in range(self.warmup - 1):
                    compiled()
            pool.stream.synchronize()
        return compiled, compile_s

    def _capture(
        self, compiled: Callable[[], Any], compiler: PiecewiseCompiler, pool: GraphPool, key: int
    ) -> tuple[Any, float]:
        """One call with every piece capturing its graph under `key` (and replaying it once)."""
        compiler.preexisting = pool.live_blocks()
        compiler.capturing, compiler.active = True, key
        token = use_capture_stub.set(True)
        start = time.perf_counter()
        try:
            with paused_gc(), torch.no_grad(), torch.cuda.stream(pool.stream):
                with _dynamo_settings():
                    out = compiled()
        finally:
            compiler.capturing, compiler.active = False, None
            use_capture_stub.reset(token)
        torch.cuda.current_stream().wait_stream(pool.stream)
        return out, time.perf_counter() - start
