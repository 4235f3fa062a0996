"""Does a persistent decode chain pay once its weights stream through shared memory by TMA?
(stop 71; on the device from the repo root: ``python3 docs/wip/gluon_chain_probe.py``;
``--compile`` compiles the kernel for sm_90 on a machine without a GPU.)

Why: issue 18 asks qwen3-0.6b batch 1 for 2,000 tok/s (a ~0.5 ms step on the H200; the engine
is at ~0.72). Stop 60's ``persistent_chain_probe.py`` closed the persistent kernel *in Triton*:
past its grid barriers (~1.05 us each) its products took ~16 us a layer, as long as the
separate PDL GEMV launches take in all (16.9), because one program an SM issuing plain loads
keeps too few bytes in flight, and prefetching into the L2 read every line twice. What it left
open is the megakernel form others use on Hopper: a producer warp streaming each program's
weight tiles by TMA into a ring of shared memory, running ahead of the consumers across the
grid barriers (weights never depend on activations), so HBM streams while the grid syncs.

Here, qwen3-0.6b's four one-row products a layer (q/k/v; o + residual; gate/up; down with
SiLU-and-mul on load + residual), 28 layers of distinct weights (880 MB, streamed from HBM
every replay), as ``persistent_chain_probe.py`` has them:
- ``gemv``: the engine's GEMV launches (PDL), 4 x 28 in one graph (its ``gemv_chain``);
- ``gluon SxB``: one launch of P = 128 programs; program p owns rows [p N / P, (p + 1) N / P) of
  every product; a 1-warp producer partition loads its [8, 256] weight tiles in consumption
  order into a ring of S slots of B tiles (a ready and an empty mbarrier a slot); the 4-warp
  consumer copies the product's input row into shared memory after the grid barrier,
  multiplies the tiles as they land, writes its rows, and joins the grid barrier (one release
  add a program, acquire polling);
- ``stream SxB``: the same without the grid barriers (wrong results; the streaming bound).
Checks the final residual stream against the GEMV chain's.

PREDICTED (H100, before any run): gemv ~16.9 us a layer (stop 60); stream ~10.5 (31.5 MB a
layer at ~3.0 TB/s); gluon ~11-12 (the barriers hidden by the ring, ~0.8 of a layer ahead at
192 KiB), i.e. ~5 us a layer (~0.15 ms a 0.6b step) off the products.
"""

import os
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from persistent_chain_probe import gemv_chain, make  # noqa: E402

_tma_copy_in = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
TILE = (8, 256)  # weight rows x K a ring slot (4 KiB)


@gluon.jit
def _grid_sync(counter_ptr, target):
    """Every program's writes so far are visible to every program after this."""
    gl.thread_barrier()
    gl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
    seen = gl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = gl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    gl.thread_barrier()


@gluon.jit
def _issue(desc, ring, ready, empty, i, row0, R: gl.constexpr, K: gl.constexpr):
    """Load this program's R rows of one product from row ``row0``, rows outer, SUB tiles
    along K a ring slot (one ready barrier for all of them)."""
    STAGES: gl.constexpr = ready.shape[0]
    SUB: gl.constexpr = ring.shape[0] // STAGES
    TR: gl.constexpr = ring.shape[1]
    TK: gl.constexpr = ring.shape[2]
    for rb in gl.static_range(R // TR):
        for kq in gl.static_range(K // TK // SUB):
            slot = i % STAGES
            # a fresh mbarrier counts as having completed the phase before 0
            mbarrier.wait(empty.index(slot), ((i // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(slot), SUB * desc.block_type.nbytes)
            for j in gl.static_range(SUB):
                _tma_copy_in(desc, [row0 + rb * TR, (kq * SUB + j) * TK], ready.index(slot),
                             ring.index(slot * SUB + j))  # fmt: skip
            i += 1
    return i


@gluon.jit
def _producer(wa, wb, wc, wd, ring, ready, empty, L, H: gl.constexpr, QKV: gl.constexpr,
              AO: gl.constexpr, I2: gl.constexpr, P: gl.constexpr):  # fmt: skip
    pid = gl.program_id(0)
    i = 0
    for layer in range(L):
        i = _issue(wa, ring, ready, empty, i, layer * QKV + pid * (QKV // P), QKV // P, H)
        i = _issue(wb, ring, ready, empty, i, layer * H + pid * (H // P), H // P, AO)
        i = _issue(wc, ring, ready, empty, i, layer * I2 + pid * (I2 // P), I2 // P, H)
        i = _issue(wd, ring, ready, empty, i, layer * H + pid * (H // P), H // P, I2 // 2)


@gluon.jit
def _product(ring, ready, empty, xs, i, x_ptr, out_ptr, row0, R: gl.constexpr,
             K: gl.constexpr, SILU_MUL: gl.constexpr, RESIDUAL: gl.constexpr):  # fmt: skip
    """out[row0 : row0 + R] (+)= W . x from the ring's next tiles; rounds as the GEMV does.
    x is read past the L1 (other programs wrote it) into ``xs`` once, in the layout it is read
    back in (each thread reads only what it wrote: no barrier)."""
    STAGES: gl.constexpr = ready.shape[0]
    SUB: gl.constexpr = ring.shape[0] // STAGES
    TR: gl.constexpr = ring.shape[1]
    TK: gl.constexpr = ring.shape[2]
    WARPS: gl.constexpr = gl.num_warps()
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [WARPS, 1], [1, 0])
    x_layout: gl.constexpr = gl.SliceLayout(0, layout)
    offs = gl.arange(0, TK, layout=x_layout)
    for kb in gl.static_range(K // TK):
        x = gl.load(x_ptr + kb * TK + offs, cache_modifier=".cg")
        if SILU_MUL:
            gate = x.to(gl.float32)
            up = gl.load(x_ptr + K + kb * TK + offs, cache_modifier=".cg").to(gl.float32)
            x = (gate / (1.0 + gl.exp(-gate)) * up).to(gl.bfloat16)
        xs.index(kb).store(x)
    for rb in gl.static_range(R // TR):
        acc = gl.zeros([TR, TK], gl.float32, layout)
        for kq in gl.static_range(K // TK // SUB):
            slot = i % STAGES
            mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
            for j in gl.static_range(SUB):
                w = ring.index(slot * SUB + j).load(layout)
                x = xs.index(kq * SUB + j).load(x_layout)
                acc += w.to(gl.float32) * gl.expand_dims(x.to(gl.float32), 0)
            mbarrier.arrive(empty.index(slot))
            i += 1
        y = gl.sum(acc, axis=1)
        rows = row0 + rb * TR + gl.arange(0, TR, layout=gl.SliceLayout(1, layout))
        if RESIDUAL:
            y = y.to(gl.bfloat16).to(gl.float32)
            y += gl.load(out_ptr + rows, cache_modifier=".cg").to(gl.float32)
        gl.store(out_ptr + rows, y.to(gl.bfloat16))
    return i


@gluon.jit
def _consumer(stream_ptr, h_ptr, g_ptr, counter_ptr, ring, ready, empty, xs, L,
              H: gl.constexpr, QKV: gl.constexpr, AO: gl.constexpr, I2: gl.constexpr,
              P: gl.constexpr, SYNC: gl.constexpr):  # fmt: skip
    pid = gl.program_id(0)
    i = 0
    for layer in range(L):
        step = layer * 4
        i = _product(ring, ready, empty, xs, i, stream_ptr, h_ptr, pid * (QKV // P), QKV // P,
                     H, False, False)  # fmt: skip
        if SYNC:
            _grid_sync(counter_ptr, (step + 1) * P)
        i = _product(ring, ready, empty, xs, i, h_ptr, stream_ptr, pid * (H // P), H // P, AO,
                     False, True)  # fmt: skip
        if SYNC:
            _grid_sync(counter_ptr, (step + 2) * P)
        i = _product(ring, ready, empty, xs, i, stream_ptr, g_ptr, pid * (I2 // P), I2 // P,
                     H, False, False)  # fmt: skip
        if SYNC:
            _grid_sync(counter_ptr, (step + 3) * P)
        i = _product(ring, ready, empty, xs, i, g_ptr, stream_ptr, pid * (H // P), H // P,
                     I2 // 2, True, True)  # fmt: skip
        if SYNC:
            _grid_sync(counter_ptr, (step + 4) * P)


@gluon.jit
def _chain_fwd(stream_ptr, h_ptr, g_ptr, counter_ptr, wa, wb, wc, wd, L, H: gl.constexpr,
               QKV: gl.constexpr, AO: gl.constexpr, I2: gl.constexpr, P: gl.constexpr,
               STAGES: gl.constexpr, SUB: gl.constexpr, SYNC: gl.constexpr):  # fmt: skip
    TR: gl.constexpr = wa.block_type.shape[0]
    TK: gl.constexpr = wa.block_type.shape[1]
    XB: gl.constexpr = max(H, AO, I2 // 2) // TK
    ring = gl.allocate_shared_memory(wa.dtype, [STAGES * SUB, TR, TK], wa.layout)
    xs = gl.allocate_shared_memory(wa.dtype, [XB, TK],
                                   gl.SwizzledSharedLayout(1, 1, 1, order=[0]))  # fmt: skip
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    fence_async_shared()
    gl.warp_specialize([
        (_consumer, (stream_ptr, h_ptr, g_ptr, counter_ptr, ring, ready, empty, xs, L, H, QKV,
                     AO, I2, P, SYNC)),
        (_producer, (wa, wb, wc, wd, ring, ready, empty, L, H, QKV, AO, I2, P)),
    ], [1], [24])  # fmt: skip


def descriptors(w: torch.Tensor, layers: int, dims) -> list[TensorDescriptor]:
    """Each product's weights, stacked over the layers as one [L * N, K] tensor."""
    hidden, qkv, ao, i2 = dims
    shapes = [(qkv, hidden), (hidden, ao), (i2, hidden), (hidden, i2 // 2)]
    layout = gl.NVMMASharedLayout.get_default_for(list(TILE), gl.bfloat16)
    parts = w.split([n * k for n, k in shapes], dim=1)
    out = []
    for part, (n, k) in zip(parts, shapes):
        stacked = part.contiguous().view(layers * n, k)
        out.append(TensorDescriptor(stacked, list(stacked.shape), [k, 1], list(TILE), layout))
    return out


def gluon_chain(stream, h, g, counter, descs, layers, dims, p=128, stages=12, sub=4, sync=True,
                warps=4):  # fmt: skip
    """``stages`` ring slots of ``sub`` [8, 256] tiles each (12 x 4: 192 KiB)."""
    hidden, qkv, ao, i2 = dims
    counter.zero_()
    _chain_fwd[(p,)](stream, h, g, counter, *descs, layers, H=hidden, QKV=qkv, AO=ao, I2=i2,
                     P=p, STAGES=stages, SUB=sub, SYNC=sync, num_warps=warps)  # fmt: skip


def compile_only() -> None:
    """Compile for sm_90 here (no GPU): the kernel's types, layouts and shared memory."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "tests"))  # fmt: skip
    import sm90_compile

    dims, layers = (1024, 4096, 2048, 6144), 2
    stream, w, h, g, counter = make(layers, dims, "cpu")
    descs = descriptors(w, layers, dims)
    for stages, sub in ((12, 4), (24, 2), (48, 1)):
        for sync in (True, False):
            sm90_compile.CompileOnly(_chain_fwd)[(128,)](
                stream, h, g, counter, *descs, layers, H=1024, QKV=4096, AO=2048, I2=6144,
                P=128, STAGES=stages, SUB=sub, SYNC=sync, num_warps=4)  # fmt: skip
            print(f"compiled stages={stages} sub={sub} sync={sync}", flush=True)


def main() -> None:
    from nanograph.bench.common import graphed_samples, median

    dims, layers = (1024, 4096, 2048, 6144), 28  # qwen3-0.6b's products
    p = 128
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(torch.cuda.get_device_name(), f"SMs {sms}", flush=True)
    stream0, w, h, g, counter = make(layers, dims, "cuda")
    descs = descriptors(w, layers, dims)
    want = stream0.clone()
    gemv_chain(want, w, h, g, layers, dims)
    arms = {"gemv": lambda s: gemv_chain(s, w, h, g, layers, dims)}
    for arm in os.environ.get("ARMS", "12x4,24x2,48x1,6x4").split(","):
        stages, sub = (int(x) for x in arm.split("x"))
        for sync in (True, False):
            arms[f"{'gluon' if sync else 'stream'} {arm}"] = lambda s, n=stages, b=sub, y=sync: (
                gluon_chain(s, h, g, counter, descs, layers, dims, p, stages=n, sub=b, sync=y)
            )
    for name, run in arms.items():
        stream = stream0.clone()
        try:
            run(stream)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - out of resources
            print(f"{name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        err = ((stream.float() - want.float()).abs().max() / want.float().abs().max()).item()
        scratch = stream0.clone()
        ms = median(graphed_samples(lambda r=run, s=scratch: r(s), 200))
        print(f"{name:14s} {1000 * ms / layers:6.2f} us a layer ({ms:.3f} ms for {layers}), "
              f"max err against gemv {err:.2g} of the largest, counter {counter.item()}",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    if "--compile" in sys.argv:
        compile_only()
    else:
        main()
