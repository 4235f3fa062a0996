"""LaunchCache: the first launch of a key goes through the JIT, later ones straight to the
compiled kernel's launcher; anything Triton specializes on changes the key; an unknown
compiled-kernel interface turns the cache off instead of failing."""

from __future__ import annotations

import pytest
import torch

from nanograph.kernels.launch import LaunchCache


class FakeCompiled:
    def __init__(self, log: list, accepts: int | None) -> None:
        self.log, self.accepts = log, accepts

    def __getitem__(self, grid):
        def runner(*args):
            if self.accepts is not None and len(args) != self.accepts:
                raise TypeError(f"expected {self.accepts} arguments, got {len(args)}")
            self.log.append(("direct", grid, args))

        return runner


class FakeKernel:
    """``kernel[grid](x_ptr, n, BLOCK=..., num_warps=...)`` like a @triton.jit function."""

    arg_names = ["x_ptr", "n", "BLOCK"]

    def __init__(self, accepts: int | None = None) -> None:
        self.log: list = []
        self.accepts = accepts

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.log.append(("jit", grid, args, kwargs))
            return FakeCompiled(self.log, self.accepts)

        return launch


@pytest.fixture(autouse=True)
def compiled_mode(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def test_second_launch_is_direct_with_arguments_in_signature_order():
    kernel = FakeKernel()
    cache = LaunchCache(kernel)
    x = torch.zeros(64)
    for _ in range(3):
        cache((4,), (x,), (64,), dict(BLOCK=16, num_warps=4))
    assert [entry[0] for entry in kernel.log] == ["jit", "direct", "direct"]
    assert kernel.log[0][3] == dict(BLOCK=16, num_warps=4)
    # tensors as their addresses; num_warps is an option
    assert kernel.log[1] == ("direct", (4, 1, 1), (x.data_ptr(), 64, 16))
    assert cache.direct_launches == 2


def test_everything_triton_specializes_on_is_in_the_key():
    kernel = FakeKernel()
    cache = LaunchCache(kernel)
    base = torch.zeros(64)
    launches = [
        ((4,), (base,), (64,), dict(BLOCK=16, num_warps=4)),
        ((4,), (base[1:],), (64,), dict(BLOCK=16, num_warps=4)),  # address mod 16 differs
        ((4,), (base.half(),), (64,), dict(BLOCK=16, num_warps=4)),  # dtype
        ((4,), (base,), (1,), dict(BLOCK=16, num_warps=4)),  # scalar value
        ((4,), (base,), (64,), dict(BLOCK=32, num_warps=4)),  # constexpr
        ((4,), (base,), (64,), dict(BLOCK=16, num_warps=8)),  # launch option
        ((8,), (base,), (64,), dict(BLOCK=16, num_warps=4)),  # grid
    ]
    for grid, tensors, scalars, constexprs in launches:
        cache(grid, tensors, scalars, constexprs)
    assert [entry[0] for entry in kernel.log] == ["jit"] * len(launches)


def test_tma_descriptors_are_keyed_by_their_base_and_block():
    """A TMA descriptor (the attention's new keys): its base address mod 16, dtype and block
    are in the key, its address, shape and strides are not (runtime values)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    kernel = FakeKernel()
    cache = LaunchCache(kernel)
    x, rows = torch.zeros(64), torch.zeros(64, 32, dtype=torch.bfloat16)

    def desc(base, block=(8, 16)):
        return TensorDescriptor(base, list(base.shape), [base.stride(0), 1], list(block))

    launches = [
        (desc(rows), "jit"),
        (desc(rows[8:]), "direct"),  # another address, shape: the same compiled kernel
        (desc(rows[:, :16]), "direct"),  # another stride
        (desc(rows, (16, 16)), "jit"),  # block
        (desc(rows.half()), "jit"),  # dtype
    ]
    for descriptor, _ in launches:
        cache((4,), (x,), (64,), dict(BLOCK=16), descriptors=(descriptor,))
    assert [entry[0] for entry in kernel.log] == [want for _, want in launches]
    # a direct launch passes the tensor as its address and the descriptor as it is
    assert kernel.log[1][2] == (x.data_ptr(), launches[1][0], 64)


def test_unknown_compiled_interface_turns_the_cache_off():
    kernel = FakeKernel(accepts=2)  # a Triton whose launcher wants no constexprs
    cache = LaunchCache(kernel)
    x = torch.zeros(64)
    for _ in range(3):
        cache((4,), (x,), (64,), dict(BLOCK=16, num_warps=4))
    assert [entry[0] for entry in kernel.log] == ["jit", "jit", "jit"]
    assert not cache.enabled and cache.direct_launches == 0


def test_interpreter_mode_always_takes_the_jit(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernel = FakeKernel()
    cache = LaunchCache(kernel)
    for _ in range(2):
        cache((4,), (torch.zeros(4),), (4,), dict(BLOCK=4))
    assert [entry[0] for entry in kernel.log] == ["jit", "jit"]


def test_programmatic_dependent_launch_only_from_sm90(monkeypatch):
    """gdc_wait / gdc_launch_dependents exist from sm_90 on: older GPUs and the CPU launch
    every kernel plainly (the kernels' PDL constexpr is False)."""
    from nanograph.kernels import pdl

    assert not pdl.enabled(torch.zeros(1))
    for capability, expected in (((8, 0), False), ((8, 9), False), ((9, 0), True), ((10, 0), True)):
        pdl._supported.cache_clear()
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i, c=capability: c)
        assert pdl._supported(0) is expected
    pdl._supported.cache_clear()


class FakeAheadKernel(FakeKernel):
    """A kernel whose ``warmup`` (compile without launching) is recorded."""

    def warmup(self, *args, grid, **kwargs):
        self.log.append(("warmup", grid, args, kwargs))


def test_compile_ahead_launches_nothing_inside_parallel_compiles_only():
    pytest.importorskip("triton.runtime._async_compile")
    from nanograph.kernels.launch import parallel_compiles

    ahead, plain = FakeAheadKernel(), FakeAheadKernel()
    ahead_cache, plain_cache = LaunchCache(ahead, compile_ahead=True), LaunchCache(plain)
    x = torch.zeros(64)
    with parallel_compiles(2) as compiles:
        assert compiles == []  # Triton's async mode is on; nothing submitted by fakes
        assert ahead_cache((4,), (x,), (64,), dict(BLOCK=16, num_warps=4)) is False
        assert plain_cache((4,), (x,), (64,), dict(BLOCK=16, num_warps=4)) is True
    assert ahead.log == [("warmup", (4,), (x, 64), dict(BLOCK=16, num_warps=4))]
    assert [entry[0] for entry in plain.log] == ["jit"]
    assert not ahead_cache.runners  # a compile-only call records no launcher
    assert ahead_cache((4,), (x,), (64,), dict(BLOCK=16, num_warps=4)) is True  # outside: launches
    assert [entry[0] for entry in ahead.log] == ["warmup", "jit"]


def test_parallel_compiles_is_off_under_the_interpreter(monkeypatch):
    from nanograph.kernels.launch import parallel_compiles

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernel = FakeAheadKernel()
    with parallel_compiles(2) as compiles:
        assert compiles is None
        LaunchCache(kernel, compile_ahead=True)((4,), (torch.zeros(4),), (4,), dict(BLOCK=4))
    assert [entry[0] for entry in kernel.log] == ["jit"]


def test_a_launch_compiled_asynchronously_still_records_its_launcher():
    """Inside Triton's async mode the JIT returns a FutureKernel: the cache unwraps it."""
    from concurrent.futures import Future

    FutureKernel = pytest.importorskip("triton.runtime._async_compile").FutureKernel

    class AsyncKernel(FakeKernel):
        def __getitem__(self, grid):
            launch = super().__getitem__(grid)

            def future_launch(*args, **kwargs):
                done = Future()
                done.set_result(launch(*args, **kwargs))
                return FutureKernel(lambda kernel: None, lambda kernel: None, done)

            return future_launch

    kernel = AsyncKernel()
    cache = LaunchCache(kernel)
    x = torch.zeros(64)
    for _ in range(2):
        cache((4,), (x,), (64,), dict(BLOCK=16, num_warps=4))
    assert [entry[0] for entry in kernel.log] == ["jit", "direct"]


# Triton 3.6's compiled kernel, as far as the lean launch reads it: ``run`` (the CudaLauncher)
# with the C ``launch``, wrapped to encode TMA descriptors (``wrap_handle_tensordesc``'s closure
# over launcher, tensordesc_indices and tensordesc_meta, and the module's make_tensordesc_arg).
ENCODED: list = []


def make_tensordesc_arg(desc, meta):
    ENCODED.append(desc)
    return [("tma", desc.name, meta), *desc.shape]


def wrap_handle_tensordesc(launcher, tensordesc_indices, tensordesc_meta):
    def inner(*args):
        base, kernel_args = list(args[:13]), args[13:]
        for i, arg in enumerate(kernel_args):
            expanded = [arg]
            if i in tensordesc_indices:
                expanded = make_tensordesc_arg(arg, tensordesc_meta[0])
            base.extend(expanded)
        return launcher(*base)

    return inner


class FakeDescriptor:
    def __init__(self, name: str, base: torch.Tensor) -> None:
        self.name, self.base, self.block_shape, self.shape = name, base, [8, 16], [64, 32]


class FakeRun:
    def __init__(self, log: list, descriptor_slots: set[int], scratch: int = 0) -> None:
        self.log = log
        self.launch = self.c_launch  # like the C function: no closure
        if descriptor_slots:
            self.launch = wrap_handle_tensordesc(self.c_launch, descriptor_slots,
                                                 [{"swizzle": 128}])  # fmt: skip
        self.launch_cooperative_grid, self.launch_pdl = False, True
        self.global_scratch_size, self.profile_scratch_size = scratch, 0

    def c_launch(self, *args):
        self.log.append(("c", args))


class Fake36Compiled(FakeCompiled):
    function, packed_metadata = 0xF00, ("warps", 4)

    def __init__(self, log, descriptor_slots, scratch=0) -> None:
        super().__init__(log, None)
        self.run = FakeRun(log, descriptor_slots, scratch)


class Fake36Kernel(FakeKernel):
    arg_names = ["x_ptr", "desc", "n", "BLOCK"]

    def __init__(self, descriptor_slots=frozenset(), scratch=0) -> None:
        super().__init__()
        self.descriptor_slots, self.scratch = set(descriptor_slots), scratch

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.log.append(("jit", grid, args, kwargs))
            return Fake36Compiled(self.log, self.descriptor_slots, self.scratch)

        return launch


@pytest.fixture
def triton36(monkeypatch):
    """Triton 3.6's version, and a current stream without a GPU."""
    triton = pytest.importorskip("triton")
    from nanograph.kernels import launch

    monkeypatch.setattr(triton, "__version__", "3.6.0")
    monkeypatch.setattr(launch, "_current_stream", lambda: lambda: 7)
    ENCODED.clear()


def test_a_triton_36_launch_calls_the_c_launcher_itself(triton36):
    """Later launches call the C launcher with the grid, the current stream, the kernel's
    function and packed metadata, no scratch and no hooks, then the arguments; a descriptor is
    encoded once per descriptor object, then its encoding is reused."""
    kernel = Fake36Kernel(descriptor_slots={1})
    cache = LaunchCache(kernel)
    x, rows = torch.zeros(64), torch.zeros(64, 32)
    first, second = FakeDescriptor("first", rows), FakeDescriptor("second", rows)
    for desc in (first, first, first, second):
        cache((4,), (x,), (64,), dict(BLOCK=16, num_warps=4), descriptors=(desc,))
    assert [entry[0] for entry in kernel.log] == ["jit", "c", "c", "c"]
    head = (4, 1, 1, 7, 0xF00, False, True, None, None, ("warps", 4), None, None, None)
    want = [(*head, x.data_ptr(), ("tma", d.name, {"swizzle": 128}), 64, 32, 64, 16)
            for d in (first, first, second)]  # fmt: skip
    assert [entry[1] for entry in kernel.log[1:]] == want
    assert ENCODED == [first, second] and cache.direct_launches == 3
    # without descriptors the launcher is the C function itself
    plain = Fake36Kernel()
    plain.arg_names = FakeKernel.arg_names  # no descriptor argument
    cache = LaunchCache(plain)
    for _ in range(2):
        cache((2, 3), (x,), (64,), dict(BLOCK=16, num_warps=4))
    assert plain.log[-1] == ("c", (2, 3, 1, *head[3:], x.data_ptr(), 64, 16))


@pytest.mark.parametrize("why", ["scratch", "hook", "version", "slots"])
def test_the_runner_launches_where_the_c_launcher_is_not_the_known_one(triton36, monkeypatch, why):
    """Scratch memory, a launch hook, another Triton, descriptors where the launcher does not
    encode them: the compiled kernel's runner launches, as before."""
    import triton
    from triton import knobs

    if why == "hook":
        hook = getattr(knobs.runtime, "launch_enter_hook", None)
        if not hasattr(hook, "calls"):
            pytest.skip("this Triton's launch hooks are not chains")
        monkeypatch.setattr(hook, "calls", [lambda metadata: None])
    if why == "version":
        monkeypatch.setattr(triton, "__version__", "3.9.0")
    kernel = Fake36Kernel(descriptor_slots={1} if why != "slots" else set(),
                          scratch=64 if why == "scratch" else 0)  # fmt: skip
    cache = LaunchCache(kernel)
    x, desc = torch.zeros(64), FakeDescriptor("d", torch.zeros(64, 32))
    for _ in range(2):
        cache((4,), (x,), (64,), dict(BLOCK=16, num_warps=4), descriptors=(desc,))
    assert [entry[0] for entry in kernel.log] == ["jit", "direct"]
