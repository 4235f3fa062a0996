"""kernels.tma: row tensors as TMA descriptors, cached for CUDA tensors by what they are made of,
holding no tensor; read through the tensor itself for the interpreter (CPU)."""

from __future__ import annotations

import gc
import os
import weakref

import pytest
import torch

# Importing triton decorates its language's functions, which reads TRITON_INTERPRET: settle it
# first, as the interpreter test modules do, or they run against a compiled-mode triton when
# this module is collected before them. Not on a GPU machine, whose kernels must compile.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from nanograph.kernels import tma  # noqa: E402


@pytest.fixture
def as_cuda(monkeypatch):
    """CPU tensors take the CUDA path (the cache) here: nothing is launched."""
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(tma, "_descriptors", {})


def test_rows_are_a_2d_tensor_in_row_boxes():
    rows = torch.zeros(40, 4, 32, dtype=torch.bfloat16)
    desc = tma.rows_descriptor(rows, 16, TensorDescriptor)
    assert desc.base is rows  # the interpreter reads the tensor itself
    assert (list(desc.shape), list(desc.strides), list(desc.block_shape)) == (
        [40, 128], [128, 1], [16, 32],
    )  # fmt: skip


def test_rows_tma_cannot_read_get_none():
    heads_apart = torch.zeros(40, 32, 4, dtype=torch.bfloat16).transpose(1, 2)
    unaligned = torch.zeros(40 * 128 + 1, dtype=torch.bfloat16)[1:].view(40, 4, 32)
    for rows in (heads_apart, unaligned):
        assert not tma.tma_rows(rows)
        assert tma.rows_descriptor(rows, 16, TensorDescriptor) is None


def test_cuda_descriptors_are_cached_without_their_tensor(as_cuda):
    rows = torch.zeros(40, 4, 32, dtype=torch.bfloat16)
    desc = tma.rows_descriptor(rows, 16, TensorDescriptor)
    assert tma.rows_descriptor(rows, 16, TensorDescriptor) is desc
    assert desc.base.data_ptr() == rows.data_ptr() and desc.base.dtype == rows.dtype
    # anything the descriptor is made of makes another one
    assert tma.rows_descriptor(rows, 32, TensorDescriptor) is not desc  # box
    assert tma.rows_descriptor(rows[8:], 16, TensorDescriptor) is not desc  # address, shape
    assert tma.rows_descriptor(rows.half(), 16, TensorDescriptor) is not desc  # dtype
    # the cache holds no tensor: an activation dies when its forward drops it
    alive = weakref.ref(rows)
    del rows
    gc.collect()
    assert alive() is None


def test_the_cache_starts_over_when_full(as_cuda, monkeypatch):
    monkeypatch.setattr(tma, "_MAX_DESCRIPTORS", 4)
    rows = torch.zeros(64, 4, 32, dtype=torch.bfloat16)
    for start in range(0, 64, 8):  # eight addresses
        tma.rows_descriptor(rows[start:], 16, TensorDescriptor)
        assert len(tma._descriptors) <= 4


def test_a_layout_function_makes_the_layout_of_each_box(as_cuda):
    made = []

    class WithLayout(TensorDescriptor):  # Gluon's descriptor takes a layout after the box
        def __init__(self, base, shape, strides, block_shape, layout):
            super().__init__(base, shape, strides, block_shape)
            self.layout = layout

    def layout(rows, d):
        made.append((rows, d))
        return ("layout", rows, d)

    rows = torch.zeros(40, 4, 32, dtype=torch.bfloat16)
    for _ in range(3):
        desc = tma.rows_descriptor(rows, 16, WithLayout, layout)
    assert desc.layout == ("layout", 16, 32) and made == [(16, 32)]
