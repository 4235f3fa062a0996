"""``VerifyRunner`` and ``DraftExtendRunner``: up to k+1 new tokens per request, by batch size.

Verify is the target's forward over each request's last token and its drafts (chain drafts, no
trees); draft-extend is the draft model catching up on the tokens the target accepted. Both
are extend forwards of at most ``query_len = k + 1`` tokens per request.

Invariants:
- A shape ``bs * (k+1) x bs`` holds up to ``bs`` requests of up to k+1 tokens each; requests
  with fewer drafts, and batches smaller than the shape, leave padded token rows (slot -1, no
  KV write, parked after the real tokens) and zero-length sentinel slots, exactly as prefill's.
- The attention grid is captured for ``max_query_len = k + 1`` (1 and 2 for draft-extend's
  one- and two-token shapes): dispatch takes the smallest shape whose bound holds the batch's
  longest request, and sends a batch with a longer request (a draft model's first catch-up
  over a prompt) to the eager path.
- No padding limit: the ladder is the decode one, so a shape is at most (k+1) x the tokens of
  the next smaller batch size, and these forwards are small.
"""

from __future__ import annotations

from nanograph.runners.graph_runner import GraphRunner
from nanograph.runners.shapes import ShapeKey


class VerifyRunner(GraphRunner):
    path = "verify"

    def __init__(self, *args, query_len: int, **kwargs) -> None:
        if query_len < 1:
            raise ValueError(f"{self.path} runner needs query_len >= 1, got {query_len}")
        self.query_len = query_len
        super().__init__(*args, **kwargs)

    def max_query_len(self, shape: ShapeKey) -> int:
        return self.query_len

    def dummy_query_lens(self, shape: ShapeKey) -> list[int]:
        return [self.max_query_len(shape)] * shape.num_slots


class DraftExtendRunner(VerifyRunner):
    """Besides the verify shapes, shapes of one and two tokens a request (``bs x bs``,
    ``2bs x bs``; a shape's bound is ``num_tokens // num_slots``): a verify that kept fewer
    than its k drafts leaves a request one new token to catch up on (the drafts it kept already
    have the drafter's KV), one that kept all k leaves two (the last draft and the target's
    token). Those forwards then take the one-row decode path (one token at batch 1) or two rows
    a request instead of k+1 padded rows: qwen3-0.6b's batch-1 one-token catch-up forward took
    0.73 against 1.00 ms of device time on the H200 (stop 40)."""

    path = "draft_extend"

    def max_query_len(self, shape: ShapeKey) -> int:
        return shape.num_tokens // shape.num_slots


__all__ = ["DraftExtendRunner", "VerifyRunner"]
