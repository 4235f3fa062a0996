"""nanograph.graph on CPU: the API, the eager backend, decorators, errors, the tc_piecewise split.

Everything here runs without CUDA (CI). CUDA-graph behaviour is tested in tests/gpu/.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from nanograph.graph import (
    GraphCaptureError,
    eager_on_graph,
    get_backend,
    new_pool,
    split_op,
    weak_alias,
)
from nanograph.graph.breaks import SPLIT_OPS
from nanograph.graph.piecewise_compiler import CaptureSession, PiecewiseCompiler, trace_and_split
from nanograph.graph.structure import OutputCopy, flatten, map_tensors

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA errors")

# Caller-owned state a split op reads when it runs (the attention-metadata pattern).
STATE = {"scale": 2.0}


@split_op("nanograph_test::scale_add")
def scale_add(x: torch.Tensor, layer: int) -> torch.Tensor:
    return x * STATE["scale"] + layer


@split_op(
    "nanograph_test::halves",
    fake=lambda x: (x.new_empty(x.shape[0], x.shape[1] // 2),) * 2,
)
def halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a, b = x.chunk(2, dim=-1)
    return a.clone(), b.clone()


@dataclasses.dataclass(frozen=True)
class Plan:
    weights: torch.Tensor
    count: int


def test_import_is_cheap_and_touches_no_cuda() -> None:
    code = (
        "import sys, torch, nanograph.graph\n"
        "assert not torch.cuda.is_initialized()\n"
        "mods = [m for m in sys.modules if m.startswith('nanograph.') and "
        "not m.startswith('nanograph.graph')]\n"
        "assert mods == [], mods\n"
    )
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root, env=env)


def test_eager_backend_replays_into_the_same_out() -> None:
    x = torch.randn(4, 8)
    w = torch.randn(8, 8)

    def fn():
        y = x @ w
        return y, {"sum": y.sum(-1)}, Plan(weights=y.softmax(-1), count=3)

    graph, out = get_backend("eager").capture(fn, pool=new_pool())
    ids = [id(t) for t in flatten(out) if isinstance(t, torch.Tensor)]
    for _ in range(5):
        x.copy_(torch.randn(4, 8))
        graph.replay()
        ref = fn()
        assert torch.equal(out[0], ref[0])
        assert torch.equal(out[1]["sum"], ref[1]["sum"])
        assert torch.equal(out[2].weights, ref[2].weights)
    assert ids == [id(t) for t in flatten(graph.out) if isinstance(t, torch.Tensor)]
    assert graph.stats.segments == 0 and graph.stats.breaks == {}
    assert repr(graph).startswith("EagerGraph(segments=0, breaks=0")


def test_eager_backend_rejects_a_changed_output() -> None:
    n = [1]
    graph, _ = get_backend("eager").capture(lambda: torch.zeros(n[0]))
    n[0] = 2
    with pytest.raises(RuntimeError, match="changed a tensor"):
        graph.replay()


def test_decorators_are_plain_calls_outside_capture() -> None:
    calls = []

    @eager_on_graph
    def plain(x):
        calls.append("plain")
        return x + 1

    @eager_on_graph(capture_stub=lambda x: calls.append("stub"))
    def stubbed(x):
        calls.append("real")
        return x * 2

    def raw(x):
        return x

    assert eager_on_graph(enable=False)(raw) is raw
    x = torch.ones(3)
    assert torch.equal(plain(x), x + 1) and torch.equal(stubbed(x), x * 2)
    assert calls == ["plain", "real"]
    assert plain.__name__ == "plain" and plain.__nanograph_break__ is not None
    STATE["scale"] = 2.0
    assert torch.equal(scale_add(x, 1), x * 2 + 1)
    assert isinstance(scale_add.op, torch._ops.OpOverload)
    assert SPLIT_OPS[scale_add.op] == "nanograph_test::scale_add"


@no_cuda
@pytest.mark.parametrize("name", ["full", "breakable", "tc_piecewise"])
def test_graph_backends_without_cuda_fail_clearly(name: str) -> None:
    with pytest.raises(GraphCaptureError, match="needs CUDA.*get_backend\\('eager'\\)"):
        get_backend(name)
    with pytest.raises(GraphCaptureError, match="needs CUDA"):
        get_backend("breakable", debug=True)


def test_bad_backend_arguments() -> None:
    with pytest.raises(ValueError, match="unknown graph backend"):
        get_backend("cudagraph")
    with pytest.raises(ValueError, match="debug=True"):
        get_backend("full", debug=True)


class Stack(torch.nn.Module):
    def __init__(self, layers: int, hidden: int = 16) -> None:
        super().__init__()
        self.linears = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, linear in enumerate(self.linears):
            x = scale_add(torch.relu(linear(self.norm(x))), i)
        return self.norm(x)


@pytest.mark.parametrize("compile_backend", ["eager", "aot_eager"])
def test_tc_piecewise_splits_at_registered_ops(compile_backend: str) -> None:
    torch.manual_seed(0)
    model, x = Stack(layers=3), torch.randn(4, 16)
    compiler = PiecewiseCompiler(compile_backend)
    with torch.no_grad():
        compiled = trace_and_split(lambda: model(x), compiler)
        # 3 split ops -> 3 eager regions and 4 pieces (before, between x2, after).
        assert compiler.splits == {"nanograph_test::scale_add": 3}
        assert len(compiler.pieces) == 4
        # Pieces after a split op take its output: that input is copied at replay.
        assert [p.split_fed for p in compiler.pieces] == [(), (0,), (0,), (0,)]
        _assert_split_ops_called_directly(compiler, 3)
        for scale in (2.0, 3.0):  # the op reads caller state at call time
            STATE["scale"] = scale
            x.copy_(torch.randn(4, 16))
            torch.testing.assert_close(compiled(), model(x))
    STATE["scale"] = 2.0


def test_tc_piecewise_split_ops_at_the_edges_and_with_tuple_outputs() -> None:
    x = torch.randn(4, 8)

    def fn():
        a, b = halves(x)  # first op of the graph
        c, d = halves(torch.cat([b, a], -1))  # two split ops back to back
        return scale_add(c + d, 0)  # last op of the graph

    compiler = PiecewiseCompiler("eager")
    with torch.no_grad():
        compiled = trace_and_split(fn, compiler)
        assert compiler.splits == {"nanograph_test::halves": 2, "nanograph_test::scale_add": 1}
        assert len(compiler.pieces) == 2  # the cat, and the add
        _assert_split_ops_called_directly(compiler, 3)
        torch.testing.assert_close(compiled(), fn())


def _assert_split_ops_called_directly(compiler: PiecewiseCompiler, count: int) -> None:
    # At replay each split op runs as a plain call of its implementation, not through the
    # dispatcher (whose bookkeeping for mutating custom ops costs more than the op's launches).
    direct = [v for v in vars(compiler.split_gm).values() if type(v).__name__ == "DirectSplit"]
    assert len(direct) == count


def test_tc_piecewise_untraceable_fn_suggests_breakable() -> None:
    x = torch.randn(4)

    def fn():
        if x.sum() > 0:  # data-dependent Python branching: no fullgraph trace
            return x * 2
        return x

    with pytest.raises(GraphCaptureError, match="fullgraph=True.*breakable"):
        trace_and_split(fn, PiecewiseCompiler("eager"))


def test_output_copy_structures_and_errors() -> None:
    Pair = namedtuple("Pair", "a b")
    captured = (Pair(torch.zeros(2), 1), {"k": torch.zeros(3)}, Plan(torch.zeros(1), 2))
    dest = [torch.empty(2), torch.empty(3), torch.empty(1)]
    rebuilt = map_tensors(lambda t: t + 1, captured)
    assert isinstance(rebuilt[0], Pair) and rebuilt[2].count == 2
    copy_out = OutputCopy("f", captured, dest)
    copy_out((Pair(torch.ones(2), 1), {"k": torch.full((3,), 2.0)}, Plan(torch.ones(1), 2)))
    assert [t.tolist() for t in dest] == [[1, 1], [2, 2, 2], [1]]
    with pytest.raises(RuntimeError, match="f changed a non-tensor output"):
        copy_out((Pair(torch.ones(2), 5), {"k": torch.ones(3)}, Plan(torch.ones(1), 2)))
    with pytest.raises(RuntimeError, match="f changed a tensor from"):
        copy_out((Pair(torch.ones(3), 1), {"k": torch.ones(3)}, Plan(torch.ones(1), 2)))
    with pytest.raises(RuntimeError, match="f changed"):
        copy_out((Pair(torch.ones(2), 1), {"other": torch.ones(3)}, Plan(torch.ones(1), 2)))


def test_weak_alias_views_memory_without_owning_it() -> None:
    base = torch.arange(12.0).reshape(3, 4)
    view = base[1:]
    alias = weak_alias(view)
    assert alias.data_ptr() == view.data_ptr() and torch.equal(alias, view)
    base.add_(1)
    assert torch.equal(alias, view)  # same memory
    ref = StorageWeakRef(base.untyped_storage())
    del base, view
    assert ref.expired()  # the alias did not keep the storage alive


class _NoCudaRecorder:
    """Stands in for SegmentRecorder on CPU: pieces 'capture' nothing (graph None), which is
    enough to check which pieces hold which capture key."""

    class _Pool:
        def address_ranges(self, preexisting):
            return self

        def owns(self, tensor):
            return False

    pool = _Pool()

    def begin(self) -> None:
        pass

    def end(self):
        return None

    def abort(self) -> None:
        pass


def test_tc_piecewise_replays_the_program_each_key_captured_with() -> None:
    """Sizes 16/12/8 of one closure over a buffer: the whole-buffer size compiles first, the
    next size compiles a more general program that dynamo then prefers for every size. Each
    key's replay must still reach the pieces that captured it: the program recorded at
    capture is called directly (no dynamo), and no piece falls back to running uncaptured."""
    from nanograph.graph.piecewise_compiler import dynamo_settings

    torch._dynamo.reset()
    torch.manual_seed(0)
    model, buffer = Stack(layers=2), torch.randn(16, 16)
    compiler = PiecewiseCompiler("eager")
    programs = {}
    with torch.no_grad():
        for key, rows in enumerate((16, 12, 8)):
            x = buffer[:rows]
            compiled = trace_and_split(lambda x=x: model(x), compiler)
            with CaptureSession(compiler, key, _NoCudaRecorder()), dynamo_settings():
                compiled()
            programs[key] = (*compiler.programs.pop(key), compiled)
        assert compiler.compiles == 2
        uncaptured = []
        for piece in compiler.pieces:
            piece._run = lambda args, run=piece._run: uncaptured.append(1) or run(args)
        for key, (program, args, _, _) in programs.items():
            with CaptureSession(compiler, key):
                program(*args)
        assert not uncaptured
        # while dynamo itself would send the whole-buffer closure to the newer program
        with CaptureSession(compiler, 0), dynamo_settings():
            programs[0][3]()
        assert uncaptured


def test_tc_piecewise_output_copies_at_direct_replay() -> None:
    from nanograph.graph.piecewise import _output_copies

    given, produced = torch.zeros(4), torch.ones(4)
    # graph outputs: refreshed from the program's output i at replay (copied if it moved)
    copies = _output_copies((produced, given), (given, produced), (given,))
    assert [(i, leaf is want) for (i, leaf), want in zip(copies, (produced, given))] == [
        (1, True),
        (0, True),
    ]
    # a buffer fn was given and wrote into (the runner's `out`): nothing to copy
    assert _output_copies(given[:2], (), (given, 3)) == []
    with pytest.raises(GraphCaptureError, match="neither a graph output"):
        _output_copies(torch.zeros(2), (produced,), (given,))
