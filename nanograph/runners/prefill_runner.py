"""``PrefillRunner``: extend forwards (prompt chunks, cached prefixes), token buckets x slots.

Invariants: a shape holds up to ``num_tokens`` tokens over up to ``num_slots`` requests; a batch
padded to more than twice its tokens runs eagerly (``limit_padding``); the dummy batch a shape
is captured with spreads its tokens over the slots, no request longer than the context.
"""

from __future__ import annotations

from nanograph.runners.graph_runner import GraphRunner
from nanograph.runners.shapes import ShapeKey


class PrefillRunner(GraphRunner):
    path = "prefill"
    limit_padding = True

    def max_query_len(self, shape: ShapeKey) -> int:
        return shape.num_tokens

    def dummy_query_lens(self, shape: ShapeKey) -> list[int]:
        cap, n = self.static.max_pages * self.static.page_size, shape.num_tokens
        per_request = [cap] * (n // cap) + ([n % cap] if n % cap else [])
        if len(per_request) > shape.num_slots:
            raise ValueError(
                f"prefill shape {shape} holds more tokens than {shape.num_slots} requests "
                f"of at most {cap} tokens can bring"
            )
        return per_request


__all__ = ["PrefillRunner"]
