"""Host-planned attention in plain PyTorch: gathers each request's paged KV and runs SDPA.

Works on CPU and GPU and is the reference for the Triton backend. It loops over requests with
Python ints taken from the metadata's host copies, so it is not graph-safe: it works where the
attention split op runs eagerly (eager, breakable, tc_piecewise); full graphs refuse it.

SDPA gets 4-D ``[1, heads, len, dim]`` inputs (3-D ones send CPU to the unfused math kernel)
and the cheapest causality it can take: none for one query (it sees every key), ``is_causal``
when the request has no cached prefix (query i sits at position i), and a boolean mask only
for a chunk after a cached prefix (SDPA's ``is_causal`` aligns to the top-left corner).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nanograph.attention.base import AttentionBackend, AttentionMetadata


class TorchNativeAttention(AttentionBackend):
    name = "torch_native"
    graph_safe = False

    def forward(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor,
    ) -> None:
        page_size = meta.page_size
        start = 0
        for slot, (seq_len, q_len) in enumerate(zip(meta.seq_lens_cpu, meta.query_lens_cpu)):
            if q_len == 0:
                continue
            positions = torch.arange(seq_len, device=q.device)
            pages = meta.page_table[slot, positions // page_size].to(torch.long)
            cache_slots = pages * page_size + positions % page_size
            k = k_cache[cache_slots].transpose(0, 1)[None]  # [1, Hkv, L, D]
            v = v_cache[cache_slots].transpose(0, 1)[None]
            qr = q[start : start + q_len].transpose(0, 1)[None]  # [1, Hq, q_len, D]
            mask, causal = None, False
            if q_len == seq_len:
                causal = q_len > 1
            elif q_len > 1:
                # query i sits at position seq_len - q_len + i and sees keys at positions <= it
                q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
                mask = positions[None, :] <= q_pos[:, None]
            o = F.scaled_dot_product_attention(
                qr, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True
            )
            out[start : start + q_len] = o[0].transpose(0, 1)
            start += q_len
