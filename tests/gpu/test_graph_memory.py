"""Graph memory: breakable vs full pool size, memory returned on deletion, flat over replays."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F

from nanograph.graph import eager_on_graph, get_backend, new_pool, split_op

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

HIDDEN, HEADS, LAYERS = 1024, 8, 8


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    rows = q.shape[0]
    q, k, v = (t.view(rows, HEADS, -1).transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.squeeze(0).transpose(0, 1).reshape(rows, -1)


attention_break = eager_on_graph(_attention)


@split_op("nanograph_gpu_memory_test::attention")
def attention_split(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return _attention(q, k, v)


class Layer(torch.nn.Module):
    def __init__(self, attend) -> None:
        super().__init__()
        self.norm = torch.nn.RMSNorm(HIDDEN)
        self.qkv = torch.nn.Linear(HIDDEN, 3 * HIDDEN)
        self.o = torch.nn.Linear(HIDDEN, HIDDEN)
        self.up = torch.nn.Linear(HIDDEN, 4 * HIDDEN)
        self.down = torch.nn.Linear(4 * HIDDEN, HIDDEN)
        self.attend = attend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.o(self.attend(*self.qkv(self.norm(x)).chunk(3, dim=-1)))
        return x + self.down(F.gelu(self.up(x)))


def build(rows: int, attend=attention_break):
    torch.manual_seed(0)
    layers = torch.nn.Sequential(*(Layer(attend) for _ in range(LAYERS)))
    model = layers.cuda().requires_grad_(False)
    x = torch.randn(rows, HIDDEN, device="cuda")
    return x, lambda: model(x)


def settle() -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def test_breakable_pool_is_within_125_percent_of_full() -> None:
    _, fn = build(rows=2048)
    full_pool, breakable_pool = new_pool(), new_pool()
    get_backend("full").capture(fn, pool=full_pool)
    graph, _ = get_backend("breakable").capture(fn, pool=breakable_pool)
    assert graph.stats.breaks == {"_attention": LAYERS}  # one break per layer
    full_bytes, breakable_bytes = full_pool.reserved_bytes(), breakable_pool.reserved_bytes()
    assert 0 < breakable_bytes <= 1.25 * full_bytes, (breakable_bytes, full_bytes)


@pytest.mark.parametrize("names", [("full", "breakable"), ("tc_piecewise",)])
def test_deleting_graphs_returns_memory(names: tuple[str, ...]) -> None:
    attend = attention_split if "tc_piecewise" in names else attention_break
    _, fn = build(rows=256, attend=attend)
    with torch.no_grad():
        fn()  # cuBLAS workspaces and other lazy state exist before the baseline
    for name in names:
        get_backend(name).capture(fn)
    settle()
    reserved, allocated = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    pool = new_pool()
    graphs = [get_backend(name).capture(fn, pool=pool)[0] for name in names]
    for graph in graphs:
        graph.replay()
    assert pool.reserved_bytes() > 0
    del graphs, graph, pool  # `graph` too: a loop variable would keep the last one alive
    settle()
    assert torch.cuda.memory_allocated() == allocated
    assert torch.cuda.memory_reserved() == reserved


def test_thousand_replays_do_not_grow_memory() -> None:
    x, fn = build(rows=64)
    pool = new_pool()
    backends = [get_backend("full"), get_backend("breakable"), get_backend("breakable", debug=True)]
    graphs = [backend.capture(fn, pool=pool)[0] for backend in backends]
    for graph in graphs:
        graph.replay()
    torch.cuda.synchronize()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    for _ in range(1000):
        for graph in graphs:
            graph.replay()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == allocated
    assert torch.cuda.memory_reserved() == reserved
