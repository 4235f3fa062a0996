"""torch-native attention against the float64 reference, in every causality case it takes:
a prefill without prefix (SDPA's is_causal), a chunk after a cached prefix (a mask), a single
query (no mask), and zero-length sentinel slots, in one mixed batch over scattered pages; with
and without a sliding window and attention sinks."""

from __future__ import annotations

import pytest
import torch

from nanograph.attention.base import AttentionMetadata
from nanograph.attention.torch_native import TorchNativeAttention
from nanograph.kernels import reference
from nanograph.kernels.testing import make_paged_batch


@pytest.mark.parametrize("heads", [(4, 4), (6, 2)])  # MHA and GQA
@pytest.mark.parametrize("window, with_sinks", [(0, False), (6, False), (0, True), (6, True)])
def test_torch_native_matches_float64_reference(heads, window, with_sinks):
    num_q_heads, num_kv_heads = heads
    # prefill of 13 (no prefix), 5 after 9 cached, one decode token after 20, one 1-token prompt
    context, new = [0, 9, 20, 0], [13, 5, 1, 1]
    b = make_paged_batch(context, new, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                         head_dim=16, page_size=4, num_sentinels=2, padded_tokens=24)  # fmt: skip
    seq_lens = [c + n for c, n in zip(context, new)] + [0, 0]
    meta = AttentionMetadata(
        page_table=b.page_table, seq_lens=b.seq_lens, query_lens=b.query_lens,
        query_start_loc=b.query_start_loc, slot_mapping=b.slot_mapping, num_tokens=b.num_tokens,
        page_size=b.page_size, max_query_len=b.max_query_len, seq_lens_cpu=seq_lens,
        query_lens_cpu=[*new, 0, 0],
    )  # fmt: skip
    scale = 16**-0.5
    sinks = torch.randn(num_q_heads, generator=torch.Generator().manual_seed(3))
    sinks = sinks if with_sinks else None
    out = torch.zeros_like(b.q)
    TorchNativeAttention().forward(b.q, b.k_cache, b.v_cache, meta, scale, out, window, sinks)
    ref = reference.paged_attention(
        b.q.double(),
        b.k_cache.double(),
        b.v_cache.double(),
        *b.metadata(),
        b.page_size,
        scale,
        sliding_window=window,
        sinks=None if sinks is None else sinks.double(),
    )
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    assert out[sum(new) :].abs().sum() == 0  # padded rows untouched
