"""Triton launches that skip the JIT's per-call bookkeeping once a launch has been seen.

Why: ``kernel[grid](...)`` binds and specializes every argument, builds a cache key, checks
globals and prepares launch metadata on each call: tens of microseconds of host time. At an
eager break (the attention launch between two graph segments) that is most of the break, and
eager forwards pay it several times per layer.

Invariants:
- A kernel launched through ``LaunchCache`` takes its tensors first, then its scalars, then
  its constexprs. The cache key holds everything Triton specializes a compiled kernel on, and
  more: the grid, the device, each tensor's dtype and address modulo 16, every scalar and every
  constexpr or launch option by value. Calls with equal keys can share one compiled kernel.
- A key's first launch goes through Triton's normal path, which compiles (or finds) the kernel
  and returns it; later launches call that compiled kernel's launcher with the same arguments
  in signature order, on the current stream (so they are captured like any launch).
- If the compiled-kernel interface differs (another Triton version), the first direct launch
  raises before launching anything; the cache then turns itself off and every launch takes the
  normal path. Under ``TRITON_INTERPRET=1`` it is off from the start.
"""

from __future__ import annotations

import os
from typing import Any

import torch


class LaunchCache:
    """``cache(grid, tensors, scalars, constexprs)`` launches
    ``kernel[grid](*tensors, *scalars, **constexprs)``."""

    MAX_ENTRIES = 4096  # distinct launches remembered; then start over

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.enabled = os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
        self.runners: dict[tuple, tuple[Any, tuple]] = {}
        self.direct_launches = 0  # read by tests: the fast path was taken

    def __call__(
        self, grid: tuple[int, ...], tensors: tuple[torch.Tensor, ...], scalars: tuple,
        constexprs: dict[str, Any],
    ) -> None:  # fmt: skip
        if not self.enabled:
            self.kernel[grid](*tensors, *scalars, **constexprs)
            return
        key = (
            grid,
            tensors[0].get_device(),  # a compiled kernel is loaded per device
            tuple([t.data_ptr() & 15 for t in tensors]),
            tuple([t.dtype for t in tensors]),
            scalars,
            tuple(constexprs.items()),
        )
        entry = self.runners.get(key)
        if entry is None:
            self._first_launch(key, grid, tensors + scalars, constexprs)
            return
        runner, constant_args = entry
        try:
            runner(*tensors, *scalars, *constant_args)
        except (AttributeError, TypeError, SystemError):
            if self.direct_launches:
                raise  # it worked before: a real error, not an interface mismatch
            # Another Triton's compiled-kernel interface: launch through the JIT from now on.
            self.enabled = False
            self.runners.clear()
            self.kernel[grid](*tensors, *scalars, **constexprs)
            return
        self.direct_launches += 1

    def _first_launch(self, key: tuple, grid: tuple, args: tuple, constexprs: dict) -> None:
        compiled = self.kernel[grid](*args, **constexprs)
        if compiled is None:
            return
        names = self.kernel.arg_names[len(args) :]
        if any(n not in constexprs for n in names):
            return  # a constexpr left to its default: this launch always takes the JIT path
        if len(self.runners) >= self.MAX_ENTRIES:
            self.runners.clear()
        grid3 = tuple(grid) + (1,) * (3 - len(grid))
        self.runners[key] = (compiled[grid3], tuple(constexprs[n] for n in names))
