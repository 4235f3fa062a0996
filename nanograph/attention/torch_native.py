"""Host-planned attention in plain PyTorch: gathers each request's paged KV and runs SDPA.

Works on CPU and GPU and is the reference for the Triton backend (sliding windows and attention
sinks included: sinks take an explicit softmax, as SDPA has none). It loops over requests with
Python ints taken from the metadata's host copies, so it is not graph-safe: it works where the
attention split op runs eagerly (eager, breakable, tc_piecewise); full graphs refuse it.

SDPA gets 4-D ``[1, heads, len, dim]`` inputs (3-D ones send CPU to the unfused math kernel)
and the cheapest causality it can take: none for one query (it sees every key), ``is_causal``
when the request has no cached prefix (query i sits at position i), and a boolean mask only
for a chunk after a cached prefix (SDPA's ``is_causal`` aligns to the top-left corner) or a
sliding window.
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
        new_kv: tuple[torch.Tensor, torch.Tensor] | None = None,  # unused: reads the cache
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
            windowed = 0 < sliding_window < seq_len
            mask, causal = None, False
            if sinks is None and not windowed and q_len == seq_len:
                causal = q_len > 1
            elif sinks is not None or windowed or q_len > 1:
                # query i sits at position seq_len - q_len + i and sees keys at positions <= it
                q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
                mask = positions[None, :] <= q_pos[:, None]
                if windowed:
                    mask &= positions[None, :] > q_pos[:, None] - sliding_window
            if sinks is None:
                o = F.scaled_dot_product_attention(
                    qr, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True
                )[0]
            else:
                o = _attention_with_sinks(qr[0], k[0], v[0], mask, scale, sinks)
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
