"""Progress bars for long start-up work (weight loading, graph capture), on terminals only."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")


def progress_bar(
    items: Iterable[T], *, desc: str, show: bool = True, total: int | None = None, unit: str = "it"
) -> Iterable[T]:
    """``items`` wrapped in a tqdm bar when ``show`` and stderr is a terminal, else unchanged."""
    if not show or not sys.stderr.isatty():
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, total=total, unit=unit, leave=False)
