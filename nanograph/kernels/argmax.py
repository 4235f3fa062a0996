"""Row-wise argmax of logits on the device: the greedy pick of a sampler step.

Why: torch's argmax of one 151,936-wide row took 8 us and a memset on the H200 (its two-phase
reduction zeroes semaphores first), a launch and a gap more on every decode step's path, after
a batch-1 forward of 0.7 ms (qwen3-0.6b). Here a row is cut into ``BLOCK``-wide parts, one
program each: a program loads its part in one go, keeps its maximum and the lowest index
holding it, writes that pair, and counts itself in on the row's counter; the program that
counts last picks the row's answer from the parts and resets the counter.

Invariants:
- The result equals ``torch.argmax(x, dim=-1)``: the first index of the maximum. NaN counts as
  +inf (torch picks a NaN too); a row of -inf picks index 0.
- Graph-safe: the grid depends only on the row count and width; the counters come zeroed from
  ``kernels.counters`` and are left zeroed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nanograph.kernels.counters import split_counters
from nanograph.kernels.launch import LaunchCache

# Columns a program reads: 16 KB of float32, one load of 16 values a thread in 8 warps
BLOCK = 4096
FAR_INDEX = 2**31 - 1  # an index past any row
_FAR = tl.constexpr(FAR_INDEX)


@triton.jit
def _argmax_kernel(
    x_ptr,
    out_ptr,
    part_val_ptr,
    part_idx_ptr,
    counter_ptr,
    width,
    stride_x,
    BLOCK: tl.constexpr,
    PARTS: tl.constexpr,  # programs per row
    PARTS_CAP: tl.constexpr,  # a power of two >= PARTS
):
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    idx = part * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride_x + idx, mask=idx < width, other=float("-inf"))
    x = x.to(tl.float32)
    x = tl.where(x != x, float("inf"), x)  # NaN as +inf
    best = tl.max(x, 0)
    # the lowest index holding the maximum (lanes past the row hold -inf and higher indices)
    first = tl.min(tl.where(x == best, idx, _FAR), 0)
    if PARTS == 1:
        tl.store(out_ptr + row, first.to(tl.int64))
    else:
        slot = row * PARTS + part
        tl.store(part_val_ptr + slot, best)
        tl.store(part_idx_ptr + slot, first)
        if tl.atomic_add(counter_ptr + row, 1, sem="acq_rel") == PARTS - 1:
            parts = tl.arange(0, PARTS_CAP)
            vals = tl.load(part_val_ptr + row * PARTS + parts, mask=parts < PARTS,
                           other=float("-inf"))  # fmt: skip
            idxs = tl.load(part_idx_ptr + row * PARTS + parts, mask=parts < PARTS, other=_FAR)
            top = tl.max(vals, 0)
            tl.store(out_ptr + row, tl.min(tl.where(vals == top, idxs, _FAR), 0).to(tl.int64))
            tl.store(counter_ptr + row, 0)


_launch = LaunchCache(_argmax_kernel)


def argmax(x: torch.Tensor, *, out: torch.Tensor | None = None, block: int = BLOCK) -> torch.Tensor:
    """``x.argmax(dim=-1)`` of ``x [rows, width]`` (float, contiguous in width) as int64 [rows],
    into ``out`` if given (a contiguous int64 [rows]: a captured loop's drafts row, without a
    copy launch); ``block``: the columns of a program (a power of two; tests take small
    ones)."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"argmax takes rows [rows, width] contiguous in width, got "
                         f"{tuple(x.shape)} with strides {x.stride()}")  # fmt: skip
    rows, width = x.shape
    if width == 0 or width >= FAR_INDEX:
        raise ValueError(f"argmax needs 1 to {FAR_INDEX - 1} columns, got {width}")
    if out is None:
        out = torch.empty(rows, dtype=torch.int64, device=x.device)
    elif out.shape != (rows,) or out.dtype != torch.int64 or out.stride(0) != 1:
        raise ValueError(f"out needs [{rows}] int64 contiguous, got {tuple(out.shape)} "
                         f"{out.dtype} with strides {out.stride()}")  # fmt: skip
    if rows == 0:
        return out
    block = min(block, triton.next_power_of_2(width))
    parts = triton.cdiv(width, block)
    part_val = torch.empty(rows * parts if parts > 1 else 1, dtype=torch.float32, device=x.device)
    part_idx = torch.empty_like(part_val, dtype=torch.int32)
    counters = split_counters(x.device, rows) if parts > 1 else part_idx
    _launch(
        (rows, parts), (x, out, part_val, part_idx, counters), (width, x.stride(0)),
        dict(BLOCK=block, PARTS=parts, PARTS_CAP=triton.next_power_of_2(parts),
             num_warps=8 if block >= 2048 else 4),
    )  # fmt: skip
    return out


__all__ = ["argmax"]
