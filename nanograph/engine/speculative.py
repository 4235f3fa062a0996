"""The speculative part of a step: drafts, one verify forward, acceptance, KV rollback.

For the decoding requests of a step (each with room for r_i drafts, ``Scheduler.draft_limit``):
the drafter proposes up to r_i tokens; the target runs one forward over each request's last
token and its drafts (the ``verify`` runner; ``decode`` when no request has a draft) with every
row's logits kept; verification (``nanograph.spec.acceptance``) keeps a + 1 tokens per request.
``apply`` then appends them through the same checks as plain decoding (``StopChecker``: stop
tokens, stop strings, max_tokens, the context length), advances ``num_computed`` by the tokens
whose KV the verify forward wrote and kept (the last token and the a accepted drafts), and
rolls back the rest (``Scheduler.roll_back``: whole pages past the request's tokens go back to
the pool; positions inside a kept page are rewritten before any read, since reads stop at the
sequence length). Only accepted tokens are ever below ``num_computed``, so only they can enter the
prefix cache.

Why the overlap schedule is off for speculative steps: the next step's input (how many tokens
were accepted, hence positions, pages and drafts) depends on this step's verification, which
the host reads before it can schedule again. Non-speculative forwards of the same step
(prefill chunks) run serially too.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from nanograph.engine.config import EngineConfig
from nanograph.engine.request import Request
from nanograph.engine.sampler import Sampler
from nanograph.layers import ops
from nanograph.models import build_model, get_moe_backend
from nanograph.models.config import ModelConfig
from nanograph.models.llama import CausalLM
from nanograph.runners.forward_batch import ForwardBatch
from nanograph.runners.model_runner import ModelRunner
from nanograph.spec.acceptance import greedy_verify, rejection_verify
from nanograph.spec.proposal import Drafter

if TYPE_CHECKING:
    from nanograph.engine.scheduler import Scheduler

# a sampled token into a request's output_ids[index]: its finish reason or None (StopChecker)
Accept = Callable[[Request, int, int], "str | None"]


@dataclass
class SpeculativeStats:
    steps: int = 0  # speculative steps
    verify_forwards: int = 0  # steps whose forward held drafts (the others: a decode batch)
    requests: int = 0  # request-verifications (a request in a verify forward)
    draft_tokens: int = 0  # drafts proposed
    accepted_tokens: int = 0  # drafts accepted
    emitted_tokens: int = 0  # tokens produced (accepted drafts + one target token each)
    # request-verifications with drafts that kept all of them (a draft model's next catch-up is
    # then two tokens, else one)
    all_accepted: int = 0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a request gains per verify forward (1 + accepted drafts)."""
        return self.emitted_tokens / self.requests if self.requests else 0.0

    def as_dict(self) -> dict:
        return {
            "steps": self.steps, "verify_forwards": self.verify_forwards,
            "requests": self.requests, "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens, "emitted_tokens": self.emitted_tokens,
            "all_accepted": self.all_accepted, "mean_accepted_length": self.mean_accepted_length,
        }  # fmt: skip


class SpeculativeDecoder:
    def __init__(
        self,
        runner: ModelRunner,
        sampler: Sampler,
        page_size: int,
        drafter: Drafter,
    ) -> None:
        self.runner = runner
        self.sampler = sampler
        self.page_size = page_size
        self.drafter = drafter
        self.stats = SpeculativeStats()

    def apply(
        self,
        requests: list[Request],
        accepted: list[list[int]],
        accept: Accept,
        scheduler: Scheduler,
    ) -> list[tuple[Request, str | Exception]]:
        """Appends each request's accepted tokens (``step``'s result) through ``accept``, the
        stop checks of plain decoding; advances ``num_computed`` by the tokens whose KV the
        verify forward wrote and kept, and rolls back the rest (the target's pages through
        ``Scheduler.roll_back``, the drafter's state). Returns the requests that ended, each
        with its finish reason or the exception that reading one of its tokens raised: the
        caller finishes and releases them."""
        ended: list[tuple[Request, str | Exception]] = []
        now = time.perf_counter()
        for request, tokens in zip(requests, accepted):
            # the verify forward wrote KV for the last token and the accepted drafts
            request.num_computed += len(tokens)
            if request.first_token_time is None:
                request.first_token_time = now
            reason, index = None, len(request.output_ids)
            try:
                for token in tokens:
                    index = len(request.output_ids)
                    request.output_ids.append(token)
                    if reason := accept(request, index, token):
                        break
            except Exception as e:  # e.g. the tokenizer refusing a token: this request only
                ended.append((request, e))
                continue
            if reason:
                del request.output_ids[index + (reason != "stop-token") :]
                ended.append((request, reason))
                continue
            scheduler.roll_back(request)
            self.drafter.accepted(request, len(tokens) - 1)
        return ended

    def keep_only(self, running: list[Request]) -> None:
        """The drafter gives back the state of requests no longer running (preempted or
        finished)."""
        self.drafter.keep_only(running)

    def release(self, request_id: int) -> None:
        """Forgets a finished request's drafter state."""
        self.drafter.release(request_id)

    @torch.inference_mode()
    def step(self, requests: list[Request], limits: list[int]) -> list[list[int]]:
        """The tokens each request gains (its accepted drafts and one target token). Changes
        no request: the caller applies them."""
        proposal = self.drafter.propose(requests, limits)
        drafts = proposal.drafts
        batch = ForwardBatch.build(
            [r.pending_tokens(1) + d for r, d in zip(requests, drafts)],
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
            accepted = greedy_verify(ops.argmax(logits).tolist(), starts, drafts)
        else:
            accepted = self._rejection(logits, requests, starts, drafts, proposal.probs)
        self.stats.steps += 1
        self.stats.verify_forwards += path == "verify"
        self.stats.requests += len(requests)
        self.stats.draft_tokens += sum(map(len, drafts))
        self.stats.accepted_tokens += sum(len(t) - 1 for t in accepted)
        self.stats.emitted_tokens += sum(map(len, accepted))
        self.stats.all_accepted += sum(1 for t, d in zip(accepted, drafts) if d and len(t) > len(d))
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


def load_draft_model(config: EngineConfig, target: ModelConfig, max_model_len: int) -> CausalLM:
    """The draft model of ``speculative_draft_model_path``, checked against the target: the
    same vocabulary, a context of at least ``max_model_len``. Random weights (``load_format
    dummy``) take the engine's seed, so a target drafting for itself gets its own weights."""
    from nanograph.loader import init_dummy_weights, load_weights, resolve_model

    source = resolve_model(config.speculative_draft_model_path, config.load_format)
    draft = source.config
    if draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"the draft model's vocabulary has {draft.vocab_size} tokens but the target's has "
            f"{target.vocab_size}: use a draft model with the target's tokenizer (e.g. "
            "qwen3-0.6b for qwen3-8b)"
        )
    if draft.max_position_embeddings < max_model_len:
        raise ValueError(
            f"the draft model's context is {draft.max_position_embeddings} tokens, shorter than "
            f"max_model_len={max_model_len}: lower --max-model-len"
        )
    device = config.torch_device
    moe = get_moe_backend(config.moe_backend, device) if draft.is_moe else None
    model = build_model(draft, config.torch_dtype, device, moe)
    if source.kind == "dummy":
        init_dummy_weights(model, seed=config.seed)
    else:
        load_weights(model, source.weights(), progress=config.progress)
    return model


__all__ = ["SpeculativeDecoder", "SpeculativeStats", "load_draft_model"]
