"""The model's single call into attention, and the scoped context it reads.

Invariants:
- ``attention`` is two steps. (1) ``rope_store_kv``: rotate q/k (after optional q/k-norm) and
  write k/v into the cache at the metadata's slot mapping, one fused graph-safe kernel on CUDA,
  so it is captured inside the graph under every backend (an opaque custom op to dynamo).
  Given the attention output buffer, it also zeroes that buffer's padded rows (at or past the
  metadata's ``num_tokens``; there are none in an eager forward), the only rows attention does
  not write: one zero-fill kernel a layer fewer.
  (2) ``attend``: a ``split_op`` that fills that output buffer, allocated by the caller, i.e.
  inside the graph: an eager break under the breakable graph backend, a split point under
  tc_piecewise, and an ordinary call (captured inline) under full graphs or eager. Writing into
  a caller buffer and returning nothing means a break has no output to copy, and the only work
  left eager at a break is the backend's attention itself.
- The fused one-row decode (``one_row``), and any forward whose backend says it
  ``rotates_in_attention`` (Triton: every decode), take both steps as one split op,
  ``rope_attend``: the backend rotates, stores and attends in one kernel (or runs the two).
  Compiled forwards (tc_piecewise) keep the two steps.
- Their tensor arguments are activations and weights only. The per-forward state (backend,
  metadata, KV cache) comes from ``forward_context``, a contextvar the runner sets around a
  forward or a replay, so the KV cache is never a traced input and a break always reads the
  live batch's metadata.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from nanograph.attention.base import AttentionBackend, AttentionMetadata, RopeInputs
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


def _context() -> ForwardContext:
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError(
            "attention ran outside forward_context(...): run the model through a runner, or "
            "wrap the call in nanograph.attention.op.forward_context"
        )
    return ctx


def rope_store_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    layer: int,
    eps: float,
    out: torch.Tensor,
) -> None:
    """In place on q/k; writes this forward's k/v into layer's cache (from forward_context)
    and zeroes the padded rows of ``out``, attention's output buffer."""
    ctx = _context()
    ops.rope_store_kv(
        q, k, v, positions, cos_sin_cache, ctx.k_caches[layer], ctx.v_caches[layer],
        ctx.meta.slot_mapping, q_norm_weight=q_norm, k_norm_weight=k_norm, eps=eps,
        num_tokens=ctx.meta.num_tokens, zero_padding=out,
    )  # fmt: skip


# What dynamo records while tracing (tc_piecewise): one opaque node inside a compiled piece.
_rope_store_kv_op = torch.library.custom_op(
    "nanograph::rope_store_kv", mutates_args=("q", "k", "out")
)(rope_store_kv)
_rope_store_kv_op.register_fake(lambda *args: None)


@split_op("nanograph::attend", fake=lambda *args: None, mutates_args=("out",))
def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    layer: int,
    scale: float,
    sliding_window: int,
    sinks: torch.Tensor | None,
) -> None:
    """out[N, Hq, D] (padded rows zeroed) <- attention of the rotated q over layer's cache,
    which holds this forward's rotated k and v too (the backend may read those rows)."""
    ctx = _context()
    ctx.backend.forward(
        q,
        ctx.k_caches[layer],
        ctx.v_caches[layer],
        ctx.meta,
        scale,
        out,
        sliding_window,
        sinks,
        (k, v),
    )


@split_op("nanograph::rope_attend", fake=lambda *args: None, mutates_args=("q", "k", "out"))
def rope_attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    out: torch.Tensor,
    layer: int,
    scale: float,
    eps: float,
    sliding_window: int,
    sinks: torch.Tensor | None,
) -> None:
    """A decode's two steps as one (the fused one-row decode, or a forward whose backend
    ``rotates_in_attention``): the backend may do them in one kernel."""
    ctx = _context()
    rope = RopeInputs(positions, cos_sin_cache, q_norm, k_norm, eps)
    ctx.backend.forward_rope(
        q, k, v, rope, ctx.k_caches[layer], ctx.v_caches[layer], ctx.meta, scale, out,
        sliding_window, sinks,
    )  # fmt: skip


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
    sliding_window: int = 0,
    sinks: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    one_row: bool = False,
) -> torch.Tensor:
    """q [N, Hq, D], k/v [N, Hkv, D] of this forward -> attention output [N, Hq, D].
    ``sliding_window`` > 0 limits each query to that many most recent keys; ``sinks`` (fp32
    [Hq]) adds one learned logit per head to the softmax denominator (gpt-oss). ``out``: a
    buffer like q for the output (by default a new one); rope_store_kv zeroes its padded rows.
    The fused one-row decode passes one of its own: its row is written, and ``one_row`` (never
    while compiling) lets the backend rotate, store and attend in one step
    (``AttentionBackend.forward_rope``), as every forward takes where the backend
    ``rotates_in_attention``."""
    if one_row and (out is None or q.shape[0] != 1):
        raise ValueError("one_row attention takes one token and its output buffer")
    if out is None:
        out = torch.empty_like(q)  # padded rows: zeroed by rope_store_kv or forward_rope
    compiling = torch.compiler.is_compiling()
    if one_row or (not compiling and _rotates_in_attention()):
        rope_attend(q, k, v, positions, cos_sin_cache, q_norm, k_norm, out, layer, scale, eps,
                    sliding_window, sinks)  # fmt: skip
        return out
    rope = _rope_store_kv_op if compiling else rope_store_kv
    rope(q, k, v, positions, cos_sin_cache, q_norm, k_norm, layer, eps, out)
    attend(q, k, v, out, layer, scale, sliding_window, sinks)
    return out


def _rotates_in_attention() -> bool:
    ctx = _context()
    return ctx.backend.rotates_in_attention(ctx.meta)
