"""The one way a ``ForwardBatch`` becomes model inputs and attention metadata.

A batch is written into three blocks of one layout (m request slots, n token rows, w page
columns), then the metadata is views of their device copies:

- ``tokens`` [3, n] int64: input ids, positions, slot mapping;
- ``lens`` [3S + 4] int32: seq_lens [m] | query_lens [m] | query_start_loc [m + 1] | num_tokens,
  each segment starting at a multiple of S = ``lens_stride(m)`` entries (16 bytes);
- ``pages`` [m, w] int32: the page table.

Invariants:
- Padding: token rows past the live count get token 0, position 0 and slot -1 (no KV write);
  request slots past the live count are zero-length sentinels (seq_len = query_len = 0, page
  table row on the scratch page 0, ``query_start_loc`` parked at the live token count).
- Graph runners fill pinned mirrors of their static buffers at their largest shape
  (``StaticInputs``); an eager forward fills blocks of the batch's exact size
  (``eager_inputs``). Both go through ``fill`` and ``views``, so both see the same metadata.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np
import torch

from nanograph.arith import ceil_div
from nanograph.attention.base import AttentionMetadata

if TYPE_CHECKING:
    from nanograph.runners.forward_batch import ForwardBatch


def lens_stride(num_slots: int) -> int:
    """Entries between the starts of the ``lens`` block's segments: ``num_slots + 1`` rounded up
    to 16 bytes. Triton compiles a kernel variant per pointer alignment (16 bytes or not), so
    with unaligned segments the batch size would pick the variant and an eager forward of a
    new batch size could compile on a request's path."""
    return ceil_div(num_slots + 1, 4) * 4


def lens_size(num_slots: int) -> int:
    return 3 * lens_stride(num_slots) + 4


def fill(
    batch: ForwardBatch,
    num_slots: int,
    tokens: np.ndarray,
    lens: np.ndarray,
    pages: np.ndarray,
    stale: tuple[int, int] = (0, 0),
) -> None:
    """Writes ``batch`` padded to ``num_slots`` slots (and every token row of ``tokens``) into
    host blocks of the layout above. Page-table entries past a request's pages are zero (the
    scratch page): attention never reads them (lengths bound every read), but the draft loop
    looks up pages for steps past a request's drafts there and must find only scratch. Only
    what the blocks' last batch wrote can be non-zero: ``stale`` = its (rows, columns), cleared
    with the rows and columns this batch takes."""
    s, t, r, m = num_slots, batch.num_tokens, batch.num_requests, pages.shape[0]
    stride = lens_stride(m)
    tokens[0, :t], tokens[1, :t], tokens[2, :t] = (
        batch.input_ids, batch.positions, batch.slot_mapping,
    )  # fmt: skip
    tokens[:2, t:] = 0
    tokens[2, t:] = -1
    lens[:] = 0
    lens[:r] = batch.seq_lens
    lens[stride : stride + r] = batch.query_lens
    starts = lens[2 * stride : 2 * stride + m + 1]
    np.cumsum(batch.query_lens, out=starts[1 : r + 1])
    starts[r + 1 :] = t  # sentinels parked after the real tokens
    lens[3 * stride] = t
    rows, width = stale
    pages[: max(s, rows), : max(batch.max_pages, width)] = 0  # sentinels: scratch page 0
    counts = [len(row) for row in batch.page_tables]
    flat = np.fromiter(itertools.chain.from_iterable(batch.page_tables), np.int32, sum(counts))
    row_starts = np.repeat(np.cumsum(counts) - counts, counts)
    pages[np.repeat(np.arange(r), counts), np.arange(len(flat)) - row_starts] = flat


def views(
    tokens: torch.Tensor,
    lens: torch.Tensor,
    page_table: torch.Tensor,
    num_tokens: int,
    num_slots: int,
    page_size: int,
    max_query_len: int,
    seq_lens_cpu: list[int],
    query_lens_cpu: list[int],
) -> AttentionMetadata:
    """The metadata of a forward over ``num_tokens`` rows and ``num_slots`` slots, as views of
    device blocks of the layout above (``seq_lens_cpu``/``query_lens_cpu``: host copies of the
    lengths, kept by reference so that whoever updates them in place updates the metadata)."""
    n, s, stride = num_tokens, num_slots, lens_stride(page_table.shape[0])
    return AttentionMetadata(
        page_table=page_table[:s],
        seq_lens=lens[:s],
        query_lens=lens[stride : stride + s],
        query_start_loc=lens[2 * stride : 2 * stride + s + 1],
        slot_mapping=tokens[2, :n],
        num_tokens=lens[3 * stride : 3 * stride + 1],
        page_size=page_size,
        max_query_len=max_query_len,
        seq_lens_cpu=seq_lens_cpu,
        query_lens_cpu=query_lens_cpu,
    )


def eager_inputs(
    batch: ForwardBatch, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """Input ids, positions and exact-size metadata of an eager forward."""
    m, n = batch.num_requests, batch.num_tokens
    # an even row length keeps the positions row 16-byte aligned too (see ``lens_stride``)
    tokens = np.empty((3, n + n % 2), dtype=np.int64)
    lens = np.empty(lens_size(m), dtype=np.int32)
    pages = np.zeros((m, batch.max_pages), dtype=np.int32)
    fill(batch, m, tokens, lens, pages)

    def dev(block: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(block).to(device, non_blocking=True)

    tokens_d = dev(tokens)
    meta = views(
        tokens_d, dev(lens), dev(pages), n, m, batch.page_size, max(batch.query_lens),
        list(batch.seq_lens), list(batch.query_lens),
    )  # fmt: skip
    return tokens_d[0, :n], tokens_d[1, :n], meta


__all__ = ["eager_inputs", "fill", "lens_size", "lens_stride", "views"]
