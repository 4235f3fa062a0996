"""Graph-safe paged attention through the Triton kernel of ``nanograph.kernels.attention``.

It reads only device tensors of the metadata and launches with a grid fixed by static sizes
(tokens, request slots, the static ``max_query_len`` hint), so one capture serves every batch
that fits the runner's static buffers, including zero-length sentinel slots.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch

from nanograph.attention.base import AttentionBackend, AttentionMetadata, RopeInputs


def live_query_lens(meta: AttentionMetadata, q: torch.Tensor) -> tuple[int, int] | None:
    """The shortest and longest request of the live batch (``query_lens_cpu``, which a runner
    updates in place), for an eager call of an extend; None (every length) for a decode, or
    while a stream captures: a graph's launches must hold every batch it will replay. With
    them an extend makes only the launches its requests need
    (``kernels.attention.paged_attention``)."""
    if meta.max_query_len == 1 or (q.is_cuda and torch.cuda.is_current_stream_capturing()):
        return None
    live = [n for n in meta.query_lens_cpu if n]
    return (min(live), max(live)) if live else None


class TritonAttention(AttentionBackend):
    name = "triton"
    graph_safe = True

    def launch_variants(
        self, num_q_heads: int, num_kv_heads: int, head_dim: int, device: torch.device,
        dtype: torch.dtype,
    ) -> list[tuple[int, AbstractContextManager]]:  # fmt: skip
        from nanograph.kernels.attention_tiles import forced_tiles, tile_variants

        exact = dtype == torch.float32  # one variant: see kernels.attention_tiles.choose_tiles
        variants = tile_variants(device, num_q_heads, num_kv_heads, head_dim, exact)
        return [(tokens, forced_tiles(tiles)) for tokens, tiles in variants]

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
        new_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        from nanograph.kernels.attention import paged_attention
        from nanograph.kernels.attention_tiles import MAX_QUERY_LEN

        paged_attention(
            q,
            k_cache,
            v_cache,
            meta.page_table,
            meta.seq_lens,
            meta.query_lens,
            meta.query_start_loc,
            meta.page_size,
            scale,
            sliding_window=sliding_window,
            sinks=sinks,
            max_query_len=meta.max_query_len,
            query_len_range=live_query_lens(meta, q) or (0, MAX_QUERY_LEN),
            out=out,
            new_kv=new_kv,  # an extend reads its new keys from these rows (TMA, sm_90+)
        )

    def rotates_in_attention(self, meta: AttentionMetadata) -> bool:
        # decode only: a verify's rows rotated in the kernel (each program its request's rows,
        # the new keys stored by the slices that hold them) measured slower at batch 1 on the
        # H200 (qwen3-8b verify / decode 1.181 against 1.165; docs/wip has the patch)
        return meta.max_query_len == 1

    def forward_rope(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: RopeInputs,
        k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
        out: torch.Tensor, sliding_window: int = 0, sinks: torch.Tensor | None = None,
    ) -> None:  # fmt: skip
        """One kernel: the attention kernel's programs rotate their q rows, and the one whose
        slice holds its request's new key stores it and the value first
        (kernels.attention.RopeStore)."""
        from nanograph.kernels.attention import RopeStore, paged_attention

        store = RopeStore(
            k, v, rope.positions, rope.cos_sin_cache, meta.slot_mapping, rope.q_norm,
            rope.k_norm, rope.eps, meta.num_tokens,
        )  # fmt: skip
        paged_attention(
            q, k_cache, v_cache, meta.page_table, meta.seq_lens, meta.query_lens,
            meta.query_start_loc, meta.page_size, scale, sliding_window=sliding_window,
            sinks=sinks, max_query_len=meta.max_query_len, out=out, rope=store,
        )  # fmt: skip
