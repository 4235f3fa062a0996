"""Serve while capturing: ``--cuda-graph-capture background|lazy`` over every graph runner.

``LiveCapture`` owns what the runners share: the capture lease, the graph-memory budget, and
(background) the capture thread. ``capture`` turns one shape into a ready graph, evicting
least-recently-replayed graphs first when the budget says so; it runs on the capture thread
(background) or on the serving thread the Nth time a batch needs the shape (lazy).

Invariants (the design is in docs/capture.md):
- One lease for all runners. A capture holds it from the first write into a runner's static
  buffers to the end of its stream's work; the serving thread only tries it and runs eagerly
  when it is held. So replays and captures never overlap on the device, which also keeps the
  graph lane of the attention kernel's split counters to one user at a time (see
  kernels/counters.py).
- A capture never touches live state: its warm-up and capture forwards use the runner's dummy
  batch (every KV write goes to slot -1, every read to the scratch page 0), it never resizes or
  moves the KV pool or the static buffers, and it captures in torch's ``thread_local`` error
  mode (graph/capture.py), which forbids unsafe CUDA calls on the capturing thread only, so the
  serving thread may allocate, synchronise and launch while a capture is open.
- Swapping a graph in (or out) happens under the lease: between two replays.
- A capture that raises (out of memory, an op that cannot be captured, anything else) leaves
  that shape eager with one warning; serving goes on.
- Evicting a graph waits for the device first (its replays may still run) and happens under
  the lease; a pool whose largest graph goes is rebuilt (graph_budget.py says why).
"""

from __future__ import annotations

import gc
import logging
import threading
import time

import torch

from nanograph.runners.graph_budget import Admission, GraphBudget
from nanograph.runners.graph_runner import GraphRunner
from nanograph.runners.live_runner import LiveRunner
from nanograph.runners.shape_states import ShapeState
from nanograph.runners.shapes import ShapeKey

logger = logging.getLogger("nanograph")

CAPTURE_MODES = ("startup", "background", "lazy")
LADDER_MODES = ("default", "auto")


class CaptureLease:
    """The lock over every runner's static buffers and output buffer (see module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.lock = threading.Lock()
        self.device = device
        # True while a capture thread exists: replays hand out copies and record last_use
        self.shared_buffers = False
        self._last_use = torch.cuda.Event() if device.type == "cuda" else None

    def record_use(self) -> None:
        if self._last_use is not None:
            self._last_use.record()

    def order_after_serving(self, stream: torch.cuda.Stream) -> None:
        """Makes ``stream`` (a capture's) wait for every replay and eager step queued so far."""
        stream.wait_stream(torch.cuda.current_stream())  # lazy: this thread's earlier steps
        stream.wait_event(self._last_use)  # background: the serving thread's last replay


class LiveCapture:
    def __init__(
        self,
        runners: dict[str, GraphRunner],
        mode: str,
        ladder_mode: str,
        budget: GraphBudget,
        device: torch.device,
    ) -> None:
        if mode not in CAPTURE_MODES[1:] or ladder_mode not in LADDER_MODES:
            raise ValueError(f"LiveCapture takes background|lazy and default|auto, got {mode}")
        self.mode, self.device = mode, device
        self.budget = budget
        self.lease = CaptureLease(device)
        self.runners = {path: LiveRunner(r, self, ladder_mode) for path, r in runners.items()}
        self.started = time.monotonic()
        self.capture_s = 0.0
        self.captures = 0
        self.timeline: list[tuple[float, str, str]] = []  # (seconds since start, path, shape)
        self.worker = None
        if mode == "background":
            from nanograph.runners.capture_worker import CaptureWorker

            self.worker = CaptureWorker(self)

    def start(self) -> None:
        if self.worker is not None:
            self.worker.start()

    def close(self, timeout: float = 60.0) -> None:
        if self.worker is not None:
            self.worker.stop(timeout)

    def wait(self, timeout: float) -> bool:
        """Blocks until the capture thread has nothing left to capture (True) or ``timeout``."""
        return self.worker is None or self.worker.wait_idle(timeout)

    # ---- capture ------------------------------------------------------------------------
    def capture(self, live: LiveRunner, shape: ShapeKey) -> bool:
        """Captures ``shape`` of ``live`` unless it is ready, failed or being captured; True
        if it became ready."""
        if live.states[shape] not in (ShapeState.ABSENT, ShapeState.EVICTED):
            return False
        key = (live.path, shape)
        admission = self.budget.admit(key)
        if admission is None:
            live.states.over_budget(shape)
            logger.info(
                "%s graph %s alone needs more than the graph memory budget (%.0f MiB): it runs "
                "eagerly", live.path, shape, (self.budget.limit or 0) / 2**20,
            )  # fmt: skip
            return False
        if not live.states.claim(shape):
            return False
        live.requeued.discard(shape)
        start = time.perf_counter()
        with self.lease.lock:
            self._evict(admission)
            try:
                if self.device.type != "cuda":
                    live.runner._capture_one(shape)
                else:
                    stream = live.runner.pool.stream  # every capture into the pool runs there
                    self.lease.order_after_serving(stream)
                    with torch.cuda.stream(stream):
                        live.runner._capture_one(shape)
                    stream.synchronize()  # the buffers are free once the lease is
            except Exception as e:  # OOM, uncapturable op, or a bug: this shape stays eager
                live.states.fail(shape, e)
                logger.warning(
                    "%s graph %s could not be captured and runs eagerly: %s: %s",
                    live.path, shape, type(e).__name__, e,
                )  # fmt: skip
                if self.device.type == "cuda":
                    self._settle_after_failure()
                return False
            live.states.publish(shape)
            live.publish_ready()
        elapsed = time.perf_counter() - start
        self.capture_s += elapsed
        self.captures += 1
        self.timeline.append((time.monotonic() - self.started, live.path, str(shape)))
        self.budget.add(key)
        live.pool_bytes = live.runner.pool_bytes()
        self.budget.calibrate(live.path, live.pool_bytes)
        logger.debug(
            "%s graph %s ready in %.3f s (%s capture), pool %.1f MiB", live.path, shape,
            elapsed, self.mode, live.pool_bytes / 2**20,
        )  # fmt: skip
        excess = self.budget.shrink(key)
        if excess.victims:
            with self.lease.lock:
                self._evict(excess)
        return True

    def _settle_after_failure(self) -> None:
        """The failed capture's warm-up may still run on the device and use the buffers: wait
        for it before the lease is released, then hand its memory back."""
        try:
            torch.cuda.synchronize(self.device)
        except RuntimeError as e:  # a sticky device error: the serving thread will see it too
            logger.error("synchronising after a failed capture: %s", e)
        torch.cuda.empty_cache()

    def _evict(self, admission: Admission) -> None:
        """Drops the victims' graphs and rebuilds the pools that lose their largest graph;
        the caller holds the lease."""
        if not admission.victims:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # replays of the victims may still run
        touched = set()
        for path, shape in admission.victims:
            self._drop(self.runners[path], shape)
            self.budget.evictions += 1
            touched.add(path)
        for path in admission.rebuild:
            live = self.runners[path]
            survivors = live.states.in_state(ShapeState.READY)
            for shape in survivors:
                self._drop(live, shape)
            live.requeued.update(survivors)
            live.runner.release()  # a fresh pool; the old one goes when its graphs have gone
            self.budget.rebuilds += 1
        for path in touched:
            self.runners[path].publish_ready()
            self.runners[path].pool_bytes = self.runners[path].runner.pool_bytes()
        victims = ", ".join(f"{path} {shape}" for path, shape in admission.victims)
        rebuilt = "/".join(sorted(admission.rebuild))
        logger.info(
            "graph memory budget: evicted %s%s", victims,
            f"; rebuilt the {rebuilt} pool" if rebuilt else "",
        )  # fmt: skip
        if admission.rebuild and self.device.type == "cuda":
            gc.collect()
            torch.cuda.empty_cache()

    def _drop(self, live: LiveRunner, shape: ShapeKey) -> None:
        live.states.evict(shape)
        live.runner.graphs.pop(shape, None)
        live.runner.contexts.pop(shape, None)
        self.budget.remove((live.path, shape))
        with live._lock:  # lazy mode captures it again once batches need it again
            live.demand.pop(shape, None)

    # ---- reporting ------------------------------------------------------------------------
    def stats(self) -> dict:
        return {
            "mode": self.mode,
            "captures": self.captures,
            "capture_s": self.capture_s,
            "capturing": self.worker is not None and self.worker.busy,
            "budget": self.budget.as_dict(),
            "paths": {path: live.stats() for path, live in self.runners.items()},
        }

    def summary(self) -> str:
        parts = []
        for path, live in self.runners.items():
            states = live.states.counts()
            parts.append(
                f"{path} {states['ready']}/{len(live.ladder)} planned shapes ready "
                f"({states['failed']} failed, {states['over_budget']} over budget, "
                f"{states['evicted']} evicted), pool {live.pool_bytes / 2**20:.0f} MiB"
            )
        limit = self.budget.limit
        return (
            f"{self.mode} capture: {'; '.join(parts)}; {self.captures} captures in "
            f"{self.capture_s:.1f} s; budget "
            + (f"{limit / 2**20:.0f} MiB" if limit is not None else "none")
        )
