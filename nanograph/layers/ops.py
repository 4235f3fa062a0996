"""Elementwise ops of the model, dispatched to fused Triton kernels on CUDA.

Invariants:
- Every op has one torch reference (``nanograph.kernels.reference``) used on CPU; on CUDA the
  fused Triton kernel with the same signature runs. Both are graph-safe: no host reads.
- ``rope_store_kv`` rotates q/k in place and writes k/v into the paged cache at
  ``slot_mapping`` (slot -1 = padded token, not written), so attention backends only read.
"""

from __future__ import annotations

import torch

from nanograph.kernels import reference


def _impl(x: torch.Tensor):
    if x.is_cuda:
        from nanograph.kernels import fused

        return fused
    return reference


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _impl(x).rmsnorm(x, weight, eps)


def add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """residual += x (in place); returns (rmsnorm(residual), residual)."""
    return _impl(x).add_rmsnorm(x, residual, weight, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return _impl(x).silu_and_mul(x)


def rope_store_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> None:
    _impl(q).rope_store_kv(
        q,
        k,
        v,
        positions,
        cos_sin_cache,
        k_cache,
        v_cache,
        slot_mapping,
        q_norm_weight=q_norm_weight,
        k_norm_weight=k_norm_weight,
        eps=eps,
    )
