"""Triton launches that skip the JIT's per-call bookkeeping once a launch has been seen.

Why: ``kernel[grid](...)`` binds and specializes every argument, builds a cache key, checks
globals and prepares launch metadata on each call: tens of microseconds of host time. At an
eager break (the attention launch between two graph segments) that is most of the break, and
eager forwards pay it several times per layer.

Invariants:
- A kernel launched through ``LaunchCache`` takes its tensors first, then its TMA
  descriptors, then its scalars, then its constexprs. The cache key holds everything Triton
  specializes a compiled kernel on, and more: the grid, the device, each tensor's dtype and
  address modulo 16 (a descriptor's block too), every scalar and every constexpr or launch
  option by value.
  Calls with equal keys can share one compiled kernel.
- A key's first launch goes through Triton's normal path, which compiles (or finds) the kernel
  and returns it; later launches call that compiled kernel's launcher with the same arguments
  in signature order, on the current stream (so they are captured like any launch), each
  tensor as its address: the launcher then takes the integer as the device pointer, where for
  a tensor it calls ``data_ptr()`` and asks the driver to check the pointer
  (``cuPointerGetAttribute``), once per tensor argument per launch. So a direct launch does
  not catch a tensor on the wrong device (the key holds the first tensor's device only): the
  kernels' callers pass tensors of the GPU they run on.
- Under Triton 3.6 a direct launch calls the compiled kernel's C launcher itself
  (``_lean_launch``): no per-call device, stream-handle and metadata lookups in Python, no
  empty launch-hook calls, and a TMA descriptor encoded once per descriptor object (the
  descriptors passed here are ``kernels.tma``'s, cached by what they are made of: an object
  never changes). Elsewhere, or with scratch memory or a launch hook, the compiled kernel's
  own runner launches.
- If the compiled-kernel interface differs (another Triton version), the first direct launch
  raises before launching anything; the cache then turns itself off and every launch takes the
  normal path. Under ``TRITON_INTERPRET=1`` it is off from the start.
- Inside ``parallel_compiles`` a cache made with ``compile_ahead=True`` launches nothing: it
  hands the launch's compile to Triton's thread pool and returns False (its caller then writes
  its output itself). Start-up uses this to compile the attention kernel's many variants at
  once (each took 1-18 s of one core cold on the H200, 61 s for the 17 of bf16 in a row).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

_COMPILE_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("compile_only", default=False)


@contextlib.contextmanager
def parallel_compiles(workers: int) -> Iterator[list[Future] | None]:
    """Triton compiles inside the block run on ``workers`` threads (Triton's compiler leaves the
    GIL while it works); ``compile_ahead`` caches submit their compiles and launch nothing,
    every other launch waits for its own compile. On exit every compile has finished and sits
    in Triton's caches. Yields the compiles submitted so far (a list that grows: for progress),
    or None, changing nothing, where Triton cannot compile asynchronously (no
    ``AsyncCompileMode``, or the interpreter)."""
    async_compile = _async_compile()
    if async_compile is None or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        yield None
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="triton-compile") as pool:
        # the mode's exit waits for every compile, before the pool shuts down
        with async_compile.AsyncCompileMode(pool) as mode:
            token = _COMPILE_ONLY.set(True)
            try:
                yield mode.raw_futures
            finally:
                _COMPILE_ONLY.reset(token)


def _async_compile() -> Any:
    """Triton's asynchronous-compile module (Triton 3.4 and later), or None. Imported on use:
    importing triton decorates its language's own functions, and TRITON_INTERPRET must be
    settled by then (the CPU tests set it when they import the kernels)."""
    try:
        from triton.runtime import _async_compile
    except ImportError:  # older Triton, or none (CPU installs)
        return None
    return _async_compile


def _compiled(kernel: Any) -> Any:
    """The compiled kernel of a launch: under ``parallel_compiles`` the JIT returns a future
    (``FutureKernel``), which subscripting does not reach through."""
    async_compile = _async_compile()
    if async_compile is not None and isinstance(kernel, async_compile.FutureKernel):
        return kernel.result()
    return kernel


def _alignment_and_dtype(t: Any) -> tuple:
    """What Triton specializes a descriptor argument on: its base's address mod 16, dtype and
    block (its address, shape and strides are runtime values like a tensor's address); for a
    tensor in a descriptor's place, what a tensor's pass records. Called per descriptor only:
    a call per argument cost ~1.6 us more a launch than the plain passes over the tensors."""
    if isinstance(t, torch.Tensor):
        return t.data_ptr() & 15, t.dtype
    return t.base.data_ptr() & 15, t.base.dtype, tuple(t.block_shape)


class LaunchCache:
    """``cache(grid, tensors, scalars, constexprs, descriptors)`` launches
    ``kernel[grid](*tensors, *descriptors, *scalars, **constexprs)``; ``descriptors`` are TMA
    descriptors (or tensors standing in their places), apart so that the tensors' pass stays
    plain."""

    MAX_ENTRIES = 4096  # distinct launches remembered; then start over

    def __init__(self, kernel: Any, compile_ahead: bool = False) -> None:
        self.kernel = kernel
        self.compile_ahead = compile_ahead
        self.enabled = os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
        self.runners: dict[tuple, tuple[Any, tuple]] = {}
        self.direct_launches = 0  # read by tests: the fast path was taken

    def __call__(
        self, grid: tuple[int, ...], tensors: tuple[torch.Tensor, ...], scalars: tuple,
        constexprs: dict[str, Any], descriptors: tuple = (),
    ) -> bool:  # fmt: skip
        """Launches; False where it only compiled (``compile_ahead`` in ``parallel_compiles``)."""
        if self.compile_ahead and _COMPILE_ONLY.get():
            self.kernel.warmup(*tensors, *descriptors, *scalars, grid=grid, **constexprs)
            return False
        if not self.enabled:
            self.kernel[grid](*tensors, *descriptors, *scalars, **constexprs)
            return True
        # plain passes over the tensors: every eager launch pays for the key
        args = [t.data_ptr() for t in tensors]
        layout = (tuple([p & 15 for p in args]), tuple([t.dtype for t in tensors]))
        if descriptors:  # passed as they are (a tensor in a descriptor's place as its address)
            layout += tuple([_alignment_and_dtype(d) for d in descriptors])
            args += [d.data_ptr() if isinstance(d, torch.Tensor) else d for d in descriptors]
        key = (
            grid,
            tensors[0].get_device(),  # a compiled kernel is loaded per device
            layout,
            scalars,
            tuple(constexprs.items()),
        )
        entry = self.runners.get(key)
        if entry is None:
            self._first_launch(key, grid, tensors + descriptors + scalars, constexprs)
            return True
        runner, constant_args = entry
        try:
            runner(*args, *scalars, *constant_args)
        except (AttributeError, TypeError, SystemError):
            if self.direct_launches:
                raise  # it worked before: a real error, not an interface mismatch
            # Another Triton's compiled-kernel interface: launch through the JIT from now on.
            self.enabled = False
            self.runners.clear()
            self.kernel[grid](*tensors, *descriptors, *scalars, **constexprs)
            return True
        self.direct_launches += 1
        return True

    def _first_launch(self, key: tuple, grid: tuple, args: tuple, constexprs: dict) -> None:
        compiled = _compiled(self.kernel[grid](*args, **constexprs))
        if compiled is None:
            return
        names = self.kernel.arg_names[len(args) :]
        if any(n not in constexprs for n in names):
            return  # a constexpr left to its default: this launch always takes the JIT path
        if len(self.runners) >= self.MAX_ENTRIES:
            self.runners.clear()
        grid3 = tuple(grid) + (1,) * (3 - len(grid))
        runner = compiled[grid3]  # loads the kernel's module: before any lean launch
        descriptor_slots = [i for i, a in enumerate(args) if _is_descriptor(a)]
        lean = _lean_launch(compiled, grid3, descriptor_slots)
        self.runners[key] = (lean or runner, tuple(constexprs[n] for n in names))


def _is_descriptor(arg: Any) -> bool:
    return hasattr(arg, "block_shape") and not isinstance(arg, torch.Tensor)


_ENCODED_MAX = 1024  # TMA descriptors' encodings remembered; then start over
_LEAN_TRITON = ("3.6.",)  # Triton versions whose C launcher ``_lean_launch`` calls


def _lean_launch(compiled: Any, grid3: tuple, descriptor_slots: list[int]) -> Any | None:
    """A direct launch of ``compiled`` that calls its C launcher itself (Triton 3.6's
    ``CudaLauncher``), or None under another Triton, where the launcher is not that one, the
    kernel needs scratch memory or a launch hook is set (then the compiled kernel's own runner
    launches).

    Why: per call, the runner looks up the device and stream, builds launch metadata, checks
    for scratch memory and hands the launch hooks (empty chains, still called) to the C
    launcher, and a kernel with TMA descriptors encodes each one again
    (``fill_tma_descriptor``: six for the Hopper extend, every eager attention launch). This
    keeps one call to the current stream's lookup, and each descriptor's encoding per
    descriptor object: ``kernels.tma`` caches those by what they are made of, so the same
    object is the same descriptor (an object stays referenced while its encoding is kept, so
    its id is not reused)."""
    try:
        import triton
        from triton import knobs

        if not triton.__version__.startswith(_LEAN_TRITON):
            return None  # another C launcher signature (3.9's takes its arguments differently)
        run = compiled.run
        c_launch, function, metadata = run.launch, compiled.function, compiled.packed_metadata
        cooperative, pdl = run.launch_cooperative_grid, run.launch_pdl
        scratch = run.global_scratch_size or run.profile_scratch_size
        hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
        stream = _current_stream()
    except (ImportError, AttributeError, RuntimeError):
        return None
    if scratch or any(h is not None and getattr(h, "calls", True) for h in hooks):
        return None
    closure = getattr(c_launch, "__closure__", None)
    if closure:  # a launcher wrapped to encode TMA descriptors (wrap_handle_tensordesc)
        cells = dict(zip(c_launch.__code__.co_freevars, (c.cell_contents for c in closure)))
        encode = c_launch.__globals__.get("make_tensordesc_arg")
        wanted = {"launcher", "tensordesc_indices", "tensordesc_meta"}
        if (encode is None or not wanted <= cells.keys()
                or sorted(cells["tensordesc_indices"]) != descriptor_slots):  # fmt: skip
            return None
        c_launch, metas = cells["launcher"], list(cells["tensordesc_meta"])
        metas += [None] * (len(descriptor_slots) - len(metas))
    elif descriptor_slots:
        return None
    encoded: dict[tuple, tuple] = {}

    def with_encoded_descriptors(args: tuple) -> list:
        out, start = [], 0
        for j, slot in enumerate(descriptor_slots):
            out += args[start:slot]
            desc = args[slot]
            hit = encoded.get((id(desc), j))
            if hit is None or hit[0] is not desc:
                if len(encoded) >= _ENCODED_MAX:
                    encoded.clear()
                hit = encoded[(id(desc), j)] = (desc, encode(desc, metas[j]))
            out += hit[1]
            start = slot + 1
        out += args[start:]
        return out

    grid_x, grid_y, grid_z = grid3

    def launch(*args: Any) -> None:
        if descriptor_slots:
            args = with_encoded_descriptors(args)
        c_launch(grid_x, grid_y, grid_z, stream(), function, cooperative, pdl, None, None,
                 metadata, None, None, None, *args)  # fmt: skip

    return launch


def _current_stream() -> Any:
    """The current stream's handle, looked up as Triton's runner does (its driver's device and
    stream functions: torch's current device and raw stream)."""
    from triton.runtime import driver

    get_device, get_stream = driver.active.get_current_device, driver.active.get_current_stream
    return lambda: get_stream(get_device())
