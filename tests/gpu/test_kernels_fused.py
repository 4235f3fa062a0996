"""Compiled fused elementwise kernels on the GPU at model sizes, against the torch references."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

if torch.cuda.is_available():
    from nanograph.kernels import fused, reference


def _randn(*shape: int, dtype=torch.bfloat16, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=gen, device="cuda").to(dtype)


@pytest.mark.parametrize("hidden", [1024, 4096, 5120])
def test_rmsnorm_and_add_rmsnorm(hidden):
    x, residual = _randn(8192, hidden, seed=1), _randn(8192, hidden, seed=2)
    weight = _randn(hidden, seed=3)
    torch.testing.assert_close(fused.rmsnorm(x, weight, 1e-6), reference.rmsnorm(x, weight, 1e-6),
                               atol=2e-2, rtol=2e-2)  # fmt: skip
    res_kernel, res_ref = residual.clone(), residual.clone()
    normed, _ = fused.add_rmsnorm(x, res_kernel, weight, 1e-6)
    want, _ = reference.add_rmsnorm(x, res_ref, weight, 1e-6)
    torch.testing.assert_close(res_kernel, res_ref, atol=0, rtol=0)  # same rounding as torch
    torch.testing.assert_close(normed, want, atol=2e-2, rtol=2e-2)


def test_silu_and_mul():
    x = _randn(8192, 2 * 12288, seed=4)
    torch.testing.assert_close(fused.silu_and_mul(x), reference.silu_and_mul(x),
                               atol=2e-2, rtol=2e-2)  # fmt: skip


@pytest.mark.parametrize(("q_heads", "kv_heads", "head_dim"), [(32, 8, 128), (64, 8, 64)])
def test_rope_store_kv_with_qk_norm(q_heads, kv_heads, head_dim):
    tokens, real, num_slots = 8192, 8000, 16384
    q, k, v = (_randn(tokens, h, head_dim, seed=s) for s, h in ((5, q_heads), (6, kv_heads),
                                                                (7, kv_heads)))  # fmt: skip
    gen = torch.Generator(device="cuda").manual_seed(8)
    positions = torch.randint(0, 32768, (tokens,), generator=gen, device="cuda")
    slots = torch.randperm(num_slots, generator=gen, device="cuda")[:tokens]
    slots[real:] = -1  # padded tokens
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, head_dim, 2, device="cuda") / head_dim))
    freqs = torch.outer(torch.arange(32768, device="cuda").float(), inv_freq)
    table = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    q_norm, k_norm = _randn(head_dim, seed=9), _randn(head_dim, seed=10)
    outs = []
    for impl in (fused, reference):
        qc, kc = q.clone(), k.clone()
        k_cache = torch.zeros(num_slots, kv_heads, head_dim, dtype=q.dtype, device="cuda")
        v_cache = torch.zeros_like(k_cache)
        impl.rope_store_kv(qc, kc, v, positions, table, k_cache, v_cache, slots,
                           q_norm_weight=q_norm, k_norm_weight=k_norm)  # fmt: skip
        outs.append((qc, kc, k_cache, v_cache))
    for got, want in zip(*outs, strict=True):
        torch.testing.assert_close(got, want, atol=3e-2, rtol=2e-2)
    written = torch.zeros(num_slots, dtype=torch.bool, device="cuda")
    written[slots[:real]] = True
    assert torch.all(outs[0][2][~written] == 0), "slot -1 rows must not be written"


def test_rope_store_kv_replays_in_a_cuda_graph():
    tokens, heads, head_dim = 64, 4, 128
    q, k, v = _randn(tokens, heads, head_dim), _randn(tokens, 2, head_dim), _randn(tokens, 2, 128)
    table = torch.randn(1024, head_dim, device="cuda")
    positions = torch.zeros(tokens, dtype=torch.int64, device="cuda")
    slots = torch.full((tokens,), -1, dtype=torch.int64, device="cuda")
    num_tokens = torch.zeros(1, dtype=torch.int32, device="cuda")
    k_cache = torch.zeros(256, 2, head_dim, dtype=q.dtype, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    q_static, k_static = q.clone(), k.clone()

    def step() -> None:
        fused.rope_store_kv(q_static, k_static, v, positions, table, k_cache, v_cache, slots,
                            num_tokens=num_tokens)  # fmt: skip

    step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    # new live batch of 40 tokens written into the static inputs, then replay
    positions[:40] = torch.arange(100, 140, device="cuda")
    slots[:40] = torch.arange(40, 80, device="cuda")
    num_tokens.fill_(40)
    q_static.copy_(q)
    k_static.copy_(k)
    graph.replay()
    q_ref, k_ref = q.clone(), k.clone()
    k_cache_ref, v_cache_ref = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    reference.rope_store_kv(q_ref, k_ref, v, positions, table, k_cache_ref, v_cache_ref, slots,
                            num_tokens=num_tokens)  # fmt: skip
    torch.testing.assert_close(q_static[:40], q_ref[:40], atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(k_cache, k_cache_ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(v_cache, v_cache_ref)
