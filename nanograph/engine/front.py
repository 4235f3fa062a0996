"""The engine's async front: asyncio callers submit requests and read their tokens as the engine
resolves them, while the Engine keeps its continuous batch in a loop of its own
(``serving_loop.ServingLoop``). Two fronts run that same loop:
- ``EngineFront`` (``nanograph serve --no-engine-process``): the loop in a thread of the server
  process.
- ``ProcessFront`` (``process_front``, the server's default): the loop in a child process, as
  SGLang and vLLM do. The reason is the GIL: the engine thread blocks on a CUDA sync
  once a step and may then wait up to the interpreter's switch interval (5 ms) while the event
  loop detokenizes and encodes chunks for every stream; a small model's decode step is shorter.

Invariants (both fronts; the loop's own are in ``serving_loop``):
- Callers reach the loop only through commands keyed by the stream's key; they never touch the
  Engine. Each front delivers a batch of the loop's updates to the event loop with one
  ``call_soon_threadsafe``; a consumer that falls behind receives the updates waiting for it
  merged into one.
- The first update of a stream says whether the engine admitted the request; a refused one
  raises ``RequestRejected`` from ``admitted()``: the caller's mistake, reported as such.
- ``submit`` refuses beyond ``max_queue`` waiting requests (the engine's queue at the last
  snapshot plus the adds the loop has not taken yet) and after ``stop``.
- ``stats`` is an immutable snapshot the loop replaced after its last turn: reading it never
  touches the engine.
- ``stop(timeout)`` takes no new request, lets the live ones finish for ``timeout`` seconds,
  aborts the rest and ends the loop; ``close()`` also releases the engine.
- ``failed`` turns True, and stays so, when the loop ends without ``stop`` (its process died,
  its thread raised): the server then shuts down, as vLLM's and SGLang's do.
"""

from __future__ import annotations

import abc
import asyncio
import itertools
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import TYPE_CHECKING

from nanograph.engine.sampling_params import SamplingParams
from nanograph.engine.serving_loop import FrontStats, ServingLoop, Update, Updates

if TYPE_CHECKING:
    from nanograph.engine.engine import Engine
    from nanograph.loader.tokenizer import Tokenizer

__all__ = [
    "EngineFront",
    "Front",
    "FrontStats",
    "QueueFull",
    "RequestRejected",
    "RequestStream",
    "ShuttingDown",
    "Update",
]


class QueueFull(Exception):
    """More requests wait than ``max_queue`` allows; try again later."""


class ShuttingDown(Exception):
    """The front no longer takes requests."""


class RequestRejected(ValueError):
    """The engine refused the request at admission; the message says what to change."""


class RequestStream:
    """One request's updates, for one asyncio consumer (created on the event loop's thread)."""

    def __init__(self, key: int, prompt_ids: list[int], params: SamplingParams) -> None:
        self.key = key  # the front's name for the request in the loop's commands and updates
        self.prompt_ids = prompt_ids
        self.params = params
        self.arrival = time.perf_counter()
        self._updates: asyncio.Queue[Update] = asyncio.Queue()

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
                logprobs = (
                    None if later.logprobs is None else (update.logprobs or []) + later.logprobs
                )
                update = replace(
                    later, token_ids=update.token_ids + later.token_ids, logprobs=logprobs,
                    prompt_logprobs=update.prompt_logprobs or later.prompt_logprobs,
                )  # fmt: skip
            yield update
            if update.finished:
                return


class Front(abc.ABC):
    """The caller's half of a front, on the event loop's thread; subclasses carry the commands
    to the loop (``_send``), run it, and hand its emissions to ``_emitted``."""

    tokenizer: Tokenizer | None
    max_model_len: int

    def __init__(self, max_queue: int, stats: FrontStats) -> None:
        self.max_queue = max_queue
        self._streams: dict[int, RequestStream] = {}  # event loop only: not finished yet
        self._keys = itertools.count()
        self._submitted = 0  # add commands sent
        self._published: tuple[FrontStats, int] = (stats, 0)  # (snapshot, adds the loop saw)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self.failed = False  # the loop ended without ``stop``

    @property
    def stats(self) -> FrontStats:
        snapshot, seen = self._published
        return replace(snapshot, waiting=snapshot.waiting + self._submitted - seen)

    @property
    @abc.abstractmethod
    def running(self) -> bool:
        """The loop serves (False before ``start``, after ``stop`` or its death)."""

    def start(self) -> None:
        """Starts serving; updates go to the running event loop."""
        self._loop = asyncio.get_running_loop()

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> RequestStream:
        if self._stopping or not self.running:
            raise ShuttingDown("the engine is not running (shutting down)")
        if self.stats.waiting >= self.max_queue:
            raise QueueFull(f"{self.max_queue} requests are already waiting")
        stream = RequestStream(next(self._keys), prompt_ids, params)
        self._streams[stream.key] = stream
        self._submitted += 1
        self._send(("add", stream.key, prompt_ids, params))
        return stream

    def abort(self, stream: RequestStream) -> None:
        """Ends the request now and frees its pages (a no-op once it finished)."""
        self._send(("abort", stream.key))

    @abc.abstractmethod
    def stop(self, timeout: float) -> None:
        """Takes no new request, lets the live ones finish for up to ``timeout`` seconds, aborts
        the rest and ends the loop. Blocks until it ended."""

    @abc.abstractmethod
    def close(self) -> None:
        """Ends the loop if it still runs and releases the engine."""

    @abc.abstractmethod
    def _send(self, command: tuple) -> None:
        """Carries a command to the loop (any thread; never blocks)."""

    def _emitted(self, updates: Updates, stats: tuple[FrontStats, int] | None) -> None:
        """The loop's emission (any thread): the stats now, the updates to the event loop."""
        if stats is not None:
            self._published = stats
        if updates and not self._loop.is_closed():  # closed: nobody is left to read them
            self._loop.call_soon_threadsafe(self._deliver, updates)

    def _fail_all(self, error: str) -> None:
        """The loop is gone: every stream not finished yet ends with ``error``."""
        self._deliver([(key, Update([], True, "error", error)) for key in self._streams])

    def _deliver(self, updates: Updates) -> None:
        for key, update in updates:
            stream = self._streams.get(key)
            if stream is None:  # failed already (a dead engine process)
                continue
            if update.finished:
                del self._streams[key]
            stream._updates.put_nowait(update)


class EngineFront(Front):
    """The engine's loop in a thread of this process."""

    def __init__(self, engine: Engine, max_queue: int = 1024) -> None:
        self._engine = engine
        self._commands: queue.SimpleQueue[tuple] = queue.SimpleQueue()
        self._serving = ServingLoop(engine, self._drain, self._emitted)
        super().__init__(max_queue, self._serving.snapshot())
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        super().start()
        self._thread = threading.Thread(target=self._serve, name="nanograph-engine", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            self._serving.run()
        finally:  # an exception goes on to the thread's excepthook, which logs it
            self.failed = not self._stopping
            if self.failed and not self._loop.is_closed():  # adds the loop never took
                self._loop.call_soon_threadsafe(
                    self._fail_all, "internal error: the engine stopped"
                )

    def stop(self, timeout: float) -> None:
        """Takes no new request, lets the live ones finish for up to ``timeout`` seconds, aborts
        the rest and ends the engine thread. Blocks until it ended."""
        self._stopping = True
        self._send(("stop", timeout))
        if self._thread is not None:
            self._thread.join()

    def close(self) -> None:
        """Stops the loop if it runs (aborting what is live) and closes the engine."""
        if self.running:
            self.stop(0)
        self._engine.close()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _send(self, command: tuple) -> None:
        self._commands.put(command)

    def _drain(self, block: bool) -> list[tuple]:
        commands = [self._commands.get()] if block else []
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands
