"""N-gram (prompt lookup) drafting: propose what followed the last n-gram the last time it
occurred in the request's own prompt and output.

A documented host step before the verify forward: the tokens live on the host already (the
speculative step reads each verify's result before scheduling the next). Its cost is paid per
request on every step, so it must stay far below a verify forward at batch 64: the drafter
keeps each request's tokens in a growing numpy buffer (appending only the tokens accepted
since its last proposal: converting a whole 640-token list took ~25 us), and ``propose_ngram``
makes one vectorised comparison over the context, for the last token, then narrows those
candidates one earlier token at a time (before 3806281 it compared every window for every n: ~210
us a request on the CPU machine, ~7.8 ms a step at batch 64 on the H200 host, half of the
measured step).

Invariants: the proposal is a pure function of the tokens; it never proposes more than asked,
and proposes nothing when no earlier occurrence exists. A request's tokens only grow while it
runs (finished requests are released), so the buffer is a prefix of them; if it is not, it is
rebuilt.
"""

from __future__ import annotations

import numpy as np

from nanograph.engine.request import Request
from nanograph.spec.proposal import Proposal

# The longest suffix n-gram with an earlier occurrence wins (more context, better guesses), of
# at most NGRAM_MAX and at least NGRAM_MIN tokens by default (the engine's
# speculative_ngram_{max,min}_match_window_size; vLLM's documented prompt-lookup example takes
# 4, SGLang's tree drafter defaults to 12 and 1).
NGRAM_MAX = 4
NGRAM_MIN = 1


def propose_ngram(
    tokens: np.ndarray | list[int], num_draft: int, max_n: int = NGRAM_MAX, min_n: int = NGRAM_MIN
) -> list[int]:
    """Up to ``num_draft`` tokens that followed the most recent earlier occurrence of the
    longest suffix n-gram (``max_n`` down to ``min_n`` tokens) of ``tokens``."""
    context = np.asarray(tokens)
    length = len(context)
    if num_draft <= 0 or length < 2:
        return []
    # ends: the last positions of the suffix n-gram's occurrences before the last token,
    # narrowed from n = 1 up (an n-gram's occurrences are among the (n-1)-gram's)
    ends = np.flatnonzero(context[:-1] == context[-1])
    n, found = 1, None
    while ends.size:
        if n >= min_n:
            found = ends[-1]
        if n == max_n or n == length - 1:
            break
        n += 1
        ends = ends[ends >= n - 1]
        ends = ends[context[ends - (n - 1)] == context[length - n]]
    if found is None:
        return []
    start = int(found) + 1
    return context[start : start + num_draft].tolist()


class _Tokens:
    """A request's tokens as a numpy buffer that grows by doubling."""

    def __init__(self) -> None:
        self.buffer = np.empty(0, dtype=np.int64)
        self.length = 0

    def sync(self, request: Request) -> np.ndarray:
        total = request.num_tokens
        if total < self.length:  # not a prefix any more: start again
            self.length = 0
        if total > self.length:
            if total > len(self.buffer):
                grown = np.empty(max(total, 2 * len(self.buffer), 64), dtype=np.int64)
                grown[: self.length] = self.buffer[: self.length]
                self.buffer = grown
            self.buffer[self.length : total] = request.token_slice(self.length, total)
            self.length = total
        return self.buffer[:total]


class NgramDrafter:
    """Prompt-lookup drafts, from each running request's tokens on the host, matching suffix
    n-grams of ``max_n`` down to ``min_n`` tokens."""

    def __init__(self, min_n: int = NGRAM_MIN, max_n: int = NGRAM_MAX) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.states: dict[int, _Tokens] = {}

    def propose(self, requests: list[Request], limits: list[int]) -> Proposal:
        drafts = []
        for request, limit in zip(requests, limits):
            tokens = self.states.setdefault(request.request_id, _Tokens()).sync(request)
            drafts.append(propose_ngram(tokens, limit, self.max_n, self.min_n))
        return Proposal(drafts, None)

    def accepted(self, request: Request, num_accepted: int) -> None:
        """Nothing to keep: the next proposal appends the accepted tokens."""

    def release(self, request_id: int) -> None:
        self.states.pop(request_id, None)

    def keep_only(self, requests: list[Request]) -> None:
        live = {r.request_id for r in requests}
        for request_id in [i for i in self.states if i not in live]:
            self.release(request_id)


__all__ = ["NGRAM_MAX", "NGRAM_MIN", "NgramDrafter", "propose_ngram"]
