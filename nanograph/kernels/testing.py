"""Random paged batches in the engine's exact layout, for kernel tests and benchmarks.

A batch has ``len(context_lens)`` live requests, then ``num_sentinels`` zero-length sentinel
slots (seq_len = query_len = 0, ``query_start_loc`` parked at the real token count), and its
token dim padded to ``padded_tokens`` rows (slot -1, position 0). Pages are handed out in a
random order so a kernel that assumes contiguous pages fails.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nanograph.arith import ceil_div


@dataclass
class PagedBatch:
    q: torch.Tensor  # [N, Hq, D]
    k_cache: torch.Tensor  # [num_slots, Hkv, D], every used slot filled
    v_cache: torch.Tensor
    page_table: torch.Tensor  # int32 [S, max_pages]
    seq_lens: torch.Tensor  # int32 [S]
    query_lens: torch.Tensor  # int32 [S]
    query_start_loc: torch.Tensor  # int32 [S + 1]
    slot_mapping: torch.Tensor  # int64 [N], -1 for padded rows
    positions: torch.Tensor  # int64 [N], 0 for padded rows
    num_tokens: torch.Tensor  # int32 [1]
    page_size: int
    max_query_len: int

    def metadata(self) -> tuple[torch.Tensor, ...]:
        """The positional metadata arguments of ``paged_attention`` after the caches."""
        return self.page_table, self.seq_lens, self.query_lens, self.query_start_loc


def make_paged_batch(
    context_lens: list[int],
    query_lens: list[int],
    *,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    num_sentinels: int = 0,
    padded_tokens: int | None = None,
    spare_pages: int = 3,
    generator: torch.Generator | None = None,
) -> PagedBatch:
    """``context_lens[r]`` cached tokens plus ``query_lens[r]`` new ones for request r."""
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    seq_lens = [c + n for c, n in zip(context_lens, query_lens, strict=True)]
    pages_needed = [ceil_div(s, page_size) for s in seq_lens]
    max_pages = max([*pages_needed, 1])
    total_pages = sum(pages_needed) + spare_pages
    order = torch.randperm(total_pages, generator=gen)
    num_slots_live = len(seq_lens) + num_sentinels
    page_table = torch.zeros((num_slots_live, max_pages), dtype=torch.int32)
    used = 0
    for r, count in enumerate(pages_needed):
        page_table[r, :count] = order[used : used + count].to(torch.int32)
        used += count

    real_tokens = sum(query_lens)
    n = real_tokens if padded_tokens is None else padded_tokens
    if n < real_tokens:
        raise ValueError(f"padded_tokens={n} < {real_tokens} real tokens")
    slot_mapping = torch.full((n,), -1, dtype=torch.int64)
    positions = torch.zeros((n,), dtype=torch.int64)
    starts = [0]
    for r, (ctx, q_len) in enumerate(zip(context_lens, query_lens, strict=True)):
        pos = torch.arange(ctx, ctx + q_len)
        rows = slice(starts[-1], starts[-1] + q_len)
        positions[rows] = pos
        slot_mapping[rows] = page_table[r, pos // page_size].long() * page_size + pos % page_size
        starts.append(starts[-1] + q_len)
    starts += [real_tokens] * num_sentinels

    # Values are drawn on the target device (a 128 x 2k-token cache is 10^8 numbers per tensor),
    # from a generator seeded by the host one so a batch is reproducible.
    data_gen = torch.Generator(device=device).manual_seed(
        int(torch.randint(2**62, (1,), generator=gen))
    )

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=data_gen, device=device).to(dtype)

    num_cache_slots = total_pages * page_size
    k_cache = randn(num_cache_slots, num_kv_heads, head_dim)
    v_cache = randn(num_cache_slots, num_kv_heads, head_dim)
    q = randn(n, num_q_heads, head_dim)

    def int32(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    return PagedBatch(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        page_table=page_table.to(device),
        seq_lens=int32(seq_lens + [0] * num_sentinels),
        query_lens=int32(list(query_lens) + [0] * num_sentinels),
        query_start_loc=int32(starts),
        slot_mapping=slot_mapping.to(device),
        positions=positions.to(device),
        num_tokens=int32([real_tokens]),
        page_size=page_size,
        max_query_len=max([*query_lens, 1]),
    )
