"""One launch that moves a captured draft loop's inputs on by one step.

Why: between two steps of ``DraftRunner``'s loop graph the inputs advanced in torch ops: the
token copy, positions and sequence lengths + 1, the page-table lookup of the next slot and its
masking took about a dozen element-wise launches a step (~13-15 us of the loop on the H100,
against a 0.83 ms qwen3-0.6b step). Here one program does all of it for every slot.

Invariants:
- Equals the torch ops it replaces (``runners.decode_runner.advance_inputs``, which runs them
  off CUDA and while torch.compile traces) exactly, for any slot count.
- A slot is live while its sequence length is > 0: only live slots move; sentinel slots
  (length 0) keep their position and length and get slot -1 (their rows write no KV). Every
  slot's input token is its draft.
- Graph-safe: one program, a grid of one, static sizes; no host reads.
- One compiled variant for every loop graph of an engine (only the page size is a
  constexpr): the slot count and the page table's row stride are not specialized, nor are the
  pointers on their alignment (a loop step's drafts are a row of ``[steps, slots]``, 8-byte
  aligned at odd slot counts), and the slots go in fixed ``BLOCK``-wide parts. The memory
  plan's probe capture (the largest draft shape) compiles it, so the draft runner's captures
  compile nothing: with a variant per power of two of the slot count, the first capture of
  each smaller shape compiled one (~0.4 s of a 0.49 s start-up draft capture at batch sizes 1
  and 4 on a fresh H100, against 0.08 s captured again; stop 60).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nanograph.kernels.launch import LaunchCache

_POINTERS = ["tokens_ptr", "ids_ptr", "positions_ptr", "seq_lens_ptr", "slots_ptr", "table_ptr"]
PART_SLOTS = 128  # slots a part of the loop (the kernel's BLOCK)


@triton.jit(do_not_specialize=["num_slots", "stride_table"],
            do_not_specialize_on_alignment=_POINTERS)  # fmt: skip
def _advance_kernel(
    tokens_ptr,
    ids_ptr,
    positions_ptr,
    seq_lens_ptr,
    slots_ptr,
    table_ptr,
    num_slots,
    stride_table,
    PAGE_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    for start in range(0, num_slots, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < num_slots
        seq = tl.load(seq_lens_ptr + offs, mask=mask, other=0)
        live = seq > 0
        tl.store(ids_ptr + offs, tl.load(tokens_ptr + offs, mask=mask), mask=mask)
        pos = tl.load(positions_ptr + offs, mask=mask, other=0) + live.to(tl.int64)
        tl.store(positions_ptr + offs, pos, mask=mask)
        tl.store(seq_lens_ptr + offs, seq + live.to(seq.dtype), mask=mask)
        rows = offs.to(tl.int64) * stride_table
        page = tl.load(table_ptr + rows + pos // PAGE_SIZE, mask=mask & live, other=0)
        slot = tl.where(live, page.to(tl.int64) * PAGE_SIZE + pos % PAGE_SIZE, -1)
        tl.store(slots_ptr + offs, slot, mask=mask)


_launch = LaunchCache(_advance_kernel)


def advance_draft_inputs(
    tokens: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor, seq_lens: torch.Tensor,
    slots: torch.Tensor, page_table: torch.Tensor, page_size: int,
) -> None:  # fmt: skip
    """In place, for the ``S`` slots of ``tokens [S]``: ``ids = tokens``; where
    ``seq_lens > 0``, positions and seq_lens + 1 and the slot of the new position from
    ``page_table [>= S, pages]`` (contiguous rows); elsewhere slot -1. ``ids``, ``positions``,
    ``slots`` [S] int64; ``seq_lens`` [S] int32."""
    num_slots = tokens.shape[0]
    for name, x in (("ids", ids), ("positions", positions), ("seq_lens", seq_lens),
                    ("slots", slots)):  # fmt: skip
        if x.shape != (num_slots,) or x.stride(0) != 1:
            raise ValueError(f"{name} needs [{num_slots}] contiguous, got {tuple(x.shape)}")
    if page_table.shape[0] < num_slots or page_table.stride(1) != 1:
        shape, strides = tuple(page_table.shape), page_table.stride()
        raise ValueError(f"page_table needs >= {num_slots} rows contiguous in their pages, "
                         f"got {shape} with strides {strides}")  # fmt: skip
    if num_slots == 0:
        return
    _launch(
        (1,), (tokens, ids, positions, seq_lens, slots, page_table),
        (num_slots, page_table.stride(0)),
        dict(PAGE_SIZE=page_size, BLOCK=PART_SLOTS, num_warps=1),
    )  # fmt: skip


__all__ = ["advance_draft_inputs"]
