"""Continuous batching with chunked prefill and preemption by recompute.

Each step builds one forward under a token budget (``chunked_prefill_size``):
1. running requests in arrival order: a decoding request takes one token, a request still
   prefilling takes the next chunk of its prompt;
2. waiting requests are admitted while the budget, ``max_num_seqs`` and the KV pool allow.
When the pool cannot give a running request its next page, the most recently admitted running
request is preempted (pages freed, ``num_computed = 0``) and put back at the head of the
queue; it recomputes later and produces the same tokens. A request that could not fit even
alone never gets here: the engine refuses it at admission with ``fits_alone``, the one
admission check, so none stalls the batch.

With a prefix cache (``prefix_cache.py``), an admitted request first takes the longest cached
prefix of its tokens, so admission and the token budget count only the tokens still to compute;
running requests put their computed whole pages into the tree before each step is scheduled,
so a request admitted later shares them, and a waiting request whose next page of prompt a
running request is prefilling right now waits a step for it rather than computing it twice
(requests behind it go first); a short pool evicts unused cached pages before it
preempts or refuses anyone; preemption and finishing keep the computed pages cached (an error
does not: its KV is not trusted). Every page goes back through ``release``.

With speculative decoding (``num_draft_tokens`` = k > 0), a running request that decodes (one
pending token) also gets room for up to k draft tokens to verify: ``num_drafts[i]`` of them,
counted in the token budget and in its pages, never past its ``max_tokens`` or the context
(``draft_limit``), so a request's pages never exceed what ``fits_alone`` checked.

A request that still scores its prompt (``prompt_logprobs``) takes no cached prefix (its
tokens' logits must be computed, as vLLM does) and at most ``SCORED_CHUNK`` tokens a step: the
logits of every row it scores are materialised, rows x vocabulary floats.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from nanograph.engine.kv_cache import KVCache
from nanograph.engine.prefix_cache import PrefixCache
from nanograph.engine.request import Request, Status

# prompt tokens a step scores for one request: 512 x a 152k vocabulary is 311 MB of float32
# logits (twice that with their log-softmax), beside the memory plan's activations
SCORED_CHUNK = 512


@dataclass(frozen=True)
class ScheduledStep:
    requests: list[Request]
    num_new: list[int]  # tokens computed for each request this step
    num_drafts: list[int]  # room for draft tokens verified after them (speculative decoding)


class Scheduler:
    def __init__(
        self,
        kv_cache: KVCache,
        chunked_prefill_size: int,
        max_num_seqs: int,
        max_model_len: int,
        prefix_cache: PrefixCache | None = None,
        num_draft_tokens: int = 0,
    ) -> None:
        self.kv = kv_cache
        self.cache = prefix_cache
        self.max_model_len = max_model_len
        self.chunk = chunked_prefill_size
        self.max_num_seqs = max_num_seqs
        self.num_draft_tokens = num_draft_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    @property
    def num_available_pages(self) -> int:
        """Pages a request could get now: free ones plus cached ones no request reads."""
        cached = self.cache.num_evictable if self.cache is not None else 0
        return self.kv.allocator.num_free + cached

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def draft_limit(self, request: Request) -> int:
        """Draft tokens a decoding request may have verified: at most k, and never so many
        that accepting them all would pass ``max_tokens`` or the context length."""
        left = min(
            request.params.max_tokens - len(request.output_ids),
            self.max_model_len - request.num_tokens,
        )
        return max(0, min(self.num_draft_tokens, left - 1))

    def _grow(self, request: Request, num_tokens: int) -> bool:
        """Gives ``request`` pages for ``num_tokens`` cached tokens; False if the pool is short."""
        need = self.kv.pages_needed(num_tokens) - len(request.pages)
        if need <= 0:
            return True
        if self.cache is not None:
            pages = self.cache.allocate(need)  # evicts unused cached pages if the pool is short
            if pages is None:
                return False
        elif need > self.kv.allocator.num_free:
            return False
        else:
            pages = self.kv.allocator.allocate(need)
        request.pages += pages
        return True

    def release(self, request: Request, keep: bool = True) -> None:
        """Gives back the request's pages; with a prefix cache, ``keep`` caches its computed
        whole pages first."""
        if self.cache is not None:
            self.cache.release(request, keep)
        else:
            self.kv.allocator.free(request.pages)
            request.pages = []

    def roll_back(self, request: Request) -> None:
        """Gives back the request's pages past its tokens: after a verify forward they hold
        only rejected drafts' KV (never shared: the prefix cache holds computed pages only)."""
        keep = max(self.kv.pages_needed(request.num_tokens), request.num_shared_pages)
        if len(request.pages) > keep:
            self.kv.allocator.free(request.pages[keep:])
            del request.pages[keep:]

    def _preempt(self, request: Request) -> None:
        self.release(request)
        request.num_computed = 0
        request.num_preemptions += 1
        request.status = Status.WAITING
        self.running.remove(request)
        self.waiting.appendleft(request)

    def life_pages(self, request: Request) -> int:
        """Pages the request's whole life needs (its prompt and max_tokens, capped at the
        context length)."""
        total = min(len(request.prompt_ids) + request.params.max_tokens, self.max_model_len)
        return self.kv.pages_needed(total)

    def fits_alone(self, request: Request) -> bool:
        """Whether the request's whole life fits the pool: the admission check."""
        return self.life_pages(request) <= self.kv.allocator.num_usable

    def schedule(self) -> ScheduledStep:
        """The step to run."""
        budget = self.chunk
        chosen: list[Request] = []
        num_new: list[int] = []
        num_drafts: list[int] = []
        if self.cache is not None:
            ps = self.kv.page_size
            for request in self.running:
                if request.num_computed // ps > request.num_shared_pages:  # a new whole page
                    self.cache.commit(request)
        for request in list(self.running):
            if request.status is not Status.RUNNING or budget == 0:
                continue  # preempted by an earlier request of this loop
            if request.done_sampling(self.max_model_len):
                continue  # its last token is still in flight: it finishes when that is read
            n = self._chunk(request, budget)
            drafts = min(self.draft_limit(request), budget - n) if request.num_pending == 1 else 0
            while not self._grow(request, request.num_computed + n + drafts):
                # the most recently admitted request not yet given tokens this step
                victim = self.running[-1]
                if victim is request:
                    break
                self._preempt(victim)
            else:
                chosen.append(request)
                num_new.append(n)
                num_drafts.append(drafts)
                budget -= n + drafts
                continue
            # nobody left to preempt: this one waits until pages come back
            self._preempt(request)
        deferred: list[Request] = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            if request.done_sampling(self.max_model_len):
                break  # preempted with its last token in flight: it finishes when that is read
            cached = self.cache is not None and not request.scores_prompt
            queried = self.cache.acquire(request) if cached else 0
            if cached and self._next_page_in_progress(request):
                self.release(request, keep=False)  # the match is taken again next step
                request.num_computed = 0
                deferred.append(self.waiting.popleft())
                continue
            n = self._chunk(request, budget)
            if not self._grow(request, request.num_computed + n):
                if cached:  # undo the match: a waiting request holds no pages
                    self.release(request, keep=False)
                    request.num_computed = 0
                break  # wait for running requests to free pages
            if cached:
                self.cache.count(queried, request.num_computed)
                if not request.num_preemptions:
                    request.num_cached_tokens = request.num_computed
            self.waiting.popleft()
            request.status = Status.RUNNING
            self.running.append(request)
            chosen.append(request)
            num_new.append(n)
            num_drafts.append(0)  # drafts start once it decodes
            budget -= n
        self.waiting.extendleft(reversed(deferred))
        return ScheduledStep(chosen, num_new, num_drafts)

    @staticmethod
    def _chunk(request: Request, budget: int) -> int:
        """The tokens ``request`` computes this step, of ``budget`` left."""
        n = min(request.num_pending, budget)
        # the int compare first: a decoding request (n = 1) costs nothing more per step
        return SCORED_CHUNK if n > SCORED_CHUNK and request.scores_prompt else n

    def _next_page_in_progress(self, request: Request) -> bool:
        """Whether a running request is prefilling the very page of prompt this one would
        compute next after its match (same tokens from the start): it then waits a step and
        takes that page from the tree instead of computing it twice."""
        ps, m = self.kv.page_size, request.num_computed
        if m + ps > request.num_tokens - 1:
            return False  # no further whole page could be shared
        head = request.token_ids[: m + ps]
        return any(
            other.num_computed < m + ps <= len(other.prompt_ids)
            and other.prompt_ids[m : m + ps] == head[m:]
            and other.prompt_ids[:m] == head[:m]
            for other in self.running
        )

    def finish(self, request: Request) -> None:
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:  # preempted while its last token was in flight
            self.waiting.remove(request)
        self.release(request, keep=request.finish_reason != "error")
