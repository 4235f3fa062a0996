"""The background capture thread of ``--cuda-graph-capture background``.

It starts once the engine is ready and captures, one shape at a time, the planned shape most in
demand across the runners (``LiveRunner.next_shape``), through ``LiveCapture.capture``: on its
own thread, on the pool's capture stream, under the capture lease.

Invariants:
- While requests are being served, the thread leaves the buffers to the serving thread for as
  long as its last capture held them (``YIELD_RATIO``): ready graphs serve batches between
  captures, so the hottest shapes, captured first, pay off before the ladder is complete.
- With the configured ladder the thread ends when every shape is ready, failed or over budget;
  it then empties the allocator cache once (its warm-up forwards cached memory on the capture
  stream that the serving stream cannot reuse). With a learned ladder it plans again every
  ``REPLAN_S`` and lives until ``stop``.
- Nothing it raises reaches the serving thread: a failed capture is one shape run eagerly, and
  an unexpected error ends the thread with the graphs captured so far still serving.
- ``stop`` (engine close, interpreter exit) lets the capture in progress finish, then joins.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING

import torch

from nanograph.runners.live_runner import REPLAN_S, LiveRunner
from nanograph.runners.shapes import ShapeKey

if TYPE_CHECKING:
    from nanograph.runners.live_capture import LiveCapture

logger = logging.getLogger("nanograph")

# after a capture that held the buffers t seconds, leave them to the serving thread for
# YIELD_RATIO x t seconds when it is serving (capture then takes at most half the buffer time)
YIELD_RATIO = 1.0
# the serving thread counts as serving if a batch reached a live runner this recently
ACTIVE_WITHIN_S = 0.25


class CaptureWorker:
    def __init__(self, live: LiveCapture) -> None:
        self.live = live
        self.busy = False
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._thread: threading.Thread | None = None
        # set_device needs an index; "cuda" (no index) means the creating thread's device
        device = live.device
        self._device_index = (
            (device.index if device.index is not None else torch.cuda.current_device())
            if device.type == "cuda" else None
        )  # fmt: skip

    def start(self) -> None:
        if self._thread is not None:
            return
        self.live.lease.shared_buffers = True  # before any capture can touch the buffers
        self._thread = threading.Thread(target=self._run, name="nanograph-capture", daemon=True)
        self._thread.start()
        atexit.register(_stop_at_exit, weakref.ref(self))

    def stop(self, timeout: float = 60.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def wait_idle(self, timeout: float) -> bool:
        """True once the thread has nothing left to capture (for now, with a learned ladder)."""
        return self._idle.wait(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        live = self.live
        learned = any(r.ladder_mode == "auto" for r in live.runners.values())
        try:
            if self._device_index is not None:  # the current device is per thread
                torch.cuda.set_device(self._device_index)
            while not self._stop.is_set():
                for runner in live.runners.values():
                    runner.replan_if_due()
                job = self._next_job()
                if job is None:
                    self._idle.set()
                    if not learned:
                        break
                    self._stop.wait(REPLAN_S)
                    continue
                self._idle.clear()
                self.busy = True
                start = time.monotonic()
                live.capture(*job)
                self.busy = False
                if self._serving():
                    self._stop.wait(YIELD_RATIO * (time.monotonic() - start))
        except BaseException:
            logger.exception("the capture thread stopped; graphs captured so far keep serving")
        finally:
            self.busy = False
            with live.lease.lock:  # no capture any more: replays need not copy their rows
                live.lease.shared_buffers = False
            if live.device.type == "cuda" and not self._stop.is_set():
                torch.cuda.empty_cache()
            self._idle.set()
            logger.info("%s", live.summary())

    def _next_job(self) -> tuple[LiveRunner, ShapeKey] | None:
        """The planned shape most in demand across runners (decode first on ties)."""
        best, best_demand = None, -1
        for runner in self.live.runners.values():
            shape = runner.next_shape()
            if shape is not None and (demand := runner.demand_for(shape)) > best_demand:
                best, best_demand = (runner, shape), demand
        return best

    def _serving(self) -> bool:
        now = time.monotonic()
        return any(now - r.last_forward < ACTIVE_WITHIN_S for r in self.live.runners.values())


def _stop_at_exit(ref: weakref.ref) -> None:
    worker = ref()
    if worker is not None:
        worker.stop(timeout=30.0)
