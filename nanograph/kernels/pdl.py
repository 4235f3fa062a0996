"""Programmatic dependent launch (PDL): when kernels may overlap their neighbours.

A kernel launched with ``launch_pdl=True`` may start while the kernel before it in the stream
is still running; it must call ``tl.extra.cuda.gdc_wait()`` before it reads anything an earlier
kernel wrote and before it writes anything. A kernel calls ``gdc_launch_dependents()`` to let
such a dependent start before it exits.

What a dependent may read before its wait: anything written before the kernel it follows
began. That holds because a dependent kernel here lets its own dependents launch only after its
wait (so while it runs, every kernel before it has finished), or, where it lets them launch
earlier (the one-row attention), they read only weights before their wait. The one-row
attention reads the lengths and the page table before its wait, which no kernel of a forward
writes. Both instructions exist from sm_90 (Hopper) on; on
older GPUs and on CPU (the interpreter) every kernel is launched plainly and the ``PDL``
constexpr that guards them is False.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl


@functools.lru_cache(maxsize=16)
def _supported(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (9, 0)


@triton.jit
def prefetch_l2(ptrs):
    """An L2 prefetch of the 128-byte line at each address: what a dependent reads before its
    wait (weights, keys), fetched while the kernel before it finishes. Addresses must be valid
    (callers clamp or redirect the ones past their tensors)."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1];", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
    )


def enabled(t: torch.Tensor) -> bool:
    """Whether kernels working on ``t``'s device use PDL (their ``PDL`` constexpr)."""
    return t.is_cuda and _supported(t.device.index if t.device.index is not None else 0)
