"""Integer arithmetic written once."""

from __future__ import annotations


def ceil_div(a: int, b: int) -> int:
    """The smallest integer >= a / b (b > 0): pages for a token count, a shard's rows."""
    return -(-a // b)


__all__ = ["ceil_div"]
