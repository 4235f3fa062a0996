"""One generation request and its life cycle inside the engine.

Invariant: the first ``num_computed`` tokens of ``token_ids`` have their KV in the cache;
the next forward computes ``token_ids[num_computed:]`` (or a chunk of it). When a forward
reaches the end of ``token_ids``, its last row is sampled and one token is appended.
Preemption frees the pages and sets ``num_computed = 0``: recompute rebuilds the same KV.
With prefix caching the first ``num_shared_pages`` of ``pages`` belong to the prefix cache's
tree (``prefix_node`` is the node the request locks); the rest are the request's own.

With the overlap schedule a sampled token is known on the device before the host reads it: its
place in ``output_ids`` holds ``UNRESOLVED`` until the host reads the step that sampled it, and
``future`` (a ``TokenInFlight``) names that step and the token's row in it, so the next forward
can take the token from the device. When step t+1 is launched only the last token can be
unresolved; while steps t and t+1 are both in flight a request can have two (the host reads step
t next).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nanograph.engine.logprobs import TokenLogprob
from nanograph.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from nanograph.engine.engine import _InFlight

UNRESOLVED = -1  # an output token sampled on the device, not read by the host yet


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True)
class TokenInFlight:
    """A request's last sampled token while it is still on the device: row ``row`` of the
    tokens of the launched step ``step``."""

    step: _InFlight
    row: int


@dataclass(eq=False)  # identity: the scheduler looks requests up in its lists every step
class Request:
    request_id: int
    prompt_ids: list[int]
    params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    num_computed: int = 0
    pages: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" | "error"
    error: str | None = None
    # what stopped it: the stop token id or stop string (None for EOS, length, errors: vLLM's)
    stop_reason: int | str | None = None
    text: str = ""
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None
    num_preemptions: int = 0
    future: TokenInFlight | None = None  # the last sampled token, while on the device
    prefix_node: object | None = None  # the prefix cache's node this request locks
    num_shared_pages: int = 0  # pages[:num_shared_pages] are the prefix cache's
    num_cached_tokens: int = 0  # prompt tokens taken from the prefix cache at admission
    # one per resolved output token when params.logprobs is set (engine/logprobs.py)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    # with params.prompt_logprobs: one per prompt token after the first, read in order; the
    # first num_prompt_scored of them are launched (read or in flight)
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    num_prompt_scored: int = 0
    # params.bad_words as token sequences (``penalties.bad_word_ids``), set at admission
    bad_words: tuple[tuple[int, ...], ...] = ()

    @property
    def scores_prompt(self) -> bool:
        """Whether prompt tokens remain to be scored (``prompt_logprobs``)."""
        return (self.params.prompt_logprobs is not None
                and self.num_prompt_scored < len(self.prompt_ids) - 1)  # fmt: skip

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def pending_tokens(self, n: int) -> list[int]:
        """The next ``n`` tokens to compute."""
        return self.token_slice(self.num_computed, self.num_computed + n)

    def token_slice(self, start: int, stop: int) -> list[int]:
        """``token_ids[start:stop]`` without joining prompt and output (a decode step must not
        copy the whole context of every request)."""
        split = len(self.prompt_ids)
        if start >= split:
            return self.output_ids[start - split : stop - split]
        head = self.prompt_ids[start:stop]
        return head + self.output_ids[: stop - split] if stop > split else head

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_pending(self) -> int:
        return self.num_tokens - self.num_computed

    def done_sampling(self, max_model_len: int) -> bool:
        """Whether no further token may be sampled (those in flight already reach the limit)."""
        return len(self.output_ids) >= self.params.max_tokens or self.num_tokens >= max_model_len

    def finish(self, reason: str, error: str | None = None) -> None:
        self.status = Status.FINISHED
        self.finish_reason = reason
        self.error = error
        self.finish_time = time.perf_counter()
