"""The engine side of a front: one loop that owns the Engine, takes commands, steps the engine and
publishes every request's new tokens. The thread front runs it in a thread of the server process;
the process front runs the same loop in a child process (``process_front``), so both serve alike.

Commands are small picklable tuples keyed by the caller's request key (any hashable, assigned by
the caller): ``("add", key, prompt_ids, params)``, ``("abort", key)``, ``("stop", timeout_s)``.
The loop hands its results to ``emit(updates, stats)``: ``updates`` a list of ``(key, Update)``,
``stats`` None or a ``(FrontStats, adds_seen)`` pair.

Invariants:
- Only the loop's thread touches the Engine (it is not thread-safe). With no work the loop
  blocks on its command source, so an idle server burns no CPU; with work it drains the
  commands without blocking between steps.
- After each step the loop publishes, per live request, the output tokens resolved since its
  last publication: the prefix of ``output_ids`` before the first ``UNRESOLVED`` placeholder
  (tokens still on the device are never published). The engine needs no hook for this. A
  published token is final: a finishing request only drops tokens that were still unresolved.
  A turn emits at most twice: the replies to the adds it drained (before the step, so a refusal
  never waits for a long step), then the step's publications with the stats snapshot.
- The first update of a request says whether the engine admitted it; one it refuses (too long,
  token ids outside the vocabulary, larger than the KV pool) is ``rejected``. Its last update
  has ``finished`` set and the finish reason.
- Abort calls ``Engine.abort`` at once: the request's pages are free before the next step and its
  stream ends with ``finish_reason == "abort"``. An unknown or finished key is a no-op.
- Stop: adds after it are rejected; the live requests may finish for ``timeout_s``, the rest are
  aborted; ``run`` returns once none is live.
- An exception from ``Engine.step`` fails every live request (``finish_reason == "error"``) and
  the loop goes on serving the next ones. Once the engine says it is ``broken`` (no step can
  run any more) every live request fails and ``run`` returns; the front reports its loop
  failed.
- Stats are a fresh immutable snapshot after every turn; ``waiting`` counts the requests
  admitted and not yet running (the scheduler's queue and the structured outputs still
  compiling), and ``adds_seen`` the add commands taken so far, from which the caller counts the adds
  still on their way (submitted minus seen) consistently with that snapshot.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from nanograph.engine.logprobs import TokenLogprob
from nanograph.engine.request import UNRESOLVED, Status

if TYPE_CHECKING:
    from nanograph.engine.engine import Engine
    from nanograph.engine.request import Request

logger = logging.getLogger("nanograph")

# the capture stats copy histograms and take locks: not worth doing after every step
CAPTURE_STATS_S = 1.0


@dataclass(frozen=True)
class Update:
    """What one publication tells a stream."""

    token_ids: list[int]  # newly resolved output tokens, in order
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    error: str | None = None
    # the engine's text when it tracks one (stop strings): cut before the stop string
    text: str | None = None
    rejected: bool = False
    cached_tokens: int = 0  # on the last update: prompt tokens taken from the prefix cache
    # one (log-probability, top alternatives) per token of token_ids when the request asked
    logprobs: list[TokenLogprob] | None = None
    stop_reason: int | str | None = None  # on the last update: the stop token id or string
    # the prompt's scores (SamplingParams.prompt_logprobs), one per prompt token after the
    # first, on the first update once all are read (before or with the first token)
    prompt_logprobs: list[TokenLogprob] | None = None


@dataclass(frozen=True)
class FrontStats:
    running: int = 0
    waiting: int = 0
    kv_pages_total: int = 0
    kv_pages_free: int = 0  # in the pool, holding nothing
    # free plus prefix-cached pages no request reads (evicted on demand): what requests can get
    kv_pages_available: int = 0
    prompt_tokens: int = 0  # of admitted requests
    output_tokens: int = 0  # published
    # path -> {"graph": replays, "eager": forwards}
    forward_counts: dict[str, dict[str, int]] = field(default_factory=dict)
    # prefix cache: tokens a match could have covered, and covered, summed over admissions
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0
    # background/lazy capture: Engine.graph_capture_stats() (states, ladders, histograms,
    # budget), refreshed every CAPTURE_STATS_S; empty with start-up capture
    graph_capture: dict = field(default_factory=dict)
    # speculative decoding: SpeculativeStats.as_dict() (drafts proposed and accepted, ...);
    # empty with speculation off
    speculative: dict = field(default_factory=dict)


Updates = list[tuple[Hashable, Update]]
Emit = Callable[[Updates, tuple[FrontStats, int] | None], None]
# blocks for at least one command when asked to, else returns what is there (maybe nothing)
Commands = Callable[[bool], list[tuple]]


class _Live:
    __slots__ = ("request", "published", "scores_due")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.published = 0  # output tokens published so far
        self.scores_due = request.params.prompt_logprobs is not None  # not published yet

    def take_scores(self) -> list[TokenLogprob] | None:
        """The prompt's scores, once, when all are read."""
        request = self.request
        if not self.scores_due or len(request.prompt_logprobs) < len(request.prompt_ids) - 1:
            return None
        self.scores_due = False
        return list(request.prompt_logprobs)


class ServingLoop:
    def __init__(self, engine: Engine, commands: Commands, emit: Emit) -> None:
        self.engine = engine
        self._commands, self._emit = commands, emit
        # "cuda" names the constructing thread's current device; the loop's thread must use it
        # too (torch.cuda.set_device refuses a device without an index)
        self._device_index = (
            (engine.device.index if engine.device.index is not None
             else torch.cuda.current_device())
            if engine.device.type == "cuda" else None
        )  # fmt: skip
        self._live: dict[Hashable, _Live] = {}
        self._adds_seen = 0
        self._totals = [0, 0]  # prompt tokens admitted, output tokens published
        self._capture_stats: dict = {}
        self._capture_stats_at = float("-inf")

    def run(self) -> None:
        engine = self.engine
        if self._device_index is not None:  # the current device is per thread
            torch.cuda.set_device(self._device_index)
        deadline: float | None = None
        while True:
            replies: Updates = []
            for command in self._commands(not engine.has_work() and deadline is None):
                if command[0] == "add":
                    replies.append(self._add(*command[1:], stopping=deadline is not None))
                elif command[0] == "abort":
                    self._abort(command[1], "abort", None)
                elif command[0] == "stop" and deadline is None:
                    deadline = time.monotonic() + command[1]
            if replies:
                self._emit(replies, None)
            if deadline is not None and time.monotonic() >= deadline:
                for key in list(self._live):
                    self._abort(key, "abort", "the server shut down before it finished")
            try:
                if engine.has_work():
                    engine.step()
            except Exception as e:  # a bug: fail the live requests, keep serving the next ones
                logger.exception("engine step failed")
                for key in list(self._live):
                    self._abort(key, "error", f"internal error: {e!r}")
            broken = engine.broken
            if broken is not None:  # no later step can run: end what is live, and the loop
                logger.error("the engine cannot serve any more: %s", broken)
                for key in list(self._live):
                    self._abort(key, "error", f"the engine cannot serve any more: {broken}")
            self._emit(self._publish(), (self.snapshot(), self._adds_seen))
            if broken is not None or (deadline is not None and not self._live):
                return

    def _add(self, key: Hashable, prompt_ids: list[int], params, stopping: bool):
        self._adds_seen += 1
        if stopping:
            return key, Update([], True, "error", "the server is shutting down", rejected=True)
        try:
            request = self.engine.add_request(prompt_ids, params)
        except Exception as e:  # the engine's own checks raised: this request only
            logger.exception("add_request failed")
            return key, Update([], True, "error", f"internal error: {e!r}")
        if request.status is Status.FINISHED:
            return key, Update([], True, "error", request.error, rejected=True)
        self._live[key] = _Live(request)
        self._totals[0] += len(request.prompt_ids)
        return key, Update([])

    def _abort(self, key: Hashable, reason: str, error: str | None) -> None:
        live = self._live.get(key)
        if live is not None:  # its finishing update goes out with the next publication
            self.engine.abort(live.request, reason, error)

    def _publish(self) -> Updates:
        ready: Updates = []
        for key, live in list(self._live.items()):
            request = live.request
            ids = request.output_ids
            resolved = len(ids)
            while resolved and ids[resolved - 1] == UNRESOLVED:
                resolved -= 1
            new = ids[live.published : resolved]
            # every resolved token has its logprobs (the engine appends them as it resolves)
            logprobs = (
                request.logprobs[live.published : resolved]
                if request.params.logprobs is not None else None
            )  # fmt: skip
            live.published = max(live.published, resolved)
            self._totals[1] += len(new)
            if request.status is Status.FINISHED:
                del self._live[key]
                text = request.text if request.params.stop else None
                update = Update(new, True, request.finish_reason, request.error, text,
                                cached_tokens=request.num_cached_tokens, logprobs=logprobs,
                                stop_reason=request.stop_reason,
                                prompt_logprobs=live.take_scores())  # fmt: skip
                ready.append((key, update))
            elif new:
                scores = live.take_scores()
                ready.append((key, Update(new, logprobs=logprobs, prompt_logprobs=scores)))
        return ready

    def snapshot(self) -> FrontStats:
        """The engine's stats now (the loop's thread, or before the loop runs)."""
        engine = self.engine
        allocator = engine.kv_cache.allocator
        return FrontStats(
            running=len(engine.scheduler.running),
            waiting=engine.num_waiting,
            kv_pages_total=allocator.num_usable,
            kv_pages_free=allocator.num_free,
            kv_pages_available=engine.scheduler.num_available_pages,
            prompt_tokens=self._totals[0],
            output_tokens=self._totals[1],
            forward_counts=engine.runner.forward_counts(),
            graph_capture=self._graph_capture_stats(),
            speculative=(
                engine.speculative.stats.as_dict() if engine.speculative is not None else {}
            ),
            **_prefix_stats(engine),
        )

    def _graph_capture_stats(self) -> dict:
        now = time.monotonic()
        if now - self._capture_stats_at >= CAPTURE_STATS_S:
            self._capture_stats_at = now
            self._capture_stats = self.engine.graph_capture_stats()
        return self._capture_stats


def _prefix_stats(engine: Engine) -> dict[str, int]:
    if engine.prefix_cache is None:
        return {}
    stats = engine.prefix_cache.stats()
    return {"prefix_queried_tokens": stats.queried_tokens, "prefix_hit_tokens": stats.hit_tokens}
