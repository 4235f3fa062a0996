"""``ops.linear`` on CPU: float32 products on oneDNN's prepacked weights, equal to ``F.linear``
up to float32 rounding, packed once per weight and again after the weight changes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nanograph.layers import ops

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="a CPU build without oneDNN"
)


def _packed(weight: torch.Tensor):
    return getattr(weight, ops._PACKED_ATTR, None)


@pytest.mark.parametrize("rows", [1, 3, 64, 700])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_f_linear(rows, bias):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.nn.Parameter(torch.randn(96, 40, generator=gen), requires_grad=False)
    b = torch.randn(96, generator=gen) if bias else None
    x = torch.randn(rows, 40, generator=gen)
    with torch.inference_mode():
        got = ops.linear(x, weight, b)
    torch.testing.assert_close(got, F.linear(x, weight, b), rtol=1e-5, atol=1e-5)
    assert _packed(weight) is not None


def test_packed_once_and_again_after_an_in_place_change():
    weight = torch.nn.Parameter(torch.randn(32, 16), requires_grad=False)
    x = torch.randn(4, 16)
    ops.linear(x, weight)
    first = _packed(weight)[1]
    ops.linear(x, weight)
    assert _packed(weight)[1] is first
    with torch.no_grad():
        weight.mul_(2.0)  # as the loader's copy_ does: the version counter moves
    torch.testing.assert_close(ops.linear(x, weight), F.linear(x, weight), rtol=1e-5, atol=1e-5)
    assert _packed(weight)[1] is not first


def test_views_other_dtypes_and_autograd_take_the_plain_product():
    stacked = torch.randn(3, 8, 16)
    x = torch.randn(2, 16)
    torch.testing.assert_close(ops.linear(x, stacked[1]), F.linear(x, stacked[1]))
    assert _packed(stacked) is None and _packed(stacked[1]) is None
    half = torch.randn(8, 16, dtype=torch.bfloat16)
    ops.linear(x.bfloat16(), half)
    assert _packed(half) is None
    trained = torch.nn.Parameter(torch.randn(8, 16))
    out = ops.linear(x, trained)
    out.sum().backward()
    assert trained.grad is not None and _packed(trained) is None


def test_a_weight_whose_copy_would_not_fit_stays_unpacked(monkeypatch):
    monkeypatch.setattr(ops, "_memory_available", lambda: ops.PACK_HEADROOM_BYTES)
    weight = torch.nn.Parameter(torch.randn(32, 16), requires_grad=False)
    x = torch.randn(4, 16)
    torch.testing.assert_close(ops.linear(x, weight), F.linear(x, weight))
    assert _packed(weight)[1] is None  # decided once: later products skip the memory check
