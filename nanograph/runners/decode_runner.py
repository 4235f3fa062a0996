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


class DraftRunner(DecodeRunner):
    """The draft model's autoregressive steps: one token per request, as in decode.

    Each of the k-1 steps after the draft-extend forward replays this runner's graph for the
    live batch size; the steps chain on the device (each step's input is the previous step's
    sampled token, taken through ``ForwardBatch.future_rows``), so the loop costs no host sync.
    """

    path = "draft"


__all__ = ["DecodeRunner", "DraftRunner"]
