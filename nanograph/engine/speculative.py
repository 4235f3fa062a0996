"""The speculative part of a step: drafts, one verify forward, acceptance, KV rollback.

For the decoding requests of a step (each with room for r_i drafts, ``Scheduler.draft_limit``):
the drafter proposes up to r_i tokens; the target runs one forward over each request's last
token and its drafts (the ``verify`` runner; ``decode`` when no request has a draft) with every
row's logits kept; verification (``nanograph.spec.acceptance``) keeps a + 1 tokens per request.
The engine then appends them through the same checks as plain decoding (stop tokens, stop
strings, max_tokens, the context length), advances ``num_computed`` by the tokens whose KV
the verify forward wrote and kept (the last token and the a accepted drafts), and rolls back
the rest (``Scheduler.roll_back``: whole pages past the request's tokens go back to the pool;
positions inside a kept page are rewritten before any read, since reads stop at the sequence
length). Only accepted tokens are ever below ``num_computed``, so only they can enter the
prefix cache.

Why the overlap schedule is off for speculative steps: the next step's input (how many tokens
were accepted, hence positions, pages and drafts) depends on this step's verification, which
the host reads before it can schedule again. Non-speculative forwards of the same step
(prefill chunks) run serially too.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import torch

from nanograph.engine.request import Request
from nanograph.engine.sampler import Sampler
from nanograph.runners.forward_batch import ForwardBatch
from nanograph.runners.model_runner import ModelRunner
from nanograph.spec.acceptance import greedy_verify, rejection_verify
from nanograph.spec.draft_model import DraftModelDrafter, Proposal
from nanograph.spec.ngram import propose_ngram


@dataclass
class SpeculativeStats:
    steps: int = 0  # verify forwards
    requests: int = 0  # request-verifications (a request in a verify forward)
    draft_tokens: int = 0  # drafts proposed
    accepted_tokens: int = 0  # drafts accepted
    emitted_tokens: int = 0  # tokens produced (accepted drafts + one target token each)

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a request gains per verify forward (1 + accepted drafts)."""
        return self.emitted_tokens / self.requests if self.requests else 0.0

    def as_dict(self) -> dict:
        return {
            "steps": self.steps, "requests": self.requests, "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens, "emitted_tokens": self.emitted_tokens,
            "mean_accepted_length": self.mean_accepted_length,
        }  # fmt: skip


class SpeculativeDecoder:
    def __init__(
        self,
        runner: ModelRunner,
        sampler: Sampler,
        page_size: int,
        drafter: DraftModelDrafter | None,  # None: n-gram drafting
    ) -> None:
        self.runner = runner
        self.sampler = sampler
        self.page_size = page_size
        self.drafter = drafter
        self.stats = SpeculativeStats()

    def propose(self, requests: list[Request], limits: list[int]) -> Proposal:
        if self.drafter is not None:
            return self.drafter.propose(requests, limits)
        return Proposal([propose_ngram(r.token_ids, n) for r, n in zip(requests, limits)], None)

    @torch.inference_mode()
    def step(self, requests: list[Request], limits: list[int]) -> list[list[int]]:
        """The tokens each request gains (its accepted drafts and one target token). Changes
        no request: the caller applies them."""
        proposal = self.propose(requests, limits)
        drafts = proposal.drafts
        batch = ForwardBatch.build(
            [[r.token_ids[-1], *d] for r, d in zip(requests, drafts)],
            [r.num_computed for r in requests],
            [r.pages for r in requests],
            self.page_size,
            [True] * len(requests),
        )
        starts = [0, *itertools.accumulate(batch.query_lens)][:-1]
        # every row is scored: row starts[b] + i follows draft i-1 of request b
        batch = replace(batch, sample_rows=list(range(batch.num_tokens)))
        path = "decode" if batch.mode == "decode" else "verify"
        logits = self.runner.forward(batch, path=path)
        if all(r.params.greedy for r in requests):
            accepted = greedy_verify(logits.argmax(dim=-1).tolist(), starts, drafts)
        else:
            accepted = self._rejection(logits, requests, starts, drafts, proposal.probs)
        self.stats.steps += 1
        self.stats.requests += len(requests)
        self.stats.draft_tokens += sum(map(len, drafts))
        self.stats.accepted_tokens += sum(len(t) - 1 for t in accepted)
        self.stats.emitted_tokens += sum(map(len, accepted))
        return accepted

    def _rejection(
        self,
        logits: torch.Tensor,
        requests: list[Request],
        starts: list[int],
        drafts: list[list[int]],
        draft_probs: torch.Tensor | None,
    ) -> list[list[int]]:
        row_owner = [r for r, d in zip(requests, drafts) for _ in range(len(d) + 1)]
        probs = self.sampler.probabilities(logits, [r.params for r in row_owner])
        draft_owner = [r for r, d in zip(requests, drafts) for _ in d]
        uniforms = self.sampler.uniforms(
            [r.request_id for r in draft_owner], [r.params for r in draft_owner]
        )
        noise = self.sampler.exponentials(
            [r.request_id for r in requests], [r.params for r in requests], probs.shape[-1]
        )
        return rejection_verify(probs, starts, drafts, draft_probs, uniforms, noise)


__all__ = ["SpeculativeDecoder", "SpeculativeStats"]
