"""N-gram (prompt lookup) drafting: propose what followed the last n-gram the last time it
occurred in the request's own prompt and output.

A documented host step before the verify forward: the tokens live on the host already (the
speculative step reads each verify's result before scheduling the next), and a numpy scan of
one request's context costs microseconds, so a device kernel would save nothing worth its
complexity. Invariants: the proposal is a pure function of the tokens; it never proposes more
than asked, and proposes nothing when no earlier occurrence exists.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

# Longest n-gram tried first (more context, better guesses), down to a single token: the
# defaults of vLLM's and SGLang's prompt-lookup drafters.
NGRAM_MAX = 4
NGRAM_MIN = 1


def propose_ngram(
    tokens: list[int], num_draft: int, max_n: int = NGRAM_MAX, min_n: int = NGRAM_MIN
) -> list[int]:
    """Up to ``num_draft`` tokens that followed the most recent earlier occurrence of the
    longest suffix n-gram (``max_n`` down to ``min_n`` tokens) of ``tokens``."""
    if num_draft <= 0 or len(tokens) < 2:
        return []
    context = np.asarray(tokens, dtype=np.int64)
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        pattern = context[-n:]
        # windows starting at 0 .. len-n-1: every occurrence that ends before the last token
        windows = sliding_window_view(context[:-1], n)
        hits = np.flatnonzero((windows == pattern).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return context[start : start + num_draft].tolist()
    return []


__all__ = ["NGRAM_MAX", "NGRAM_MIN", "propose_ngram"]
