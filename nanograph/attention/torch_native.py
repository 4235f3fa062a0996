"""Host-planned attention in plain PyTorch: gathers each request's paged KV and runs SDPA.

Works on CPU and GPU and is the reference for the Triton backend (sliding windows and attention
sinks included: sinks take an explicit softmax, as SDPA has none). It loops over requests with
Python ints taken from the metadata's host copies, so it is not graph-safe: it works where the
attention split op runs eagerly (eager, breakable, tc_piecewise); full graphs refuse it.
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
        sliding_window: int = 0,
        sinks: torch.Tensor | None = None,
    ) -> None:
        page_size = meta.page_size
        start = 0
        for slot, (seq_len, q_len) in enumerate(zip(meta.seq_lens_cpu, meta.query_lens_cpu)):
            if q_len == 0:
                continue
            positions = torch.arange(seq_len, device=q.device)
            pages = meta.page_table[slot, positions // page_size].to(torch.long)
            cache_slots = pages * page_size + positions % page_size
            k = k_cache[cache_slots].transpose(0, 1)  # [Hkv, L, D]
            v = v_cache[cache_slots].transpose(0, 1)
            qr = q[start : start + q_len].transpose(0, 1)  # [Hq, q_len, D]
            # query i sits at position seq_len - q_len + i and sees keys at positions <= it
            q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
            mask = positions[None, :] <= q_pos[:, None]
            if sliding_window > 0:
                mask &= positions[None, :] > q_pos[:, None] - sliding_window
            if sinks is None:
                o = F.scaled_dot_product_attention(
                    qr, k, v, attn_mask=mask, scale=scale, enable_gqa=True
                )
            else:
                o = _attention_with_sinks(qr, k, v, mask, scale, sinks)
            out[start : start + q_len] = o.transpose(0, 1)
            start += q_len


def _attention_with_sinks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
    sinks: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """SDPA has no sinks: the sink is one more logit per head that takes probability mass and
    contributes no value. q [Hq, L, D], k/v [Hkv, S, D] -> [Hq, L, D]."""
    group = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
    scores = (q.float() @ k.float().transpose(1, 2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    sink = sinks.float()[:, None, None].expand(-1, q.shape[1], 1)
    probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    return (probs @ v.float()).to(q.dtype)
