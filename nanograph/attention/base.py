"""The attention-backend interface: metadata for one forward, and the per-layer call.

Invariants:
- The new k/v of a forward are already in the paged cache when ``forward`` runs (the layer's
  fused rope+store op writes them), so a backend only reads the cache; ``forward_rope`` (the
  fused one-row decode, and any forward whose backend ``rotates_in_attention``) is given them
  unrotated and stores them itself. It writes its output into a caller-owned buffer
  (allocated inside the graph, so an eager break has nothing to copy out): every row below
  ``num_tokens``; the padded rows past it are zeroed by the rope+store op, or by
  ``forward_rope``.
- ``AttentionMetadata`` tensors live on the model's device and have static shapes for a given
  (tokens, request slots) pair; a graph runner owns one instance sized at its maximum and
  rewrites it in place before every replay.
- A request slot with ``seq_len == query_len == 0`` is a zero-length sentinel: it produces no
  output rows and reads no KV. Its ``query_start_loc`` is parked at the real token count.
- ``graph_safe`` backends never read the host copies; host-planned backends read them, so under
  a breakable graph their forward runs as an eager break and full-graph prefill refuses them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch

from nanograph.layers import ops


@dataclass
class AttentionMetadata:
    page_table: torch.Tensor  # int32 [S, max_pages]
    seq_lens: torch.Tensor  # int32 [S], KV length after this forward
    query_lens: torch.Tensor  # int32 [S], new tokens this forward
    query_start_loc: torch.Tensor  # int32 [S + 1]
    slot_mapping: torch.Tensor  # int64 [N], -1 = padded token (no KV write)
    num_tokens: torch.Tensor  # int32 [1], true token count (rows past it are padding)
    page_size: int
    max_query_len: int  # static upper bound: 1 for decode, N for extend
    # Host copies of the live lengths, read only by host-planned backends. A runner updates
    # these lists in place, so an eager break reading them sees the current batch.
    seq_lens_cpu: list[int] = field(default_factory=list)
    query_lens_cpu: list[int] = field(default_factory=list)

    @property
    def num_slots(self) -> int:
        return self.seq_lens.shape[0]


@dataclass(frozen=True)
class RopeInputs:
    """What rotary needs besides q and k: the tokens' positions, the cos|sin table and the
    optional q/k RMSNorm weights."""

    positions: torch.Tensor
    cos_sin_cache: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    eps: float


class AttentionBackend(ABC):
    """Per-layer paged attention over the KV cache."""

    name: str
    #: metadata can be prepared outside a graph into static buffers and ``forward`` launches
    #: the same kernels with the same grid for any batch that fits them (no host reads).
    graph_safe: bool

    def launch_variants(
        self, num_q_heads: int, num_kv_heads: int, head_dim: int, device: torch.device,
        dtype: torch.dtype,
    ) -> list[tuple[int, AbstractContextManager]]:  # fmt: skip
        """Every compiled variant a batch can launch, as (query tokens of one request that
        launches it, a context that selects it). Start-up runs a forward under each, so no
        kernel compiles on a request's path. Backends that compile nothing return []."""
        return []

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [N, num_q_heads, head_dim], rotated
        k_cache: torch.Tensor,  # [num_cache_slots, num_kv_heads, head_dim]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor,  # [N, num_q_heads, head_dim]: write every row of a request
        sliding_window: int = 0,  # > 0: a query sees only the last `sliding_window` keys
        sinks: torch.Tensor | None = None,  # fp32 [num_q_heads]: a logit with no value
        # this forward's keys (rotated) and values [N, num_kv_heads, head_dim] as stored in the
        # cache: a backend may read them from here instead of the cache
        new_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None: ...

    def rotates_in_attention(self, meta: AttentionMetadata) -> bool:
        """Whether ``forward_rope`` of a forward with this metadata is one kernel, so that the
        model's attention should give it q/k/v unrotated (else rope_store_kv then ``forward``
        is the same work in the same two steps, and stays where the graph captures it)."""
        return False

    def forward_rope(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: RopeInputs,
        k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
        out: torch.Tensor, sliding_window: int = 0, sinks: torch.Tensor | None = None,
    ) -> None:  # fmt: skip
        """Attention from the q/k/v projection: rotary (after q/k-norm), this forward's k/v
        into the cache (``out``'s padded rows zeroed), then ``forward``. Here as two steps; a
        backend that can do it in one kernel overrides it."""
        ops.rope_store_kv(
            q, k, v, rope.positions, rope.cos_sin_cache, k_cache, v_cache, meta.slot_mapping,
            q_norm_weight=rope.q_norm, k_norm_weight=rope.k_norm, eps=rope.eps,
            num_tokens=meta.num_tokens, zero_padding=out,
        )  # fmt: skip
        self.forward(q, k_cache, v_cache, meta, scale, out, sliding_window, sinks, (k, v))
