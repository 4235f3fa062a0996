"""Decisions every rank must take together: start-up phases, KV pool size, capture outcomes.

Invariants:
- Every function here is a collective over the gloo group: all ranks call it, in the same
  order, with the same ``what``. None of them can hang forever: a dead peer raises at once
  (gloo sees its socket close) and a silent one after the group's timeout.
- A phase that fails on any rank fails on every rank with one message naming each failing
  rank and its error (``TensorParallelError``); with one rank the original exception is raised
  unchanged, so a single-GPU engine reports errors exactly as before.
- A decision that may differ between ranks (pages that fit, shapes that captured) is reduced
  to the one all ranks can keep: the smallest page count, the union of failed shapes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from nanograph.distributed.group import TensorParallel, TensorParallelError


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def agree_failure(
    tp: TensorParallel, what: str, error: BaseException | None
) -> BaseException | None:
    """Shares each rank's outcome of ``what``; returns None if every rank succeeded, else the
    error to act on: this rank's own one with one rank, else a ``TensorParallelError`` that
    names every failing rank."""
    if not tp.enabled:
        return error
    outcomes = tp.all_gather_objects(None if error is None else describe(error))
    failures = [f"rank {r}: {text}" for r, text in enumerate(outcomes) if text is not None]
    if not failures:
        return None
    return TensorParallelError(f"{what} failed on {'; '.join(failures)}")


@contextmanager
def agreed(tp: TensorParallel, phase: str) -> Iterator[None]:
    """Runs a start-up phase; if it raised on any rank, raises on every rank (see module)."""
    error: Exception | None = None
    try:
        yield
    except Exception as e:
        if not tp.enabled:
            raise
        error = e
    failure = agree_failure(tp, phase, error)
    if failure is not None:
        raise failure from error


def agree_min(tp: TensorParallel, value: int) -> int:
    """The smallest ``value`` over the ranks."""
    return min(tp.all_gather_objects(int(value)))


def agree_equal(tp: TensorParallel, what: str, value: Any) -> None:
    """Raises on every rank unless every rank passed an equal ``value`` (e.g. the graph shapes
    each rank will capture: ranks launched separately, by torchrun, parse their own flags)."""
    values = tp.all_gather_objects(value)
    differing = [r for r, v in enumerate(values) if v != values[0]]
    if differing:
        raise TensorParallelError(
            f"{what} differ between ranks: rank 0 has {values[0]!r}, rank {differing[0]} has "
            f"{values[differing[0]]!r}; start every rank with the same engine flags"
        )
