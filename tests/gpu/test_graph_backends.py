"""Each graph backend against eager on a toy transformer stack, and the breakable features.

A stack of layers (RMSNorm, linear, rotary, an attention-like op, MLP) with fresh random static
inputs on every replay; bitwise equality wherever replay runs the same kernels as eager (full,
breakable, debug), a tolerance for tc_piecewise (inductor generates its own kernels).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef

from nanograph.graph import GraphCaptureError, eager_on_graph, get_backend, new_pool, split_op

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

HIDDEN, HEADS, LAYERS, ROWS, REPLAYS = 64, 4, 4, 48, 20
HEAD_DIM = HIDDEN // HEADS


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """[rows, heads, head_dim] x3 -> [rows, heads * head_dim], causal over rows."""
    q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [1, heads, rows, dim]
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.squeeze(0).transpose(0, 1).reshape(q.shape[2], -1)


attend_break = eager_on_graph(causal_attention)


@eager_on_graph
def bump(t: torch.Tensor) -> torch.Tensor:
    return t + 1


@split_op(
    "nanograph_gpu_test::attend",
    fake=lambda q, k, v: q.new_empty(q.shape[0], q.shape[1] * q.shape[2]),
)
def attend_split(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return causal_attention(q, k, v)


@split_op("nanograph_gpu_test::attend_into", fake=lambda q, k, v, out: None, mutates_args=("out",))
def attend_into(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(causal_attention(q, k, v))


def attend_via_out(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The engine's pattern: the graph allocates the output, the split op only writes it."""
    out = torch.empty(q.shape[0], q.shape[1] * q.shape[2], device=q.device, dtype=q.dtype)
    attend_into(q, k, v, out)
    return out


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Layer(torch.nn.Module):
    def __init__(self, attend) -> None:
        super().__init__()
        self.norm1, self.norm2 = torch.nn.RMSNorm(HIDDEN), torch.nn.RMSNorm(HIDDEN)
        self.qkv, self.o = torch.nn.Linear(HIDDEN, 3 * HIDDEN), torch.nn.Linear(HIDDEN, HIDDEN)
        self.up, self.down = (
            torch.nn.Linear(HIDDEN, 4 * HIDDEN),
            torch.nn.Linear(4 * HIDDEN, HIDDEN),
        )
        self.attend = attend

    def forward(self, x, cos, sin):
        q, k, v = self.qkv(self.norm1(x)).view(x.shape[0], 3, HEADS, HEAD_DIM).unbind(1)
        x = x + self.o(self.attend(rotary(q, cos, sin), rotary(k, cos, sin), v))
        return x + self.down(F.silu(self.up(self.norm2(x))))


class Stack(torch.nn.Module):
    def __init__(self, attend, layers: int = LAYERS) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer(attend) for _ in range(layers))
        self.norm = torch.nn.RMSNorm(HIDDEN)

    def forward(self, x, cos, sin):
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


class Inputs:
    """Static inputs owned by the caller, refilled in place before every replay."""

    def __init__(self, rows: int = ROWS) -> None:
        self.x = torch.empty(rows, HIDDEN, device="cuda")
        self.cos = torch.empty(rows, 1, HEAD_DIM // 2, device="cuda")
        self.sin = torch.empty_like(self.cos)
        self.refill()

    def refill(self) -> None:
        self.x.copy_(torch.randn_like(self.x))
        angles = torch.rand_like(self.cos) * 6.28
        self.cos.copy_(angles.cos())
        self.sin.copy_(angles.sin())


def make(attend, rows: int = ROWS):
    torch.manual_seed(0)
    model = Stack(attend).cuda().requires_grad_(False)
    inputs = Inputs(rows)
    return model, inputs, lambda: model(inputs.x, inputs.cos, inputs.sin)


def check_replays(graph, out, fn, inputs, exact: bool = True) -> None:
    for _ in range(REPLAYS):
        inputs.refill()
        graph.replay()
        with torch.no_grad():
            ref = fn()
        if exact:
            assert torch.equal(out, ref)
        else:
            torch.testing.assert_close(out, ref, rtol=2e-3, atol=2e-3)


CASES = {
    "full": ("full", {}, attend_break, 1, {}),
    "breakable": ("breakable", {}, attend_break, LAYERS + 1, {"causal_attention": LAYERS}),
    "breakable_split_op": ("breakable", {}, attend_split, LAYERS + 1, {"attend_split": LAYERS}),
    "breakable_split_op_into": (
        "breakable",
        {},
        attend_via_out,
        LAYERS + 1,
        {"attend_into": LAYERS},
    ),
    "debug": ("breakable", {"debug": True}, attend_break, 0, None),  # fn itself is the break
}


@pytest.mark.parametrize("case", list(CASES))
def test_backend_matches_eager_bitwise(case: str) -> None:
    name, options, attend, segments, breaks = CASES[case]
    model, inputs, fn = make(attend)
    graph, out = get_backend(name, **options).capture(fn, pool=new_pool())
    breaks = {fn.__qualname__: 1} if breaks is None else breaks  # named by qualified name
    assert graph.stats.segments == segments and graph.stats.breaks == breaks, repr(graph)
    assert f"segments={segments}" in repr(graph)
    check_replays(graph, out, fn, inputs)


@pytest.mark.parametrize(
    "attend, op",
    [
        (attend_split, "nanograph_gpu_test::attend"),
        (attend_via_out, "nanograph_gpu_test::attend_into"),
    ],
)
def test_tc_piecewise_matches_eager(attend, op: str) -> None:
    model, inputs, fn = make(attend)
    graph, out = get_backend("tc_piecewise").capture(fn, pool=new_pool())
    stats = graph.stats
    assert stats.breaks == {op: LAYERS}
    assert stats.segments == LAYERS + 1  # before, between and after the attention ops
    assert stats.compile_s > 0 and stats.capture_s > 0 and stats.pool_bytes > 0
    check_replays(graph, out, fn, inputs, exact=False)


def test_tc_piecewise_compiles_once_for_every_size() -> None:
    """A runner's pattern: one backend captures closures over views of one static buffer at
    several sizes, largest first. Compiles: the full-buffer size, then one for every smaller
    size (dynamo relates a whole-buffer view to its base); each size replays its own graphs."""
    torch._dynamo.reset()
    model, inputs, _ = make(attend_via_out)
    backend, pool = get_backend("tc_piecewise"), new_pool()
    captured = {}
    for rows in (ROWS, 32, 16):
        x, cos, sin = inputs.x[:rows], inputs.cos[:rows], inputs.sin[:rows]

        def fn(x=x, cos=cos, sin=sin):
            return model(x, cos, sin)

        graph, out = backend.capture(fn, pool=pool)
        captured[rows] = graph, out, fn
    assert backend.compiler.compiles == 2
    assert captured[16][0].stats.compile_s == 0  # reused the second compile
    for _ in range(3):
        for graph, out, fn in captured.values():
            inputs.refill()
            graph.replay()
            with torch.no_grad():
                torch.testing.assert_close(out, fn(), rtol=2e-3, atol=2e-3)


def test_tc_piecewise_untraceable_fn_suggests_breakable() -> None:
    x = torch.randn(8, device="cuda")

    def fn():
        return x * 2 if x.sum() > 0 else x

    with pytest.raises(GraphCaptureError, match="fullgraph=True.*breakable"):
        get_backend("tc_piecewise").capture(fn)


@dataclasses.dataclass
class Plan:
    scale: torch.Tensor
    note: str


@eager_on_graph
def plan_batch(lengths: torch.Tensor, h: torch.Tensor):
    total = int(lengths.sum().item())  # host sync
    live_rows = torch.nonzero(lengths).flatten()  # data-dependent shape
    positive = h[h > 0]  # boolean mask
    live = torch.zeros(lengths.shape, device=h.device)
    live[live_rows] = 1.0
    stats = {"total": torch.full((1,), float(total), device=h.device)}
    stats["positive"] = positive.sum().reshape(1)
    return (live, stats), Plan(scale=live * 2 + 1, note="fixed")


def test_breaks_sync_use_masks_and_return_structures() -> None:
    lengths = torch.zeros(ROWS, dtype=torch.int64, device="cuda")
    h0 = torch.empty(ROWS, HIDDEN, device="cuda")

    def refill():
        lengths.copy_(torch.randint(0, 3, (ROWS,)))
        h0.copy_(torch.randn_like(h0))

    def fn():
        h = torch.tanh(h0) * 3
        (live, stats), plan = plan_batch(lengths, h)
        y = h * live[:, None] + stats["total"] + stats["positive"] * plan.scale[:, None]
        return {"y": y, "live": live}, (plan.scale + 1, plan)

    refill()
    graph, out = get_backend("breakable").capture(fn)
    assert graph.stats.segments == 2 and graph.stats.breaks == {"plan_batch": 1}
    for _ in range(REPLAYS):
        refill()
        graph.replay()
        ref = fn()
        assert torch.equal(out[0]["y"], ref[0]["y"]) and torch.equal(out[0]["live"], ref[0]["live"])
        assert torch.equal(out[1][0], ref[1][0]) and torch.equal(out[1][1].scale, ref[1][1].scale)


def test_changed_non_tensor_output_names_the_function() -> None:
    step = [0]

    @eager_on_graph
    def drifting(x):
        step[0] += 1
        return x + 1, step[0]

    x = torch.ones(4, device="cuda")
    graph, _ = get_backend("breakable").capture(lambda: drifting(x)[0] * 2)
    with pytest.raises(RuntimeError, match="drifting changed a non-tensor output"):
        graph.replay()


def test_break_inputs_and_boundaries_are_not_kept_alive() -> None:
    x = torch.randn(ROWS, HIDDEN, device="cuda")
    w = torch.randn(HIDDEN, HIDDEN, device="cuda") / HIDDEN**0.5
    seen: list[StorageWeakRef] = []

    @eager_on_graph
    def probe(t: torch.Tensor, static: torch.Tensor) -> torch.Tensor:
        seen.append(StorageWeakRef(t.untyped_storage()))
        return t * static.mean()

    def fn():
        b = probe(x @ w, x)  # input made by a segment: pool-owned
        d = probe(torch.relu(b) @ w, x)  # b is the previous boundary buffer
        return probe(torch.tanh(d) * 2 + b, x).sum(0)

    graph, out = get_backend("breakable", warmup=1).capture(fn)
    capture_refs = seen[3:6]
    assert len(capture_refs) == 3 and all(ref.expired() for ref in capture_refs)
    for _ in range(REPLAYS):
        x.copy_(torch.randn_like(x))
        graph.replay()
        assert torch.equal(out, fn())


def test_side_streams_inside_and_across_segments() -> None:
    x = torch.randn(ROWS, HIDDEN, device="cuda")
    w = torch.randn(HIDDEN, HIDDEN, device="cuda") / HIDDEN**0.5
    side = torch.cuda.Stream()

    def within():  # forked and joined inside one segment
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            b = torch.sigmoid(x) * 3
        main.wait_stream(side)
        return bump(x @ w) + b

    def across():  # forked before a break, joined after it
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            b = torch.sigmoid(x) * 3
        a = bump(x @ w)
        with torch.cuda.stream(side):
            b = b * 2
        main.wait_stream(side)
        return a + b

    pool = new_pool()
    for fn in (within, across):
        graph, out = get_backend("breakable", side_streams=[side]).capture(fn, pool=pool)
        for _ in range(REPLAYS):
            x.copy_(torch.randn_like(x))
            graph.replay()
            assert torch.equal(out, fn())


def test_capture_stub_runs_at_capture_and_the_real_function_at_replay() -> None:
    calls = {"real": 0, "stub": 0}
    x = torch.randn(ROWS, device="cuda")

    def stub(t):
        calls["stub"] += 1
        return torch.empty_like(t)

    @eager_on_graph(capture_stub=stub)
    def expensive(t):
        calls["real"] += 1
        return t.cumsum(0)

    def fn():
        return expensive(x * 2) + 1

    graph, out = get_backend("breakable", warmup=2).capture(fn)
    assert calls == {"real": 2, "stub": 1}  # two warm-up runs, then the stub at capture
    for _ in range(REPLAYS):
        x.copy_(torch.randn_like(x))
        graph.replay()
        assert torch.equal(out, fn())
    assert calls == {"real": 2 + 2 * REPLAYS, "stub": 1}


def test_two_captures_share_one_pool() -> None:
    model, large, fn_large = make(attend_break, rows=4 * ROWS)
    small = Inputs(ROWS)

    def fn_small():
        return model(small.x, small.cos, small.sin)

    pool = new_pool()
    g_large, out_large = get_backend("breakable").capture(fn_large, pool=pool)
    after_large = pool.reserved_bytes()
    g_small, out_small = get_backend("full").capture(fn_small, pool=pool)
    alone = new_pool()
    get_backend("full").capture(fn_small, pool=alone)
    assert pool.reserved_bytes() - after_large <= alone.reserved_bytes()
    for _ in range(REPLAYS // 2):  # read each out right after its own replay
        large.refill()
        g_large.replay()
        assert torch.equal(out_large, fn_large())
        small.refill()
        g_small.replay()
        assert torch.equal(out_small, fn_small())


def test_pool_is_reusable_after_all_its_graphs_are_deleted() -> None:
    x = torch.randn(ROWS, device="cuda")
    pool = new_pool()
    for scale in (2.0, 3.0, 4.0):
        graph, out = get_backend("breakable").capture(lambda s=scale: bump(x * s) * 2, pool=pool)
        graph.replay()
        assert torch.equal(out, (x * scale + 1) * 2)
        del graph, out


def test_debug_mode_runs_uncapturable_code_through_the_replay_path() -> None:
    x = torch.randn(ROWS, device="cuda")

    def fn():
        return x * x.abs().max().item()  # a host sync outside any break

    graph, out = get_backend("breakable", debug=True).capture(fn)
    assert graph.stats.segments == 0 and graph.stats.breaks == {fn.__qualname__: 1}
    for _ in range(REPLAYS):
        x.copy_(torch.randn_like(x))
        graph.replay()
        assert torch.equal(out, fn())


def _item(h):
    return h + h.sum().item()


def _nonzero(h):
    return h[torch.nonzero(h > 0)[:1, 0]]


def _mask(h):
    return h[h > 0][:1]


@pytest.mark.parametrize("backend", ["full", "breakable"])
@pytest.mark.parametrize("op", [_item, _nonzero, _mask])
def test_uncapturable_op_fails_cleanly_and_the_pool_stays_usable(backend: str, op) -> None:
    x = torch.ones(16, device="cuda")
    pool = new_pool()
    with pytest.raises(GraphCaptureError) as info:
        get_backend(backend).capture(lambda: op(x * 2), pool=pool)
    message = str(info.value)
    assert "test_graph_backends.py" in message and "eager_on_graph" in message, message
    assert op.__name__ in message  # the failing call site is named
    del info
    stream = pool.stream
    with torch.cuda.stream(stream):
        assert not torch.cuda.is_current_stream_capturing()
    graph, out = get_backend(backend).capture(lambda: x * 2 + 1, pool=pool)
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert torch.equal(out, x * 2 + 1)


def test_unjoined_side_stream_fails_cleanly() -> None:
    x = torch.randn(16, device="cuda")
    lonely = torch.cuda.Stream()

    def fn():
        lonely.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(lonely):
            y = x * 2
        return bump(y) + 1

    pool = new_pool()
    with pytest.raises(GraphCaptureError, match="side_streams"):
        get_backend("breakable").capture(fn, pool=pool)
    graph, out = get_backend("full").capture(lambda: x * 3, pool=pool)
    graph.replay()
    assert torch.equal(out, x * 3)
