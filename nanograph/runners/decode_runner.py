"""``DecodeRunner``: one token per request, one captured shape per batch size.

Invariant: a shape ``bs x bs`` holds ``bs`` requests of one new token each; fewer live
requests leave zero-length sentinel slots and padded rows that write no KV.
"""

from __future__ import annotations

from nanograph.runners.graph_runner import GraphRunner
from nanograph.runners.shapes import ShapeKey


class DecodeRunner(GraphRunner):
    path = "decode"

    def max_query_len(self, shape: ShapeKey) -> int:
        return 1

    def dummy_query_lens(self, shape: ShapeKey) -> list[int]:
        return [1] * shape.num_slots


__all__ = ["DecodeRunner"]
