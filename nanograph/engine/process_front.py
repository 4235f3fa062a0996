"""The engine in its own process: ``nanograph serve``'s default (``--engine-process``).

Why: with the thread front the engine thread shares the GIL with the event loop. Once a step it
blocks on a CUDA sync (the overlap schedule) and may then wait up to the interpreter's switch
interval (5 ms) to get the GIL back while the handlers detokenize and encode chunks for every
stream; a small model's decode step at a large batch is shorter than that. A child process has
a GIL of its own. SGLang and vLLM split their servers the same way.

The child (a ``spawn`` process: CUDA cannot be forked) builds the Engine from the
``EngineConfig`` and runs the same ``ServingLoop`` as the thread front. Two pipes join them;
every message is a small picklable tuple:
- parent -> child (a ``multiprocessing`` pipe): a list of the loop's commands (``("add", key,
  prompt_ids, params)``, ``("abort", key)``, ``("stop", timeout_s)``), sent by one sender thread
  that batches what the event loop queued, so the event loop never blocks on a full pipe.
- child -> parent (``process_wire``: framed pickles, read in bursts), at start-up: ``("ready",
  tokenizer, max_model_len, stats)`` or ``("failed", exception)``; the parent raises that
  exception from the constructor (a bad model is the ValueError it would be in-process).
- child -> parent, then: ``(updates, stats, graph_capture)`` per emission of the loop (at most
  two a turn: admission replies, then the step's updates with the stats); ``graph_capture``
  only when the loop refreshed it (about once a second).
The parent's receiver thread takes every message waiting in the pipe at once and hands their
updates to the event loop with one ``call_soon_threadsafe``. The tokenizer is the child's,
pickled once in the handshake: the parent never loads the model's files itself.

Invariants (beyond ``front`` and ``serving_loop``):
- The child ignores SIGINT (a terminal's Ctrl-C reaches the whole process group): the parent
  decides when it stops. It stops by itself when the parent's end of the pipe closes.
- If the child dies, every live stream fails with an error update, ``running`` turns False
  (``/health`` answers 503) and ``submit`` refuses with ``ShuttingDown``.
- ``stop`` returns once the child has exited (killed if it outlives its drain by EXIT_WAIT_S).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import pickle
import queue
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from nanograph.engine.engine import Engine
from nanograph.engine.front import Front
from nanograph.engine.process_wire import Reader, enlarge, from_wire, to_wire, write_message
from nanograph.engine.serving_loop import FrontStats, ServingLoop

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from nanograph.engine.config import EngineConfig

logger = logging.getLogger("nanograph")

# how long the child may take to exit once its loop ended (closing the engine) before a kill
EXIT_WAIT_S = 30.0
LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"  # the CLI's


class ProcessFront(Front):
    """The engine's loop in a child process. ``build`` makes the engine from the config there
    (a picklable callable: a module-level function or a class)."""

    def __init__(
        self,
        config: EngineConfig,
        max_queue: int = 1024,
        build: Callable[[EngineConfig], Engine] = Engine,
    ) -> None:
        context = mp.get_context("spawn")
        child_commands, self._commands = context.Pipe(duplex=False)  # (reader, writer)
        updates_in, updates_out = context.Pipe(duplex=False)
        enlarge(updates_out.fileno())
        level = logging.getLogger("nanograph").getEffectiveLevel()
        self._process = context.Process(
            target=_child, args=(child_commands, updates_out, config, build, level),
            name="nanograph-engine", daemon=True,
        )  # fmt: skip
        self._process.start()
        child_commands.close()  # the child's ends: its death then reads as EOF here
        updates_out.close()
        self._updates = updates_in
        self._reader = Reader(updates_in.fileno())
        try:
            hello = self._reader.read()[0]  # the child sends nothing else before a command
        except EOFError:  # it died without a word (killed, out of host memory, a crash)
            self._process.join(EXIT_WAIT_S)
            hello = ("failed", RuntimeError(
                f"the engine process exited with code {self._process.exitcode} before it was "
                "ready (its output above says why)"
            ))  # fmt: skip
        except BaseException:  # Ctrl-C while the model loads: the child ignores SIGINT
            self._process.kill()
            self._close_pipes()
            raise
        if hello[0] == "failed":
            self._process.join(EXIT_WAIT_S)
            self._close_pipes()
            raise hello[1]
        _, self.tokenizer, self.max_model_len, stats = hello
        super().__init__(max_queue, stats)
        self._capture: dict = stats.graph_capture
        self._outbox: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._ended = False  # the child closed the pipe (exited or dying)
        self._stopped = False

    def start(self) -> None:
        super().start()
        self._threads = [
            threading.Thread(target=target, name=name, daemon=True)
            for target, name in ((self._receive, "nanograph-receiver"),
                                 (self._send_all, "nanograph-sender"))
        ]  # fmt: skip
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float) -> None:
        """Takes no new request, lets the live ones finish for up to ``timeout`` seconds, aborts
        the rest and ends the child. Blocks until it exited (killed if it hangs)."""
        if self._stopped:
            return
        self._stopping = self._stopped = True
        if self._threads:
            self._send(("stop", timeout))
            receiver = self._threads[0]  # it ends when the child closes the pipe
            receiver.join(timeout + EXIT_WAIT_S)
            if receiver.is_alive():
                logger.error("the engine process did not stop: killing it")
                self._process.kill()
                receiver.join()
            self._outbox.put(None)  # ends the sender
        else:  # never started: no sender, nobody to deliver to
            try:
                self._commands.send([("stop", timeout)])
            except OSError:
                pass
        self._process.join(timeout + EXIT_WAIT_S)
        if self._process.is_alive():
            logger.error("the engine process did not exit: killing it")
            self._process.kill()
            self._process.join()
        self._close_pipes()

    def close(self) -> None:
        """Stops the child if that was not done (aborting what is live)."""
        self.stop(0)

    @property
    def running(self) -> bool:
        return bool(self._threads) and not self._ended

    def _send(self, command: tuple) -> None:
        self._outbox.put(command)

    def _close_pipes(self) -> None:
        self._commands.close()
        self._updates.close()

    # ---- parent threads --------------------------------------------------------------------
    def _send_all(self) -> None:
        while True:
            batch = [self._outbox.get()]
            while True:
                try:
                    batch.append(self._outbox.get_nowait())
                except queue.Empty:
                    break
            commands = [c for c in batch if c is not None]
            try:
                if commands:
                    self._commands.send(commands)
            except OSError:  # the child is gone; the receiver reports it
                return
            if len(commands) < len(batch):
                return

    def _receive(self) -> None:
        try:
            while True:
                updates, stats = [], None
                for message_updates, message_stats, capture in self._reader.read():
                    if capture is not None:
                        self._capture = capture
                    updates += map(from_wire, message_updates)
                    stats = message_stats or stats
                if stats is not None:
                    stats = (replace(stats[0], graph_capture=self._capture), stats[1])
                self._emitted(updates, stats)
        except (EOFError, OSError):
            pass
        self.failed = not self._stopping
        self._ended = True
        self._process.join(EXIT_WAIT_S)
        code = self._process.exitcode
        if not self._stopping or code != 0:
            logger.error("the engine process ended (exit code %s)", code)
        error = f"internal error: the engine process ended (exit code {code})"
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._fail_all, error)


# ---- the child process ---------------------------------------------------------------------
def _child(
    commands: Connection, updates: Connection, config: EngineConfig,
    build: Callable[[EngineConfig], Engine], level: int,
) -> None:  # fmt: skip
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=sys.stderr)
    out = updates.fileno()
    try:
        engine = build(config)
    except BaseException as e:
        logger.debug("the engine failed to start", exc_info=True)
        write_message(out, ("failed", _portable(e)))
        return
    pipe = _ChildPipe(commands, out)
    serving = ServingLoop(engine, pipe.commands, pipe.emit)
    try:
        write_message(out, ("ready", engine.tokenizer, engine.max_model_len, serving.snapshot()))
        serving.run()
    except OSError:  # the parent is gone (a broken pipe): nobody to serve
        pass
    finally:
        engine.close()
        updates.close()


class _ChildPipe:
    """The loop's command source and emit callback over the pipes."""

    def __init__(self, commands: Connection, out: int) -> None:
        self.conn, self.out = commands, out
        self._capture_sent: dict | None = None

    def commands(self, block: bool) -> list[tuple]:
        commands: list[tuple] = []
        try:
            if block:
                commands += self.conn.recv()
            while self.conn.poll():
                commands += self.conn.recv()
        except EOFError:  # the parent closed its end: stop now
            commands.append(("stop", 0.0))
        return commands

    def emit(self, updates: list, stats: tuple[FrontStats, int] | None) -> None:
        capture = None
        if stats is not None:
            snapshot, seen = stats
            if snapshot.graph_capture is not self._capture_sent:
                capture = self._capture_sent = snapshot.graph_capture
            stats = (replace(snapshot, graph_capture={}), seen)
        write_message(self.out, ([to_wire(key, u) for key, u in updates], stats, capture))


def _portable(error: BaseException) -> BaseException:
    """``error`` if it survives pickling (raised again in the parent), else a RuntimeError with
    its type and message."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
