"""The engine's async front: the Engine runs in its own thread with its continuous batch; asyncio
callers submit requests and read their tokens as the engine resolves them.

Invariants:
- Only the engine thread touches the Engine (it is not thread-safe). Callers reach it through one
  thread-safe command queue (add, abort, stop). With no work the thread blocks on that queue, so
  an idle server burns no CPU; with work it drains the queue without blocking between steps.
- After each step the thread publishes, per live request, the output tokens resolved since its
  last publication: the prefix of ``output_ids`` before the first ``UNRESOLVED`` placeholder
  (tokens still on the device are never published). The engine needs no hook for this. A
  published token is final: a finishing request only drops tokens that were still unresolved.
  All of a step's publications reach the event loop in one ``call_soon_threadsafe``; a consumer
  that falls behind receives the updates waiting for it merged into one.
- The first update of a stream says whether the engine admitted the request; one it refuses
  (too long, token ids outside the vocabulary, larger than the KV pool) is ``rejected``: the
  caller's mistake, reported as such. Its last update has ``finished`` set and the finish reason.
- Abort goes through the queue: ``Engine.abort`` frees the request's pages at once and its
  stream ends with ``finish_reason == "abort"``.
- Stats (requests running and waiting, KV pages, tokens in and out, graph replays and eager
  forwards per path, the graph capture's states, ladders and histograms) are an immutable
  snapshot the engine thread replaces after every loop turn: readers never touch the engine.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from nanograph.engine.request import UNRESOLVED, Request, Status
from nanograph.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from nanograph.engine.engine import Engine
    from nanograph.loader.tokenizer import Tokenizer

logger = logging.getLogger("nanograph")


class QueueFull(Exception):
    """More requests wait than ``max_queue`` allows; try again later."""


class ShuttingDown(Exception):
    """The front no longer takes requests."""


class RequestRejected(ValueError):
    """The engine refused the request at admission; the message says what to change."""


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


# the capture stats copy histograms and take locks: not worth doing after every step
CAPTURE_STATS_S = 1.0


class RequestStream:
    """One request's updates, for one asyncio consumer (created on the event loop's thread)."""

    def __init__(self, prompt_ids: list[int], params: SamplingParams) -> None:
        self.prompt_ids = prompt_ids
        self.params = params
        self.arrival = time.perf_counter()
        self._updates: asyncio.Queue[Update] = asyncio.Queue()
        self.request: Request | None = None  # engine thread only
        self.published = 0  # engine thread only: output tokens published so far

    async def admitted(self) -> None:
        """Waits for the engine to take the request; raises ``RequestRejected`` if it refused."""
        first = await self._updates.get()
        if first.rejected:
            raise RequestRejected(first.error or "the request was rejected")
        if first.finished:  # admitted and failed at once (an internal error): ``updates`` says so
            self._updates.put_nowait(first)

    async def updates(self) -> AsyncIterator[Update]:
        """Token updates until (and including) the finishing one; call after ``admitted``.
        Updates that queued up while the consumer was busy come merged into one, so a consumer
        slower than the engine sends fewer, larger chunks instead of falling behind."""
        while True:
            update = await self._updates.get()
            while not update.finished and not self._updates.empty():
                later = self._updates.get_nowait()
                update = replace(later, token_ids=update.token_ids + later.token_ids)
            yield update
            if update.finished:
                return


class EngineFront:
    def __init__(self, engine: Engine, max_queue: int = 1024) -> None:
        self._engine = engine
        self.max_queue = max_queue
        # "cuda" names the constructing thread's current device; the engine thread must use it
        # too (torch.cuda.set_device refuses a device without an index)
        self._device_index = (
            (engine.device.index if engine.device.index is not None
             else torch.cuda.current_device())
            if engine.device.type == "cuda" else None
        )  # fmt: skip
        self.tokenizer: Tokenizer | None = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self._commands: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
        self._live: dict[int, RequestStream] = {}  # engine thread only
        self._pending_adds = 0  # submitted, not yet seen by the engine thread
        self._engine_waiting = 0  # the scheduler's queue at the last snapshot
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._totals = [0, 0]  # prompt tokens admitted, output tokens published
        self.stats = FrontStats()
        self._capture_stats: dict = {}
        self._capture_stats_at = float("-inf")
        self._snapshot()

    # ---- caller side (the event loop's thread) ---------------------------------------------
    def start(self) -> None:
        """Starts the engine thread; its updates go to the running event loop."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="nanograph-engine", daemon=True)
        self._thread.start()

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> RequestStream:
        if self._stopping or not self.running:
            raise ShuttingDown("the engine is not running (shutting down)")
        with self._lock:
            if self._engine_waiting + self._pending_adds >= self.max_queue:
                raise QueueFull(f"{self.max_queue} requests are already waiting")
            self._pending_adds += 1
        stream = RequestStream(prompt_ids, params)
        self._commands.put(("add", stream))
        return stream

    def abort(self, stream: RequestStream) -> None:
        """Ends the request now and frees its pages (a no-op once it finished)."""
        self._commands.put(("abort", stream))

    def stop(self, timeout: float) -> None:
        """Takes no new request, lets the live ones finish for up to ``timeout`` seconds, aborts
        the rest and ends the engine thread. Blocks until it ended."""
        self._stopping = True
        self._commands.put(("stop", time.monotonic() + timeout))
        if self._thread is not None:
            self._thread.join()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ---- engine thread ---------------------------------------------------------------------
    def _run(self) -> None:
        engine = self._engine
        if engine.device.type == "cuda":  # the current device is per thread
            torch.cuda.set_device(self._device_index)
        deadline: float | None = None
        while True:
            block = not engine.has_work() and deadline is None
            for name, arg in self._drain(block):
                if name == "add":
                    self._add(arg)
                elif name == "abort":
                    self._abort(arg, "abort", None)
                elif name == "stop":
                    deadline = arg
            if deadline is not None and time.monotonic() >= deadline:
                for stream in list(self._live.values()):
                    self._abort(stream, "abort", "the server shut down before it finished")
            try:
                if engine.has_work():
                    engine.step()
            except Exception as e:  # a bug: fail the live requests, keep serving the next ones
                logger.exception("engine step failed")
                for stream in list(self._live.values()):
                    self._abort(stream, "error", f"internal error: {e!r}")
            self._publish()
            self._snapshot()
            if deadline is not None and not self._live:
                return

    def _drain(self, block: bool) -> list[tuple[str, object]]:
        commands = [self._commands.get()] if block else []
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

    def _add(self, stream: RequestStream) -> None:
        with self._lock:
            self._pending_adds -= 1
        if self._stopping:
            return self._reply(
                stream, Update([], True, "error", "the server is shutting down", rejected=True)
            )
        try:
            request = self._engine.add_request(stream.prompt_ids, stream.params)
        except Exception as e:  # the engine's own checks raised: this request only
            logger.exception("add_request failed")
            return self._reply(stream, Update([], True, "error", f"internal error: {e!r}"))
        if request.status is Status.FINISHED:
            return self._reply(stream, Update([], True, "error", request.error, rejected=True))
        stream.request = request
        self._live[request.request_id] = stream
        self._totals[0] += len(request.prompt_ids)
        self._reply(stream, Update([]))

    def _abort(self, stream: RequestStream, reason: str, error: str | None) -> None:
        if stream.request is not None and stream.request.request_id in self._live:
            self._engine.abort(stream.request, reason, error)

    def _reply(self, stream: RequestStream, update: Update) -> None:
        self._deliver([(stream, update)])

    def _publish(self) -> None:
        ready = []
        for request_id, stream in list(self._live.items()):
            request = stream.request
            ids = request.output_ids
            resolved = len(ids)
            while resolved and ids[resolved - 1] == UNRESOLVED:
                resolved -= 1
            new = ids[stream.published : resolved]
            stream.published = max(stream.published, resolved)
            self._totals[1] += len(new)
            if request.status is Status.FINISHED:
                del self._live[request_id]
                text = request.text if request.params.stop else None
                update = Update(new, True, request.finish_reason, request.error, text,
                                cached_tokens=request.num_cached_tokens)  # fmt: skip
                ready.append((stream, update))
            elif new:
                ready.append((stream, Update(new)))
        if ready:
            self._deliver(ready)

    def _deliver(self, ready: list[tuple[RequestStream, Update]]) -> None:
        self._loop.call_soon_threadsafe(_put_all, ready)

    def _snapshot(self) -> None:
        engine = self._engine
        allocator = engine.kv_cache.allocator
        self._engine_waiting = len(engine.scheduler.waiting)
        with self._lock:
            pending = self._pending_adds
        self.stats = FrontStats(
            running=len(engine.scheduler.running),
            waiting=self._engine_waiting + pending,
            kv_pages_total=allocator.num_usable,
            kv_pages_free=allocator.num_free,
            kv_pages_available=engine.scheduler.num_available_pages,
            prompt_tokens=self._totals[0],
            output_tokens=self._totals[1],
            forward_counts=engine.runner.forward_counts(),
            graph_capture=self._graph_capture_stats(),
            **_prefix_stats(engine),
        )

    def _graph_capture_stats(self) -> dict:
        now = time.monotonic()
        if now - self._capture_stats_at >= CAPTURE_STATS_S:
            self._capture_stats_at = now
            self._capture_stats = self._engine.graph_capture_stats()
        return self._capture_stats


def _prefix_stats(engine: Engine) -> dict[str, int]:
    if engine.prefix_cache is None:
        return {}
    stats = engine.prefix_cache.stats()
    return {"prefix_queried_tokens": stats.queried_tokens, "prefix_hit_tokens": stats.hit_tokens}


def _put_all(ready: list[tuple[RequestStream, Update]]) -> None:
    for stream, update in ready:
        stream._updates.put_nowait(update)
