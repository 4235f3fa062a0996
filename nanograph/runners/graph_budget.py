"""Graph-memory budget: least-recently-replayed bookkeeping over every runner's captured shapes.

The memory model follows how graph memory is actually held. Each runner captures all its shapes
into one shared pool (smaller shapes reuse the memory of larger ones), so a runner's pool costs
``bytes_per_token`` x its largest captured token count, but never less than its ``floor`` (the
allocator reserves pools in 2 and 20 MiB segments, so a pool holding only small shapes still
costs whole segments), plus ``shape_bytes`` per shape for what each keeps on its own.
``calibrate`` fits them to the allocator after every capture: the first capture into a pool
measures its floor, and a pool that outgrows the prediction raises ``bytes_per_token``; neither
is ever lowered, so a prediction errs on the large side. The consequence for eviction:

- Dropping a graph that is not its pool's largest frees blocks *inside* the pool; the next
  capture reuses them, which is what the model counts. No memory goes back to the driver.
- Dropping a runner's largest graph only shrinks the pool if the pool is rebuilt: every graph of
  that runner is released, the pool's memory goes back to the driver, and the survivors are
  captured again into a fresh pool, largest first. ``admit`` says when that is needed.

A per-shape pool would make every eviction free memory at once, but a ladder's pools would then
cost the *sum* of its shapes (~8x the shared pool for a geometric prefill ladder, ~18x for the
default decode ladder): under a budget that is worse than an occasional rebuild.

Invariants: a key is (path, shape); ``touch`` only reorders (a replay never changes what is
charged); ``admit`` never proposes a victim that is not captured, nor one whose eviction would
not lower the prediction, and proposes nothing when the new shape alone exceeds the limit (it
then stays eager). Thread-safe: replays touch from the
serving thread while the capture thread admits.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from nanograph.runners.shapes import ShapeKey

Key = tuple[str, ShapeKey]  # (runner path, shape)

# Without --cuda-graph-memory the budget is estimated, not measured (measuring means capturing
# the largest shapes before serving, which background/lazy capture avoid). A pool holds about
# the activations of its largest shape, which scale with its tokens from the measured eager
# peak; decode shapes also hold split-attention partials that the prefill peak does not show,
# hence the wide margin. The budget is enforced on measured pool sizes, so an estimate that is
# too low costs evictions (or eager shapes), never an out-of-memory error.
ESTIMATE_MARGIN = 2.0
# ... and never less than this per runner: the allocator reserves a pool in 2 and 20 MiB
# segments, so even a small model's pool holds a few whole segments.
ESTIMATE_POOL_FLOOR = 64 * 2**20


@dataclass(frozen=True)
class Admission:
    """What capturing a new shape takes: graphs to drop first, and the paths whose pools must
    be rebuilt (their largest graph is among the victims)."""

    victims: tuple[Key, ...] = ()
    rebuild: frozenset[str] = field(default_factory=frozenset)


class GraphBudget:
    def __init__(
        self,
        limit: int | None,
        bytes_per_token: dict[str, float],
        shape_bytes: float = 0.0,
    ) -> None:
        self.limit = limit
        self.bytes_per_token = dict(bytes_per_token)
        self.shape_bytes = shape_bytes
        self.floor: dict[str, float] = {}  # per path: the smallest pool measured
        self._captured: OrderedDict[Key, None] = OrderedDict()  # least recently replayed first
        self._lock = threading.Lock()
        self.evictions = 0
        self.rebuilds = 0

    @classmethod
    def planned(
        cls,
        largest_tokens: dict[str, int],
        activation_peak: int,
        peak_tokens: int,
        limit: int | None = None,
    ) -> GraphBudget:
        """The budget of runners whose largest shapes hold ``largest_tokens`` (per path), from
        the eager ``activation_peak`` measured at ``peak_tokens``: ``limit`` bytes when given
        (--cuda-graph-memory), else the estimate (see ESTIMATE_MARGIN)."""
        per_token = ESTIMATE_MARGIN * activation_peak / max(peak_tokens, 1)
        if limit is None:
            limit = sum(
                max(int(per_token * tokens), ESTIMATE_POOL_FLOOR)
                for tokens in largest_tokens.values()
            )
        return cls(limit, dict.fromkeys(largest_tokens, per_token))

    def predicted(self, keys: Iterable[Key]) -> float:
        """Bytes the pools would hold with exactly ``keys`` captured (largest first)."""
        largest: dict[str, int] = {}
        count: dict[str, int] = {}
        for path, shape in keys:
            largest[path] = max(largest.get(path, 0), shape.num_tokens)
            count[path] = count.get(path, 0) + 1
        return sum(
            max(self.floor.get(path, 0.0), self.bytes_per_token.get(path, 0.0) * tokens)
            + self.shape_bytes * count[path]
            for path, tokens in largest.items()
        )

    @property
    def used(self) -> float:
        with self._lock:
            return self.predicted(self._captured)

    def captured(self) -> list[Key]:
        """Captured keys, least recently replayed first."""
        with self._lock:
            return list(self._captured)

    def add(self, key: Key) -> None:
        with self._lock:
            self._captured[key] = None
            self._captured.move_to_end(key)

    def touch(self, key: Key) -> None:
        with self._lock:
            if key in self._captured:
                self._captured.move_to_end(key)

    def remove(self, key: Key) -> None:
        with self._lock:
            self._captured.pop(key, None)

    def admit(self, key: Key) -> Admission | None:
        """How to make room for ``key``: None if it alone exceeds the limit (keep it eager);
        else the least recently replayed victims to drop until the prediction fits."""
        with self._lock:
            if self.limit is None or key in self._captured:
                return Admission()
            if self.predicted([key]) > self.limit:
                return None
            return self._make_room([k for k in self._captured], key)

    def shrink(self, protect: Key) -> Admission:
        """After a capture measured more than predicted: the least recently replayed victims
        (never ``protect``, the shape just captured) to drop until the prediction fits."""
        with self._lock:
            if self.limit is None:
                return Admission()
            return self._make_room([k for k in self._captured if k != protect], protect)

    def _make_room(self, keep: list[Key], key: Key) -> Admission:
        """Victims in least-recently-replayed order, skipping graphs whose eviction would not
        lower the prediction (a shared pool's smaller graphs, when shapes own no bytes)."""
        victims: list[Key] = []
        while self.predicted([*keep, key]) > self.limit:
            now = self.predicted([*keep, key])
            victim = next(
                (k for k in keep if self.predicted([*(x for x in keep if x != k), key]) < now),
                None,
            )
            if victim is None:
                break
            keep.remove(victim)
            victims.append(victim)
        survivors = [*keep, key]
        rebuild = frozenset(
            path for path, shape in victims
            if shape.num_tokens > max((s.num_tokens for p, s in survivors if p == path), default=0)
        )  # fmt: skip
        return Admission(tuple(victims), rebuild)

    def calibrate(self, path: str, pool_bytes: int) -> None:
        """Fits the model of ``path`` to its pool's measured size now (see module docstring)."""
        with self._lock:
            shapes = [s for p, s in self._captured if p == path]
            if not shapes:
                return
            pool = max(pool_bytes - self.shape_bytes * len(shapes), 0)
            largest = max(s.num_tokens for s in shapes)
            per_token = self.bytes_per_token.get(path, 0.0)
            predicted = max(self.floor.get(path, 0.0), per_token * largest)
            if path not in self.floor:
                self.floor[path] = pool
            elif pool > predicted:
                self.bytes_per_token[path] = pool / largest

    def as_dict(self) -> dict:
        return {
            "limit": self.limit,
            "predicted": int(self.used),
            "bytes_per_token": dict(self.bytes_per_token),
            "floor": dict(self.floor),
            "evictions": self.evictions,
            "rebuilds": self.rebuilds,
        }
