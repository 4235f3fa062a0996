"""Draft-model drafting: a smaller model with the target's tokenizer proposes k tokens.

Per request the drafter keeps its own KV pages (in its own pool, sized by the same memory
plan as the target's) and ``num_computed``: its KV holds ``token_ids[:num_computed]``.
A proposal for a request of L tokens with room for r drafts:
1. draft-extend: one forward over ``token_ids[num_computed:L]`` (the tokens the target
   accepted since the last proposal, or a whole prompt the first time, chunked by the token
   budget) whose last row gives draft 1;
2. r-1 draft steps of one token each: for greedy batches one replay of the draft runner's loop
   graph (all steps, every request: the extra drafts of requests with a smaller r are dropped);
   otherwise step by step, each step taking the previous step's tokens on the device
   (``ForwardBatch.future_rows``), the batch shrinking as requests reach their r.
The drafts reach the host once, at the end. Draft i's KV sits at position L + i - 1; after
verification ``accepted`` keeps the KV of the accepted drafts that were written (at most r-1)
and the rest is overwritten by the next proposal before anything reads it (every read is
bounded by the sequence length).

Invariants: a request whose pages cannot be grown gets no drafts (never an error); pages go
back to the drafter's pool when the request finishes or stops running (``keep_only``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from nanograph.engine.kv_cache import KVCache
from nanograph.engine.request import Request
from nanograph.engine.sampler import Sampler
from nanograph.layers import ops
from nanograph.runners.forward_batch import ForwardBatch
from nanograph.runners.model_runner import ModelRunner
from nanograph.spec.proposal import Proposal


@dataclass
class _DraftState:
    pages: list[int] = field(default_factory=list)
    num_computed: int = 0  # the drafter's KV holds token_ids[:num_computed]
    written: int = 0  # drafts of the last proposal whose KV was written after those tokens


class DraftModelDrafter:
    def __init__(self, runner: ModelRunner, kv: KVCache, sampler: Sampler, token_budget: int):
        self.runner = runner
        self.kv = kv
        self.sampler = sampler
        self.token_budget = token_budget  # the most tokens one catch-up forward holds
        self.states: dict[int, _DraftState] = {}

    def release(self, request_id: int) -> None:
        state = self.states.pop(request_id, None)
        if state is not None:
            self.kv.allocator.free(state.pages)

    def keep_only(self, requests: list[Request]) -> None:
        """Frees the state of every request not in ``requests`` (finished, preempted)."""
        live = {r.request_id for r in requests}
        for request_id in [i for i in self.states if i not in live]:
            self.release(request_id)

    def accepted(self, request: Request, num_accepted: int) -> None:
        """After verification: the KV of the accepted drafts the proposal wrote stays."""
        state = self.states.get(request.request_id)
        if state is not None:
            state.num_computed += min(num_accepted, state.written)
            state.written = 0

    def _room(self, request: Request, limit: int) -> bool:
        """Grows the request's draft pages to hold its tokens and ``limit - 1`` drafts."""
        state = self.states.setdefault(request.request_id, _DraftState())
        # the last token is always recomputed: its logits give the first draft
        state.num_computed = min(state.num_computed, request.num_tokens - 1)
        need = self.kv.pages_needed(request.num_tokens + limit - 1) - len(state.pages)
        if need > self.kv.allocator.num_free:
            return False
        if need > 0:
            state.pages += self.kv.allocator.allocate(need)
        return True

    @torch.inference_mode()
    def propose(self, requests: list[Request], limits: list[int]) -> Proposal:
        """Up to ``limits[i]`` drafts for each request (none where the limit is 0)."""
        active = [i for i, r in enumerate(requests) if limits[i] > 0 and self._room(r, limits[i])]
        if not active:
            return Proposal([[] for _ in requests], None)
        reqs = [requests[i] for i in active]
        sampled = any(not r.params.greedy for r in reqs)
        tokens, probs = [], []  # per draft position: device tokens [n_i] and probs [n_i, V]
        first_logits = self._catch_up(reqs)
        t, p = self._choose(first_logits, reqs, sampled)
        tokens.append(t)
        probs.append(p)
        steps = max(limits[i] for i in active) - 1
        if steps > 0 and not sampled:
            looped = self._loop(reqs, t)
            if looped is not None:  # one graph ran every step, for every request
                by_request = torch.cat([t[None], looped[:steps]]).T.cpu().tolist()  # one read
                drafts = [row[: limits[i]] for row, i in zip(by_request, active)]
                return self._finish(requests, active, limits, drafts)
        rows = list(range(len(reqs)))  # row of each live request in the last step's tokens
        page_size = self.kv.page_size
        for step in range(1, max(limits[i] for i in active)):
            live = [j for j, i in enumerate(active) if limits[i] > step]
            batch = ForwardBatch.build(
                [[0] for _ in live],  # placeholders: the tokens come from the device
                [reqs[j].num_tokens + step - 1 for j in live],
                [self.states[reqs[j].request_id].pages for j in live],
                page_size,
                [True] * len(live),
                [rows[j] for j in live],
            )
            logits = self.runner.forward(batch, tokens[-1], path="draft")
            t, p = self._choose(logits, [reqs[j] for j in live], sampled)
            tokens.append(t)
            probs.append(p)
            rows = {j: k for k, j in enumerate(live)}
        drafts, draft_probs = self._collect(active, limits, tokens, probs, sampled)
        return self._finish(requests, active, limits, drafts, draft_probs)

    def _loop(self, reqs: list[Request], first: torch.Tensor) -> torch.Tensor | None:
        """All draft steps after the first as one graph replay (greedy requests, a loop-mode
        draft runner that takes the batch), ``[steps, len(reqs)]``; else None."""
        runner = self.runner.graph_runners.get("draft")
        if runner is None or not runner.loop_steps:
            return None
        batch = ForwardBatch.build(
            [[0] for _ in reqs],  # placeholders: the first drafts come from the device
            [r.num_tokens for r in reqs],
            [self.states[r.request_id].pages for r in reqs],
            self.kv.page_size,
            [True] * len(reqs),
            list(range(len(reqs))),
        )
        return runner.draft_loop(batch, first)

    def _finish(
        self,
        requests: list[Request],
        active: list[int],
        limits: list[int],
        drafts: list[list[int]],
        draft_probs: torch.Tensor | None = None,
    ) -> Proposal:
        """Records what the proposal wrote and spreads the drafts (one list per active
        request) over all requests."""
        out: list[list[int]] = [[] for _ in requests]
        for j, i in enumerate(active):
            state = self.states[requests[i].request_id]
            state.num_computed = requests[i].num_tokens
            state.written = limits[i] - 1
            out[i] = drafts[j]
        return Proposal(out, draft_probs)

    def _catch_up(self, reqs: list[Request]) -> torch.Tensor:
        """Runs the drafter over each request's tokens it has not seen; returns the logits of
        each request's last token, in order."""
        done = [self.states[r.request_id].num_computed for r in reqs]
        last: dict[int, torch.Tensor] = {}
        while len(last) < len(reqs):
            budget, members, counts = self.token_budget, [], []
            for j, r in enumerate(reqs):
                if j in last or budget == 0:
                    continue
                n = min(r.num_tokens - done[j], budget)
                members.append(j)
                counts.append(n)
                budget -= n
            finishing = [done[j] + n == reqs[j].num_tokens for j, n in zip(members, counts)]
            batch = ForwardBatch.build(
                [reqs[j].token_slice(done[j], done[j] + n) for j, n in zip(members, counts)],
                [done[j] for j in members],
                [self.states[reqs[j].request_id].pages for j in members],
                self.kv.page_size,
                finishing,
            )
            logits = self.runner.forward(batch, path="draft_extend")
            row = 0
            for j, n, fin in zip(members, counts, finishing):
                done[j] += n
                if fin:
                    last[j] = logits[row]
                    row += 1
        return torch.stack([last[j] for j in range(len(reqs))])

    def _choose(
        self, logits: torch.Tensor, reqs: list[Request], sampled: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The drafts of one position (device) and, when any request samples, their q rows."""
        if not sampled:
            return ops.argmax(logits), None
        ids, params = [r.request_id for r in reqs], [r.params for r in reqs]
        probs = self.sampler.probabilities(logits, params)
        noise = self.sampler.exponentials(ids, params, probs.shape[-1])
        return ops.argmax(probs / noise), probs

    @staticmethod
    def _collect(
        active: list[int],
        limits: list[int],
        tokens: list[torch.Tensor],
        probs: list[torch.Tensor | None],
        sampled: bool,
    ) -> tuple[list[list[int]], torch.Tensor | None]:
        """Drafts per active request (one host read) and their q rows in request-major order."""
        host = [t.tolist() for t in torch.cat(tokens).cpu().split([len(t) for t in tokens])]
        drafts: list[list[int]] = [[] for _ in active]
        where: list[list[tuple[int, int]]] = [[] for _ in active]  # (step, row) of each draft
        for step, step_tokens in enumerate(host):
            live = [j for j, i in enumerate(active) if limits[i] > step]
            for row, j in enumerate(live):
                drafts[j].append(step_tokens[row])
                where[j].append((step, row))
        if not sampled:
            return drafts, None
        rows = [probs[s][r] for w in where for s, r in w]
        return drafts, torch.stack(rows)


__all__ = ["DraftModelDrafter", "Proposal"]
