"""One-wave TMA GEMVs under PDL: each launch's weights in shared memory before its wait?
(stop 71; on the device from the repo root: ``cp docs/wip/*_probe.py /tmp/ &&
python3 /tmp/gluon_gemv_probe.py``; ``--compile`` compiles it for sm_90 without a GPU.)

Why: ``gluon_chain_probe.py`` found that a TMA ring streams qwen3-0.6b's four one-row products
at the HBM rate (9.99 us a layer on an H100, against 16.9 for the engine's GEMV launches), but
that grid barriers under load (~2.7 us each) lose more than the stream gains. A kernel
boundary under PDL is the hardware's own hand-off. Here each product stays its own launch,
but as the stream wants it: one wave of P = 128 programs (one an SM), each loading its whole
slice of the weight (32-96 KiB for qwen3-0.6b: one TMA box of 8 rows x 1024 a slot, every slot
its own mbarrier) *before* its ``griddepcontrol.wait``, and letting its dependents launch at
once, so the next product's programs (co-resident: the slices of three products fit an SM's
shared memory) load their weights while this one waits for its input row and sums. Earlier
pre-wait loads lost (stops 36, 42: into the L2 or registers, by GEMVs of many programs, whose
early dependents held SM slots the GEMVs' later blocks needed); one wave holds no slot another
program of its own launch needs.

Arms (28 layers of distinct weights, the products of ``persistent_chain_probe.py``; gate/up
writes silu(gate) * up, its rows ordered per program as ``gluon_chain_probe.py`` mode 5 has
them): ``gemv`` (the engine's launches) against ``tma`` (these, PDL) and ``tma-nopdl``.
Checks the final residual stream against the GEMV chain's.

PREDICTED (H100): tma ~11-13 us a layer (the stream's 10 plus what of four PDL boundaries,
~1 us each, and the input rows' L2 round trips the prefetch does not cover), against 16.9.
MEASURED (stop 71, H100, ``benchmarks/results/h100/stop71_aad276e/``, two rounds): gemv 17.0 /
17.5, tma **17.6 / 17.8**, tma without PDL 19.3 / 20.6, tma at 8 warps 18.2 / 18.2 us a layer;
every chain equal to the GEMV's to 0.0078 of the largest value. Wrong: with each product's
weights in shared memory at its wait, a product still costs ~4.4 us (the hand-off, the input
row's L2 round trip, the sums, the stores, in series); the GEMV launches already sit at that
floor. The four products' time is their dependency chain's, not their bytes'.
Since the run its sums share ``gluon_chain_probe``'s helpers (the same operations; ptxas
orders a few differently: its SASS differs from aad276e's, the chain kernel's does not).
"""

import os
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gluon_chain_probe import _gated, _slot_sum, _tma_copy_in, _x_parts, descriptors  # noqa: E402
from persistent_chain_probe import gemv_chain, make  # noqa: E402


@gluon.jit
def _gdc_wait():
    gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)  # fmt: skip


@gluon.jit
def _gdc_launch_dependents():
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [],
                              dtype=gl.int32, is_pure=False, pack=1)  # fmt: skip


@gluon.jit
def _gemv_fwd(desc, x_ptr, out_ptr, layer, N: gl.constexpr, R: gl.constexpr,
              PARTS: gl.constexpr, RESIDUAL: gl.constexpr, ACT: gl.constexpr,
              PDL: gl.constexpr):  # fmt: skip
    """out[p R : (p + 1) R] (+)= W[layer] . x for program p; W read as ``descriptors`` lays it
    out ([L, PARTS, N, 1024] as rows of 256). ACT: the program's R rows are R / 2 gate rows
    then the matching up rows, and it writes silu(gate) * up at [p R / 2, (p + 1) R / 2)."""
    pid = gl.program_id(0)
    BOX: gl.constexpr = desc.block_type.shape[0]
    W: gl.constexpr = desc.block_type.shape[1]
    C: gl.constexpr = 1024 // W
    RB: gl.constexpr = BOX // C  # weight rows a slot
    NS: gl.constexpr = R // RB * PARTS
    WARPS: gl.constexpr = gl.num_warps()
    layout: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 1, 32], [WARPS, 1, 1], [2, 1, 0])
    x_layout: gl.constexpr = gl.SliceLayout(0, layout)
    y_layout: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(1, layout))
    slab = gl.allocate_shared_memory(desc.dtype, [NS, BOX, W], desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(NS):
        mbarrier.init(bars.index(s), count=1)
    fence_async_shared()
    row0 = pid * R
    for s in gl.static_range(NS):  # slots rows outer, as the sums take them
        row = ((layer * PARTS + s % PARTS) * N + row0 + (s // PARTS) * RB) * C
        mbarrier.expect(bars.index(s), desc.block_type.nbytes)
        _tma_copy_in(desc, [row, 0], bars.index(s), slab.index(s))
    if PDL:  # weights are never written: everything above may overlap the kernel before
        _gdc_launch_dependents()
        _gdc_wait()
    cols = gl.expand_dims(gl.arange(0, C, layout=gl.SliceLayout(1, x_layout)), 1) * W
    cols = cols + gl.expand_dims(gl.arange(0, W, layout=gl.SliceLayout(0, x_layout)), 0)
    x0, x1, x2 = _x_parts(x_ptr, cols, PARTS, False)
    y = gl.zeros([RB], gl.float32, y_layout)
    res = y
    g0 = y
    g1 = y
    g2 = y
    for s in gl.static_range(NS):
        rows = row0 + (s // PARTS) * RB + gl.arange(0, RB, layout=y_layout)
        if RESIDUAL and s % PARTS == 0:
            res = gl.load(out_ptr + rows).to(gl.float32)
        mbarrier.wait(bars.index(s), 0)
        w = slab.index(s).reshape([RB, C, W]).load(layout)
        y = _slot_sum(y, w, s, PARTS, x0, x1, x2)
        if ACT:  # PARTS == 1: a slot is a row block
            g0, g1, g2, act = _gated(y, s, NS, g0, g1, g2)
            if s >= NS // 2:
                at = row0 // 2 + (s - NS // 2) * RB + gl.arange(0, RB, layout=y_layout)
                gl.store(out_ptr + at, act.to(gl.bfloat16))
            y = gl.zeros([RB], gl.float32, y_layout)
        elif s % PARTS == PARTS - 1:
            if RESIDUAL:
                y = y.to(gl.bfloat16).to(gl.float32) + res
            gl.store(out_ptr + rows, y.to(gl.bfloat16))
            y = gl.zeros([RB], gl.float32, y_layout)


def tma_chain(stream, h, g, descs, layers, dims, p=128, pdl=True, warps=4):
    """The four products a layer as four one-wave launches (``descs`` from
    ``gluon_chain_probe.descriptors``: q/k/v, o, gate/up, gate/up ordered per program, down)."""
    hidden, qkv, ao, i2 = dims
    wa, wb, _, wc_act, wd = descs
    extra = {"num_warps": warps, "launch_pdl": pdl}
    for layer in range(layers):
        _gemv_fwd[(p,)](wa, stream, h, layer, N=qkv, R=qkv // p, PARTS=hidden // 1024,
                        RESIDUAL=False, ACT=False, PDL=pdl, **extra)  # fmt: skip
        _gemv_fwd[(p,)](wb, h, stream, layer, N=hidden, R=hidden // p, PARTS=ao // 1024,
                        RESIDUAL=True, ACT=False, PDL=pdl, **extra)  # fmt: skip
        _gemv_fwd[(p,)](wc_act, stream, g, layer, N=i2, R=i2 // p, PARTS=hidden // 1024,
                        RESIDUAL=False, ACT=True, PDL=pdl, **extra)  # fmt: skip
        _gemv_fwd[(p,)](wd, g, stream, layer, N=hidden, R=hidden // p, PARTS=i2 // 2048,
                        RESIDUAL=True, ACT=False, PDL=pdl, **extra)  # fmt: skip


def compile_only() -> None:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "tests"))  # fmt: skip
    import sm90_compile

    dims, layers = (1024, 4096, 2048, 6144), 2
    stream, w, h, g, _ = make(layers, dims, "cpu")
    descs = descriptors(w, layers, dims)
    hidden, qkv, ao, i2 = dims
    wa, wb, _, wc_act, wd = descs
    for desc, x, out, n, r, parts, residual, act in (
        (wa, stream, h, qkv, qkv // 128, 1, False, False),
        (wb, h, stream, hidden, hidden // 128, 2, True, False),
        (wc_act, stream, g, i2, i2 // 128, 1, False, True),
        (wd, g, stream, hidden, hidden // 128, 3, True, False),
    ):
        sm90_compile.CompileOnly(_gemv_fwd)[(128,)](
            desc, x, out, 1, N=n, R=r, PARTS=parts, RESIDUAL=residual, ACT=act, PDL=True,
            num_warps=4, launch_pdl=True)  # fmt: skip
        print(f"compiled N={n} R={r} parts={parts}", flush=True)


def main() -> None:
    from nanograph.bench.common import graphed_samples, median

    dims, layers = (1024, 4096, 2048, 6144), 28  # qwen3-0.6b's products
    print(torch.cuda.get_device_name(), flush=True)
    stream0, w, h, g, _ = make(layers, dims, "cuda")
    descs = descriptors(w, layers, dims)
    want = stream0.clone()
    gemv_chain(want, w, h, g, layers, dims)
    arms = {
        "gemv": lambda s: gemv_chain(s, w, h, g, layers, dims),
        "tma": lambda s: tma_chain(s, h, g, descs, layers, dims),
        "tma-nopdl": lambda s: tma_chain(s, h, g, descs, layers, dims, pdl=False),
        "tma w8": lambda s: tma_chain(s, h, g, descs, layers, dims, warps=8),
    }
    for round_ in range(2):
        for name, run in arms.items():
            stream = stream0.clone()
            run(stream)
            torch.cuda.synchronize()
            err = (stream.float() - want.float()).abs().max() / want.float().abs().max()
            scratch = stream0.clone()
            ms = median(graphed_samples(lambda r=run, s=scratch: r(s), 200))
            print(f"round {round_} {name:10s} {1000 * ms / layers:6.2f} us a layer "
                  f"({ms:.3f} ms for {layers}), max err against gemv {err.item():.2g} "
                  f"of the largest", flush=True)  # fmt: skip


if __name__ == "__main__":
    if "--compile" in sys.argv:
        compile_only()
    else:
        main()
