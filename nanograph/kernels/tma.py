"""TMA descriptors of row tensors ``[N, H, D]``, cached by what they are made of.

Why: building a descriptor (Triton's ``TensorDescriptor`` or Gluon's) validates its fields in
Python, ~3 us of host time on the device's hosts, and an eager attention launch takes two to six
of them. Graph replays of a breakable prefill run attention eagerly every layer, on the same
buffers each time, so the same descriptors come back.

Invariants:
- A descriptor reads rows ``[N, H, D]`` as the 2-D tensor ``[N, H * D]`` in ``[rows, D]``
  boxes (rows past N read as zeros). That needs heads contiguous in a row and the base and
  row stride 16-byte aligned (``tma_rows``); ``rows_descriptor`` returns None otherwise.
- The cache key holds everything a descriptor is made of (address, shape, strides, dtype, box,
  descriptor type and the function making its layout), so an entry is reused only for an
  identical descriptor.
- A cached descriptor holds an ``_Address`` (the tensor's address and dtype), not the tensor:
  the cache keeps no activation alive. A later tensor at the same address with the same shape
  gets the same descriptor, which is what it would build. Only CUDA tensors' descriptors are
  cached: a CPU tensor's (Triton's interpreter, which reads the tensor itself) holds it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_MAX_DESCRIPTORS = 1024  # then start over (eager forwards of many shapes)
_descriptors: dict[tuple, Any] = {}
_MISSING = object()


class _Address:
    """What a launch reads of a descriptor's base: its address and dtype."""

    __slots__ = ("address", "dtype")

    def __init__(self, address: int, dtype: torch.dtype) -> None:
        self.address, self.dtype = address, dtype

    def data_ptr(self) -> int:
        return self.address


def tma_rows(x: torch.Tensor) -> bool:
    """Whether rows ``[N, H, D]`` can be read as a 2-D TMA tensor ``[N, H * D]``: heads
    contiguous in a row, the base and the row stride 16-byte aligned."""
    size = x.element_size()
    return (
        x.stride(2) == 1 and x.stride(1) == x.shape[2]
        and x.data_ptr() % 16 == 0 and x.stride(0) * size % 16 == 0
    )  # fmt: skip


def rows_descriptor(
    x: torch.Tensor, rows: int, descriptor_type: type, layout: Callable | None = None
) -> Any | None:
    """``descriptor_type`` (Triton's or Gluon's ``TensorDescriptor``) of rows ``x [N, H, D]``
    in ``[rows, D]`` boxes, or None where ``tma_rows`` does not hold. Gluon's takes a shared
    memory layout: ``layout(rows, D)`` makes it (a function, so that the key holds it cheaply)."""
    if not x.is_cuda:  # Triton's interpreter reads the tensor itself: no cache
        return _make(x, x, rows, descriptor_type, layout) if tma_rows(x) else None
    address = x.data_ptr()
    key = (address, x.shape, x.stride(), x.dtype, rows, descriptor_type, layout)
    desc = _descriptors.get(key, _MISSING)
    if desc is _MISSING:
        if len(_descriptors) >= _MAX_DESCRIPTORS:
            _descriptors.clear()
        desc = _descriptors[key] = (
            _make(x, _Address(address, x.dtype), rows, descriptor_type, layout)
            if tma_rows(x) else None
        )  # fmt: skip
    return desc


def _make(
    x: torch.Tensor, base: Any, rows: int, descriptor_type: type, layout: Callable | None
) -> Any:
    n, heads, d = x.shape
    extra = () if layout is None else (layout(rows, d),)
    return descriptor_type(base, [n, heads * d], [x.stride(0), 1], [rows, d], *extra)


__all__ = ["rows_descriptor", "tma_rows"]
