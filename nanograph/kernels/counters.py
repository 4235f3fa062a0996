"""Split counters: persistent zeroed int32 buffers for kernels whose last program reduces.

A kernel that splits one output tile's work over several programs (split-KV attention, split-K
few-row products) has each program write its partial, then count itself in with an atomic on
the tile's counter; the program that counts last reduces the partials, then resets the counter
to zero for the next launch. So the buffers are zeroed once, here, and stay zeroed between
launches, with no memset on a forward's path.

Invariants:
- One buffer per device and lane: eager launches use their thread's lane, launches captured
  into a CUDA graph the graph lane. Launches of one lane must not run at the same time: a
  thread's eager launches are ordered on its stream, and a capture thread never replays or
  captures while the serving thread replays (runners/live_capture.py), so a background capture
  on its own thread and stream never shares counters with the serving thread. A kernel launched
  as a programmatic dependent touches its counters only after its wait (kernels/pdl.py), when
  the kernel before it, which may use the same counters, has finished.
- Outgrown buffers are kept, never freed: captured CUDA graphs still point at them.
"""

from __future__ import annotations

import threading

import torch
import triton

_COUNTERS: dict[tuple[torch.device, int | str], list[torch.Tensor]] = {}
_MIN_SIZE = 1024


def split_counters(device: torch.device, size: int) -> torch.Tensor:
    """A zeroed int32 buffer of at least ``size`` counters in this launch's lane, which the
    kernel must leave zeroed."""
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if not capturing:
        # the graph lane grows here too, outside any capture: a buffer first made inside a
        # capture is zero-filled only when that graph replays, and another graph sharing it
        # may replay first (start-up's warm-up runs every launch eagerly before capturing)
        _lane_buffer(device, "graph", size)
    return _lane_buffer(device, "graph" if capturing else threading.get_ident(), size)


def _lane_buffer(device: torch.device, lane: int | str, size: int) -> torch.Tensor:
    buffers = _COUNTERS.setdefault((device, lane), [])
    if not buffers or buffers[-1].numel() < size:
        size = triton.next_power_of_2(max(size, _MIN_SIZE))
        buffers.append(torch.zeros(size, dtype=torch.int32, device=device))
    return buffers[-1]


__all__ = ["split_counters"]
