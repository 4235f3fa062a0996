"""Which graph backend each runner gets: the only place that turns backend names into backends.

Invariants:
- A path's setting resolves once, before any weight is loaded: ``auto`` takes the config's
  default (``EngineConfig.graph_backend``) and steps down from ``full`` to ``breakable`` when
  the model has host-planned ops (``host_planned_ops``); an explicit ``full`` with host-planned
  ops is refused with the alternatives. ``none`` means no runner: the path runs eagerly.
- ``debug_cuda_graph`` turns every captured path into one eager break through the same static
  buffers and replay path (the breakable backend's debug mode).
"""

from __future__ import annotations

from nanograph.attention.base import AttentionBackend
from nanograph.graph import Backend, get_backend


def host_planned_ops(attention: AttentionBackend, moe: object | None) -> list[str]:
    """The model's ops that read the host (not graph-safe), each with its graph-safe
    alternative: they run as eager breaks, and a full graph cannot hold them. ``moe`` is the
    MoE backend of an MoE model (anything with ``name`` and ``graph_safe``), else None."""
    ops = []
    if not attention.graph_safe:
        ops.append(
            f"attention_backend={attention.name!r} reads Python lengths "
            "(graph-safe: attention_backend='triton')"
        )
    if moe is not None and not moe.graph_safe:
        ops.append(
            f"moe_backend={moe.name!r} reads per-expert token counts "
            "(graph-safe: moe_backend='triton')"
        )
    return ops


def resolve_backend(flag: str, setting: str, resolved: str, host_planned: list[str]) -> str | None:
    """The backend name of one path, or None for eager. ``flag`` names the setting in errors
    (e.g. "decode_cuda_graph"); ``setting`` is what the user gave ("auto" or a name) and
    ``resolved`` its value with "auto" replaced by the device's default."""
    name = resolved
    if name == "full" and host_planned and setting == "auto":
        name = "breakable"  # auto: the graph backend that holds host-planned ops
    if name == "full" and host_planned:
        raise ValueError(
            f"{flag}='full' captures the whole forward in one graph, but "
            f"{'; '.join(host_planned)}. Use the graph-safe backend, or "
            f"{flag} 'breakable' or 'tc_piecewise' (they run these ops "
            "eagerly between graph segments) or 'none'."
        )
    return None if name == "none" else name


def make_backend(name: str, debug: bool = False, warmup: int | None = None) -> Backend:
    """The graph backend a runner captures with (``debug``: the breakable debug mode;
    ``warmup``: eager runs before each capture, the backend's default if None)."""
    options = {} if warmup is None else {"warmup": warmup}
    if debug:
        return get_backend("breakable", debug=True, **options)
    return get_backend(name, **options)


__all__ = ["host_planned_ops", "make_backend", "resolve_backend"]
