"""Shape ladders and the pure dispatch from a live batch to a captured shape.

Invariants:
- A ``ShapeKey`` is (padded token count, request slots); the runner's static buffers are sized
  at the ladder's maximum, and every captured shape reads views of them.
- ``choose_shape`` is a pure function of (ladder, live tokens, live requests): the smallest shape
  that fits, or ``None`` for eager. It is precomputed from the ladder and unit-tested on CPU.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from nanograph.arith import ceil_div

# SGLang found padding beyond 2x the real tokens costs more than the launches a graph saves.
MAX_TOKEN_PADDING_RATIO = 2.0
# Token buckets grow ~15% per step: about 40 shapes from 16 to 8192, so padding waste stays
# small on large prefills where it costs real GEMM work.
PREFILL_BUCKET_GROWTH = 1.15
PREFILL_MIN_BUCKET = 16
PREFILL_BUCKET_ALIGN = 16


@dataclass(frozen=True, order=True)
class ShapeKey:
    num_tokens: int
    num_slots: int

    def __str__(self) -> str:
        return f"{self.num_tokens}x{self.num_slots}"


def decode_batch_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then steps of 8 up to ``max_bs`` (always included)."""
    sizes = [b for b in (1, 2, 4, 8) if b <= max_bs] + list(range(16, max_bs + 1, 8))
    if max_bs not in sizes:
        sizes.append(max_bs)
    return sorted(set(sizes))


def prefill_token_buckets(ceiling: int) -> list[int]:
    """Geometric ladder of 16-aligned token counts ending exactly at ``ceiling``."""
    buckets, t = [], float(PREFILL_MIN_BUCKET)
    while t < ceiling:
        aligned = ceil_div(int(t), PREFILL_BUCKET_ALIGN) * PREFILL_BUCKET_ALIGN
        if aligned < ceiling and (not buckets or aligned > buckets[-1]):
            buckets.append(aligned)
        t *= PREFILL_BUCKET_GROWTH
    return buckets + [ceiling]


def decode_shapes(batch_sizes: list[int]) -> list[ShapeKey]:
    return [ShapeKey(b, b) for b in batch_sizes]


def prefill_shapes(token_buckets: list[int], slots: int) -> list[ShapeKey]:
    return [ShapeKey(t, slots) for t in token_buckets]


def choose_shape(
    shapes: list[ShapeKey], num_tokens: int, num_requests: int, *, limit_padding: bool = False
) -> ShapeKey | None:
    """The smallest shape with room for the batch, or None (run eagerly).

    ``shapes`` must be sorted by token count. ``limit_padding`` applies the 2x token-padding
    rule (prefill: padded rows cost real GEMM work; decode batches are tiny, so it is off).
    """
    i = bisect.bisect_left(shapes, num_tokens, key=lambda s: s.num_tokens)
    for shape in shapes[i:]:
        if shape.num_slots < num_requests:
            continue
        if limit_padding and shape.num_tokens > MAX_TOKEN_PADDING_RATIO * max(num_tokens, 1):
            return None
        return shape
    return None


def verify_shapes(batch_sizes: list[int], query_len: int) -> list[ShapeKey]:
    """Verify / draft-extend shapes: ``query_len`` tokens for each of ``bs`` request slots."""
    return [ShapeKey(b * query_len, b) for b in batch_sizes]
