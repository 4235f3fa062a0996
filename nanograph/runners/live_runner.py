"""One runner served while its graphs are captured: the serving side of background/lazy capture.

``GraphRunner.forward`` hands every batch to ``LiveRunner.forward`` when the runner has one.
It records the batch's size in the histogram (decode: batch size; prefill: token count), counts
the demand for the planned bucket that would take it, lets lazy mode capture that bucket, then
replays a ready graph or returns None (the caller runs the batch eagerly, as it does for any
batch no graph takes).

Invariants:
- Dispatch and replay happen under the capture lease (``LiveCapture.lease``), taken without
  blocking: while a capture holds it, the batch runs eagerly. The set of ready shapes therefore
  changes only between two replays, and a graph serves batches only once it is complete.
- While a capture thread exists, a replay returns a copy of its rows and records the lease's
  ``last_use`` event after it: the capture thread's next use of the static and output buffers
  waits for it on the device, so it never overwrites what a step still reads.
- The ladder is the configured one (``default``) or the one ``plan_ladder`` learns from the
  histogram (``auto``), always a subset of the configured shapes: the static buffers are sized
  at the configured maximum once and never resized or moved while serving.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING

import torch

from nanograph.runners.forward_batch import ForwardBatch
from nanograph.runners.ladder import (
    DECODE_PAD_COST,
    PREFILL_EAGER_BOUND_TOKENS,
    PREFILL_PAD_COST,
    LadderCosts,
    plan_ladder,
)
from nanograph.runners.shape_states import ShapeState, ShapeStates
from nanograph.runners.shapes import MAX_TOKEN_PADDING_RATIO, ShapeKey, choose_shape

if TYPE_CHECKING:
    from nanograph.runners.graph_runner import GraphRunner
    from nanograph.runners.live_capture import LiveCapture

logger = logging.getLogger("nanograph")

# lazy mode captures a bucket the second time a batch needs it: a size seen once (a warm-up
# request, an odd chunk) does not pay a capture on the request path
LAZY_CAPTURE_AFTER = 2
# how often a learned ladder is planned again from the histogram (seconds)
REPLAN_S = 1.0


class LiveRunner:
    def __init__(self, runner: GraphRunner, live: LiveCapture, ladder_mode: str) -> None:
        self.runner, self.live, self.path = runner, live, runner.path
        self.ladder_mode = ladder_mode
        self.states = ShapeStates(runner.shapes)
        # auto: nothing is planned before a batch has been seen
        self.ladder: tuple[ShapeKey, ...] = tuple(runner.shapes) if ladder_mode == "default" else ()
        self.histogram: Counter[int] = Counter()
        self.demand: Counter[ShapeKey] = Counter()  # batches each planned bucket would take
        self.requeued: set[ShapeKey] = set()  # survivors of a pool rebuild, captured again
        self.busy_fallbacks = 0  # batches run eagerly because a capture held the buffers
        # the pool's size after the last capture or eviction (reading the allocator is slow)
        self.pool_bytes = 0
        self._planned_at = float("-inf")
        self.last_forward = float("-inf")  # when a batch last reached this runner
        self._lock = threading.Lock()
        # prefill-like runners (``limit_padding``: a padded row is real GEMM work) price
        # padding as prefill and refuse what their dispatch would refuse
        prefill_like = runner.limit_padding
        self.costs = LadderCosts(
            pad_cost=PREFILL_PAD_COST if prefill_like else DECODE_PAD_COST,
            max_padding_ratio=MAX_TOKEN_PADDING_RATIO if prefill_like else None,
            eager_bound_tokens=PREFILL_EAGER_BOUND_TOKENS if prefill_like else None,
        )
        runner._captured = []
        runner.live = self

    # ---- serving thread ---------------------------------------------------------------------
    def forward(self, batch: ForwardBatch, in_flight: torch.Tensor | None) -> torch.Tensor | None:
        runner, lease = self.runner, self.live.lease
        self.last_forward = time.monotonic()
        wanted = self._observe(batch)
        if self.live.mode == "lazy":
            self.replan_if_due()
            if wanted is not None and self.demand[wanted] >= LAZY_CAPTURE_AFTER:
                self.live.capture(self, wanted)  # a no-op unless the shape is absent/evicted
        if not lease.lock.acquire(blocking=False):
            self.busy_fallbacks += 1
            runner.fallbacks += 1
            return None
        try:
            shape = runner.dispatch(batch)
            if shape is None:
                runner.fallbacks += 1
                return None
            hidden = runner.replay(shape, batch, in_flight)
            if lease.shared_buffers:
                hidden = hidden.clone()
                lease.record_use()
        finally:
            lease.lock.release()
        self.live.budget.touch((self.path, shape))
        return hidden

    def _observe(self, batch: ForwardBatch) -> ShapeKey | None:
        """Records the batch in the histogram; the planned bucket that would take it."""
        fits = batch.max_pages <= self.runner.static.max_pages
        wanted = (
            choose_shape(
                list(self.ladder), batch.num_tokens, batch.num_requests,
                limit_padding=self.runner.limit_padding,
            ) if fits else None
        )  # fmt: skip
        with self._lock:
            self.histogram[batch.num_tokens] += 1
            if wanted is not None:
                self.demand[wanted] += 1
        return wanted

    # ---- planning (capture thread, or the serving thread in lazy mode) -----------------------
    def replan_if_due(self) -> None:
        if self.ladder_mode == "auto" and time.monotonic() - self._planned_at > REPLAN_S:
            self.replan()

    def replan(self) -> None:
        """Learned ladder: the buckets ``plan_ladder`` picks for the histogram so far, within
        what the budget leaves after the other runners' graphs."""
        self._planned_at = time.monotonic()
        with self._lock:
            histogram = dict(self.histogram)
        budget = self.live.budget
        room = None
        if budget.limit is not None:
            others = [k for k in budget.captured() if k[0] != self.path]
            room = budget.limit - budget.predicted(others)
        costs = dataclasses.replace(
            self.costs,
            bytes_per_token=budget.bytes_per_token.get(self.path, 0.0),
            shape_bytes=budget.shape_bytes,
            floor_bytes=budget.floor.get(self.path, 0.0),
        )
        by_tokens = {s.num_tokens: s for s in self.runner.shapes}
        ladder = tuple(by_tokens[t] for t in plan_ladder(histogram, list(by_tokens), costs, room))
        if ladder != self.ladder:
            logger.info(
                "%s ladder learned from %d batches: %s (observed sizes %s)", self.path,
                sum(histogram.values()), [s.num_tokens for s in ladder], _summary(histogram),
            )  # fmt: skip
            with self._lock:  # demand is counted against the ladder's buckets: start over
                self.ladder, self.demand = ladder, Counter()

    def next_shape(self) -> ShapeKey | None:
        """What the capture thread captures next for this runner: survivors of a pool rebuild
        (largest first), then the planned bucket most in demand, ties largest first (smaller
        shapes then reuse its pool memory)."""
        requeued = [s for s in self.requeued if self.states[s] is ShapeState.EVICTED]
        if requeued:
            return max(requeued)
        absent = [s for s in self.ladder if self.states[s] is ShapeState.ABSENT]
        if not absent:
            return None
        with self._lock:
            demand = dict(self.demand)
        return max(absent, key=lambda s: (demand.get(s, 0), s))

    def demand_for(self, shape: ShapeKey) -> int:
        with self._lock:
            return self.demand.get(shape, 0)

    def publish_ready(self) -> None:
        """Points dispatch at the ready shapes (caller holds the lease)."""
        self.runner._captured = list(self.states.ready())

    def stats(self) -> dict:
        with self._lock:
            histogram = dict(sorted(self.histogram.items()))
        return {
            "ladder_mode": self.ladder_mode,
            "configured": [s.num_tokens for s in self.runner.shapes],
            "ladder": [str(s) for s in self.ladder],
            "ready": [str(s) for s in self.states.ready()],
            "states": self.states.counts(),
            "histogram": histogram,
            "failed": {str(s): f"{type(e).__name__}: {e}" for s, e in self.states.errors.items()},
            "busy_fallbacks": self.busy_fallbacks,
            "pool_bytes": self.pool_bytes,
        }


def _summary(histogram: dict[int, int], top: int = 8) -> str:
    common = sorted(histogram.items(), key=lambda kv: -kv[1])[:top]
    return ", ".join(f"{size}: {count}" for size, count in sorted(common))
