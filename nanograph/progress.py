"""Progress bars for long work (weight loading, graph capture, offline generation), on
terminals only."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any, TypeVar

T = TypeVar("T")


def _tqdm(show: bool) -> Any | None:
    """tqdm's class when ``show`` and stderr is a terminal, else None."""
    if not show or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm


def progress_bar(
    items: Iterable[T], *, desc: str, show: bool = True, total: int | None = None, unit: str = "it"
) -> Iterable[T]:
    """``items`` wrapped in a tqdm bar when ``show`` and stderr is a terminal, else unchanged."""
    tqdm = _tqdm(show)
    return items if tqdm is None else tqdm(items, desc=desc, total=total, unit=unit, leave=False)


def counter_bar(total: int, *, desc: str, show: bool = True, unit: str = "it") -> Any | None:
    """A tqdm bar the caller advances (``update`` / ``set_postfix_str`` / ``close``), kept on
    screen when closed; None where ``progress_bar`` would show none."""
    tqdm = _tqdm(show)
    return None if tqdm is None else tqdm(total=total, desc=desc, unit=unit)
