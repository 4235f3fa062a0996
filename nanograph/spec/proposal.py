"""What a drafter hands the verify step, and the interface both drafters implement."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from nanograph.engine.request import Request


@dataclass(frozen=True)
class Proposal:
    drafts: list[list[int]]  # per request, at most its limit
    # [sum of draft counts, V]: the drafter's sampling distribution of each draft, request-major;
    # None when every draft is deterministic (n-gram, or greedy: q is one-hot)
    probs: torch.Tensor | None


class Drafter(Protocol):
    def propose(self, requests: list[Request], limits: list[int]) -> Proposal:
        """Up to ``limits[i]`` drafts for each request (none where the limit is 0)."""

    def accepted(self, request: Request, num_accepted: int) -> None:
        """After verification: ``num_accepted`` of the request's drafts were kept."""

    def release(self, request_id: int) -> None:
        """Forgets a finished request's state."""

    def keep_only(self, requests: list[Request]) -> None:
        """Forgets the state of every request not in ``requests`` (finished, preempted)."""


__all__ = ["Drafter", "Proposal"]
