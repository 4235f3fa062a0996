"""The model's single call into attention, and the scoped context it reads.

Invariants:
- ``attention`` is a ``split_op``: an eager break under the breakable graph backend, a split
  point under tc_piecewise, and an ordinary call (captured inline) under full graphs or eager.
- Its tensor arguments are activations and weights only. The per-forward state (backend,
  metadata, KV cache) comes from ``forward_context``, a contextvar the runner sets around a
  forward or a replay, so the KV cache is never a traced input and a break always reads the
  live batch's metadata.
- It rotates q/k (after optional q/k-norm) and writes k/v into the cache at the metadata's slot
  mapping before attending, in one fused kernel on CUDA.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from nanograph.attention.base import AttentionBackend, AttentionMetadata
from nanograph.graph import split_op
from nanograph.layers import ops


@dataclass(frozen=True)
class ForwardContext:
    backend: AttentionBackend
    meta: AttentionMetadata
    k_caches: list[torch.Tensor]  # one [num_slots, kv_heads, head_dim] tensor per layer
    v_caches: list[torch.Tensor]


_current: contextvars.ContextVar[ForwardContext | None] = contextvars.ContextVar(
    "nanograph_forward_context", default=None
)


@contextmanager
def forward_context(ctx: ForwardContext) -> Iterator[None]:
    token = _current.set(ctx)
    try:
        yield
    finally:
        _current.reset(token)


def _attention_fake(q, k, v, positions, cos_sin_cache, q_norm, k_norm, layer, scale, eps):
    return torch.empty_like(q)


@split_op("nanograph::attention", fake=_attention_fake, mutates_args=("q", "k"))
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    layer: int,
    scale: float,
    eps: float,
) -> torch.Tensor:
    """q [N, Hq, D], k/v [N, Hkv, D] of this forward -> attention output [N, Hq, D]."""
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError(
            "attention ran outside forward_context(...): run the model through a runner, or "
            "wrap the call in nanograph.attention.op.forward_context"
        )
    k_cache, v_cache = ctx.k_caches[layer], ctx.v_caches[layer]
    ops.rope_store_kv(
        q, k, v, positions, cos_sin_cache, k_cache, v_cache, ctx.meta.slot_mapping,
        q_norm_weight=q_norm, k_norm_weight=k_norm, eps=eps, num_tokens=ctx.meta.num_tokens,
    )  # fmt: skip
    return ctx.backend.forward(q, k_cache, v_cache, ctx.meta, scale)
