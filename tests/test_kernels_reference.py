"""The torch references of ``nanograph.kernels.reference`` against independent formulations.

The references are the ground truth of the kernel tests and the CPU path of the model, so they
are themselves checked against the textbook expressions (dense SDPA, Hugging Face formulas).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nanograph.kernels import reference
from nanograph.kernels.testing import make_paged_batch


def _contiguous_kv(batch, request: int) -> tuple[torch.Tensor, torch.Tensor]:
    seq_len = int(batch.seq_lens[request])
    pos = torch.arange(seq_len)
    slots = batch.page_table[request, pos // batch.page_size].long() * batch.page_size
    slots += pos % batch.page_size
    return batch.k_cache[slots], batch.v_cache[slots]


def test_paged_attention_matches_dense_sdpa_per_request():
    batch = make_paged_batch([0, 9, 4], [6, 3, 1], num_q_heads=4, num_kv_heads=2, head_dim=8,
                             page_size=4, dtype=torch.float64, num_sentinels=1,
                             padded_tokens=12)  # fmt: skip
    out = reference.paged_attention(
        batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), batch.page_size, 0.5
    )
    for r in range(3):
        q_len, seq_len = int(batch.query_lens[r]), int(batch.seq_lens[r])
        start = int(batch.query_start_loc[r])
        k, v = _contiguous_kv(batch, r)
        q = batch.q[start : start + q_len].transpose(0, 1)  # [Hq, q_len, D]
        mask = torch.arange(seq_len)[None, :] <= torch.arange(seq_len - q_len, seq_len)[:, None]
        want = F.scaled_dot_product_attention(
            q, k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=0.5, enable_gqa=True
        )
        torch.testing.assert_close(out[start : start + q_len], want.transpose(0, 1))
    assert torch.all(out[10:] == 0)


def test_sinks_equal_an_extra_zero_value_key():
    # gpt-oss: a per-head sink logit joins the softmax and carries no value. Equivalent to one
    # extra key whose score is the sink and whose value is zero.
    batch = make_paged_batch([5], [3], num_q_heads=2, num_kv_heads=1, head_dim=8, page_size=4,
                             dtype=torch.float64)  # fmt: skip
    sinks = torch.tensor([0.7, -1.3], dtype=torch.float64)
    out = reference.paged_attention(
        batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), 4, 1.0, sinks=sinks
    )
    k, v = _contiguous_kv(batch, 0)
    scores = torch.einsum("qhd,kd->hqk", batch.q, k[:, 0])
    scores = scores.masked_fill(torch.ones(3, 8, dtype=torch.bool).triu(6), float("-inf"))
    scores = torch.cat([scores, sinks[:, None, None].expand(2, 3, 1)], dim=-1)
    values = torch.cat([v[:, 0], torch.zeros(1, 8, dtype=torch.float64)])
    want = torch.einsum("hqk,kd->qhd", scores.softmax(-1), values)
    torch.testing.assert_close(out, want)


def test_sliding_window_and_softcap():
    batch = make_paged_batch([10], [2], num_q_heads=1, num_kv_heads=1, head_dim=8, page_size=4,
                             dtype=torch.float64)  # fmt: skip
    out = reference.paged_attention(
        batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), 4, 1.0,
        sliding_window=3, softcap=2.0,
    )  # fmt: skip
    k, v = _contiguous_kv(batch, 0)
    for i, pos in enumerate([10, 11]):
        keys = torch.arange(pos - 2, pos + 1)  # the window of 3 ending at the query itself
        s = 2.0 * torch.tanh(k[keys, 0] @ batch.q[i, 0] / 2.0)
        torch.testing.assert_close(out[i, 0], s.softmax(0) @ v[keys, 0])


def test_elementwise_references_match_hugging_face_formulas():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 32, generator=gen, dtype=torch.float64)
    weight = torch.randn(32, generator=gen, dtype=torch.float64)
    hf = weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(reference.rmsnorm(x, weight, 1e-6), hf)
    gate_up = torch.randn(4, 64, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(
        reference.silu_and_mul(gate_up), F.silu(gate_up[:, :32]) * gate_up[:, 32:]
    )
    residual = torch.randn(4, 32, generator=gen, dtype=torch.float64)
    expected_residual = residual + x
    normed, returned = reference.add_rmsnorm(x, residual, weight, 1e-6)
    assert returned is residual
    torch.testing.assert_close(residual, expected_residual)
    torch.testing.assert_close(normed, reference.rmsnorm(expected_residual, weight, 1e-6))
