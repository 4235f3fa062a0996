"""Backends by name: ``get_backend("eager" | "full" | "breakable" | "tc_piecewise")``.

Invariants: importing it touches no CUDA and imports no backend (each is imported when asked
for); a graph backend on a machine without CUDA raises ``GraphCaptureError`` with the fix.
"""

from __future__ import annotations

from typing import Any

import torch

from nanograph.graph.base import BACKEND_NAMES, Backend, GraphCaptureError


def get_backend(name: str, *, debug: bool = False, **options: Any) -> Backend:
    """The backend called `name`: "eager", "full", "breakable" or "tc_piecewise".

    `debug=True` (breakable only) makes the whole fn one eager break: it runs eagerly through the
    same static buffers and replay path. Options: `warmup` (eager runs before capture, default 2)
    for the graph backends, `side_streams` for full/breakable, `compile_backend` (default
    "inductor") and `split_ops` for tc_piecewise.
    """
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown graph backend {name!r}; choose one of {BACKEND_NAMES}")
    if debug and name != "breakable":
        raise ValueError("debug=True is a mode of the 'breakable' backend")
    if name == "eager":
        from nanograph.graph.eager import EagerBackend

        return EagerBackend()
    require_cuda(name)
    if name == "full":
        from nanograph.graph.full import FullBackend

        return FullBackend(**options)
    if name == "breakable":
        from nanograph.graph.breakable import BreakableBackend

        return BreakableBackend(debug=debug, **options)
    from nanograph.graph.piecewise import TcPiecewiseBackend

    return TcPiecewiseBackend(**options)


def require_cuda(backend: str) -> None:
    if not torch.cuda.is_available():
        raise GraphCaptureError(
            f"graph backend {backend!r} needs CUDA, but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}). Use get_backend('eager') on this machine."
        )
