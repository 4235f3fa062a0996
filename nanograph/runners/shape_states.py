"""The life of one captured shape: absent -> capturing -> ready -> evicted (-> capturing ...).

```
absent --claim--> capturing --publish--> ready --evict--> evicted --claim--> capturing
                      |                                                          |
                      +--fail--> failed (runs eagerly for good; one warning) <---+
  over_budget: absent/evicted shapes that alone exceed the graph-memory budget (eager)
```

Invariants:
- Transitions other than those drawn raise ``ValueError``: a shape is captured by one thread
  at a time (``claim`` is the only way into ``capturing``), and only a finished capture becomes
  ``ready``.
- ``ready()`` is an immutable, sorted tuple replaced as a whole at each transition into or out
  of ``ready``: a reader on another thread sees the set before or after a transition, never
  half of one. The runner dispatches over it, so a graph serves batches only once complete.
- Thread-safe: transitions take a lock; reading ``ready()`` does not need it.
"""

from __future__ import annotations

import enum
import threading

from nanograph.runners.shapes import ShapeKey


class ShapeState(enum.Enum):
    ABSENT = "absent"
    CAPTURING = "capturing"
    READY = "ready"
    EVICTED = "evicted"
    FAILED = "failed"
    OVER_BUDGET = "over_budget"


_ALLOWED = {
    ShapeState.ABSENT: {ShapeState.CAPTURING, ShapeState.OVER_BUDGET},
    ShapeState.CAPTURING: {ShapeState.READY, ShapeState.FAILED},
    ShapeState.READY: {ShapeState.EVICTED},
    ShapeState.EVICTED: {ShapeState.CAPTURING, ShapeState.OVER_BUDGET},
    ShapeState.FAILED: set(),
    ShapeState.OVER_BUDGET: set(),
}


class ShapeStates:
    def __init__(self, shapes: list[ShapeKey]) -> None:
        self._states = dict.fromkeys(sorted(shapes), ShapeState.ABSENT)
        self._ready: tuple[ShapeKey, ...] = ()
        self._lock = threading.Lock()
        self.errors: dict[ShapeKey, BaseException] = {}

    def __getitem__(self, shape: ShapeKey) -> ShapeState:
        return self._states[shape]

    def ready(self) -> tuple[ShapeKey, ...]:
        return self._ready

    def counts(self) -> dict[str, int]:
        with self._lock:
            out = {state.value: 0 for state in ShapeState}
            for state in self._states.values():
                out[state.value] += 1
            return out

    def in_state(self, *states: ShapeState) -> list[ShapeKey]:
        with self._lock:
            return [s for s, state in self._states.items() if state in states]

    def claim(self, shape: ShapeKey) -> bool:
        """Moves an absent or evicted shape to capturing; False if it is in any other state
        (another thread has it, or it is ready, failed or over budget)."""
        with self._lock:
            if self._states[shape] not in (ShapeState.ABSENT, ShapeState.EVICTED):
                return False
            self._states[shape] = ShapeState.CAPTURING
            return True

    def publish(self, shape: ShapeKey) -> None:
        self._move(shape, ShapeState.READY)

    def fail(self, shape: ShapeKey, error: BaseException) -> None:
        self._move(shape, ShapeState.FAILED)
        self.errors[shape] = error

    def evict(self, shape: ShapeKey) -> None:
        self._move(shape, ShapeState.EVICTED)

    def over_budget(self, shape: ShapeKey) -> None:
        self._move(shape, ShapeState.OVER_BUDGET)

    def _move(self, shape: ShapeKey, to: ShapeState) -> None:
        with self._lock:
            now = self._states[shape]
            if to not in _ALLOWED[now]:
                raise ValueError(f"shape {shape}: {now.value} -> {to.value} is not a transition")
            self._states[shape] = to
            if ShapeState.READY in (now, to):
                ready = (s for s, state in self._states.items() if state is ShapeState.READY)
                self._ready = tuple(sorted(ready))
