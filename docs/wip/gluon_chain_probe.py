"""Does a persistent decode chain pay once its weights stream through shared memory by TMA?
(stop 71; on the device from the repo root: ``cp docs/wip/*chain_probe.py /tmp/ &&
ARMS=12w4 MODES=5,6 python3 /tmp/gluon_chain_probe.py``, ARMS as ``<slots>w<warps>``; ``--compile``
compiles every variant for sm_90 on a machine without a GPU.)

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
- ``gluon SwW`` (mode 0): one launch of P = 128 programs, S ring slots, W consumer warps.
  Program p owns rows [p N / P, (p + 1) N / P) of every product; each weight is stored as
  [parts, N, 1024] (K cut into 1024-wide parts), so a slot (8 rows of one part, 16 KiB) is one
  TMA box of contiguous memory; a 1-warp producer partition loads the slots in consumption
  order (a ready and an empty mbarrier a slot); the consumer loads the product's input row
  into registers, sums each slot as it lands (one slot's weights loaded ahead), writes its
  rows, and joins a grid barrier (one release add a program, polling).
- modes: 1 no barriers (wrong results), 2 the TMA stream alone, 3 the sums alone (no loads),
  4 barriers polled by acquire loads, 5 = 0 with gate/up writing silu(gate) * up (its rows
  ordered so that a program holds matching gate and up rows; down reads the activation), 6 the
  barriers alone, 7 = 5 without barriers: rows published as 8-byte words of two bf16 and an
  epoch, read until every word carries the expected epoch.
Each program's clocks (``PROFILE``) split a layer into: loading the input row, waiting for
slots, summing slots, the grid barrier. Checks the final residual stream against the GEMV's.

PREDICTED (H100, before any run): gemv ~16.9 us a layer (stop 60); stream ~10.5 (31.5 MB a
layer at ~3.0 TB/s); gluon ~11-12 (the barriers hidden by the ring, ~0.8 of a layer ahead at
192 KiB), i.e. ~5 us a layer (~0.15 ms a 0.6b step) off the products.

MEASURED (stop 71, H100 SXM, 1,980 MHz, ``benchmarks/results/h100/stop71_*/probe.log``; every
chain equal to the GEMV's to 0.0078 of the largest value, the register probe's sum order):
- gemv 16.9 us a layer in every run.
- The TMA stream alone (mode 2) **9.99 us a layer: 3.15 TB/s**, the HBM rate, with one 16 KiB
  box a slot. The first form ([8, 256] boxes under a 128-byte swizzle, 4 KiB slots;
  ``stop71_123114a``) streamed at 16-27 us a layer: its consumer, not TMA, was the limit.
- Best chain: mode 5, **18.5 us a layer** (mode 0 20.8-20.9; ``stop71_bef50f5``). Its clocks
  a layer (median program, cycles): input rows 6.0k, waiting for slots 1.4k, summing 7.1k,
  barriers **21.4k**. The barriers alone cost 7.9k a layer (**1.06 us each, as in Triton**),
  so under the stream a barrier costs ~2.7 us: ~0.8 us of skew (the slowest program's rows,
  min-max of the work ~3k cycles) and the rest the release add and polls queueing behind the
  stream. An input row's L2 round trip ~0.75 us (1.5k cycles; 2.6k while down's activation
  was computed on load by every warp, which mode 5 removed). 8 consumer warps were slower
  everywhere (each warp loads the whole row).
- Polling by acquire loads (mode 4): no change (the counter is not contended by the polls).
- Words (mode 7, no barrier at all): **26.4 us a layer** at 4 warps, 39.2 at 8 (correct, no
  read gave up): every warp of every program re-reads the whole input row until its epochs
  match, 128 x 4 readers of up to 12 KiB each, whose traffic slows everything.
Wrong about the barriers: hidden behind the stream they were not; a product boundary costs
~3.5-4.5 us under the stream (barrier + input row + the sums of what landed), about what a
PDL kernel boundary and its ramp cost, and four a layer take longer than the layer's bytes.
For qwen3-0.6b-sized layers (31.5 MB, ~10 us of HBM) a persistent chain with grid-wide
hand-offs does not beat the GEMV launches on an H100; what would is a cheaper hand-off (under
~1 us while HBM streams: e.g. clusters exchanging through distributed shared memory, which
Triton 3.6's Gluon does not expose), not more bytes in flight.
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
PART = 1024  # K of a weight part: every product is stored as [parts, N, PART]
ROWS = 8  # weight rows a ring slot (8 x 1024 bf16: 16 KiB, one TMA box)
PROFILE = ("all", "x", "wait", "slots", "out", "sync")  # what the consumer's clocks count


@gluon.jit
def _load_acquire(ptr):
    return gl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr],
                                     dtype=gl.int32, is_pure=False, pack=1)  # fmt: skip


@gluon.jit
def _grid_sync(counter_ptr, target, LOAD_POLL: gl.constexpr):
    """Every program's writes so far are visible to every program after this: one release add
    a program, then polling by atomic adds of 0 or (LOAD_POLL) by acquire loads, which do not
    queue behind each other at the counter's L2 slice."""
    gl.thread_barrier()
    gl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
    if LOAD_POLL:
        seen = _load_acquire(counter_ptr)
        while seen < target:
            seen = _load_acquire(counter_ptr)
    else:
        seen = gl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
        while seen < target:
            seen = gl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    gl.thread_barrier()


@gluon.jit
def _clock():
    return gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64,
                                     is_pure=False, pack=1)  # fmt: skip


@gluon.jit
def _issue(desc, ring, ready, empty, i, layer, row0, N: gl.constexpr, R: gl.constexpr,
           PARTS: gl.constexpr):  # fmt: skip
    """Load this program's R rows (from ``row0``) of one product, ROWS rows x one part a slot,
    rows outer. The descriptor reads [L, PARTS, N, PART] as [L * PARTS * N * C, 256] rows of
    256 (C = PART / 256), so a slot is one box of contiguous memory."""
    STAGES: gl.constexpr = ring.shape[0]
    C: gl.constexpr = 1024 // ring.shape[2]
    RB: gl.constexpr = ring.shape[1] // C  # weight rows a slot
    for rb in gl.static_range(R // RB):
        for part in gl.static_range(PARTS):
            slot = i % STAGES
            # a fresh mbarrier counts as having completed the phase before 0
            mbarrier.wait(empty.index(slot), ((i // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(slot), desc.block_type.nbytes)
            row = ((layer * PARTS + part) * N + row0 + rb * RB) * C
            _tma_copy_in(desc, [row, 0], ready.index(slot), ring.index(slot))
            i += 1
    return i


@gluon.jit
def _producer(wa, wb, wc, wc_act, wd, ring, ready, empty, L, H: gl.constexpr, QKV: gl.constexpr,
              AO: gl.constexpr, I2: gl.constexpr, P: gl.constexpr,
              MODE: gl.constexpr):  # fmt: skip
    pid = gl.program_id(0)
    i = 0
    for layer in range(L * (MODE != 3) * (MODE != 6)):
        i = _issue(wa, ring, ready, empty, i, layer, pid * (QKV // P), QKV, QKV // P, H // 1024)
        i = _issue(wb, ring, ready, empty, i, layer, pid * (H // P), H, H // P, AO // 1024)
        if MODE == 5 or MODE == 7:
            i = _issue(wc_act, ring, ready, empty, i, layer, pid * (I2 // P), I2, I2 // P,
                       H // 1024)  # fmt: skip
        else:
            i = _issue(wc, ring, ready, empty, i, layer, pid * (I2 // P), I2, I2 // P, H // 1024)
        i = _issue(wd, ring, ready, empty, i, layer, pid * (H // P), H, H // P, I2 // 2048)


@gluon.jit
def _x_part(x_ptr, part, cols, PARTS: gl.constexpr, SILU_MUL: gl.constexpr):
    """Part ``part`` of the product's input row in fp32, read past the L1 (other programs
    wrote it); with SILU_MUL silu(gate) * up, rounded to bf16 as the GEMV's prologue does."""
    x = gl.load(x_ptr + part * 1024 + cols, cache_modifier=".cg").to(gl.float32)
    if SILU_MUL:
        up = gl.load(x_ptr + PARTS * 1024 + part * 1024 + cols, cache_modifier=".cg")
        x = (x / (1.0 + gl.exp(-x)) * up.to(gl.float32)).to(gl.bfloat16).to(gl.float32)
    return x


@gluon.jit
def _slot_load(ring, ready, j, layout: gl.constexpr, MODE: gl.constexpr):
    """Slot j's weights in registers, once its TMA has landed."""
    STAGES: gl.constexpr = ring.shape[0]
    C: gl.constexpr = 1024 // ring.shape[2]
    if MODE != 3:
        mbarrier.wait(ready.index(j % STAGES), (j // STAGES) & 1)
    return ring.index(j % STAGES).reshape([ring.shape[1] // C, C, ring.shape[2]]).load(layout)


@gluon.jit
def _x_parts(x_ptr, cols, PARTS: gl.constexpr, SILU_MUL: gl.constexpr):
    """The product's input row, its (up to three) 1024-wide parts in registers at once."""
    x0 = _x_part(x_ptr, 0, cols, PARTS, SILU_MUL)
    x1 = x0
    x2 = x0
    if PARTS > 1:
        x1 = _x_part(x_ptr, 1, cols, PARTS, SILU_MUL)
    if PARTS > 2:
        x2 = _x_part(x_ptr, 2, cols, PARTS, SILU_MUL)
    return x0, x1, x2


@gluon.jit
def _slot_sum(y, w, s: gl.constexpr, PARTS: gl.constexpr, x0, x1, x2):
    """``y`` plus slot ``s``'s weights times its part of the input row."""
    x = x0
    if s % PARTS == 1:
        x = x1
    if s % PARTS == 2:
        x = x2
    return y + gl.sum(gl.sum(w.to(gl.float32) * gl.expand_dims(x, 0), 1), 1)


@gluon.jit
def _gated(y, s: gl.constexpr, NS: gl.constexpr, g0, g1, g2):
    """ACT's row block ``s`` (``y`` its sums, rounded here): a gate block (s < NS / 2) is kept
    in g0..g2; an up block gives silu(gate) * up with its gate block. Returns (g0, g1, g2,
    the activation: meaningful for an up block only)."""
    y = y.to(gl.bfloat16).to(gl.float32)
    if s == 0:
        g0 = y
    if s == 1:
        g1 = y
    if s == 2:
        g2 = y
    gate = g0
    if s - NS // 2 == 1:
        gate = g1
    if s - NS // 2 == 2:
        gate = g2
    return g0, g1, g2, gate / (1.0 + gl.exp(-gate)) * y


@gluon.jit
def _product(ring, ready, empty, i, x_ptr, out_ptr, row0, R: gl.constexpr,
             PARTS: gl.constexpr, SILU_MUL: gl.constexpr, RESIDUAL: gl.constexpr,
             MODE: gl.constexpr, t_x, t_wait, t_slot, t_out,
             ACT: gl.constexpr = False):  # fmt: skip
    """out[row0 : row0 + R] (+)= W . x from the ring's next slots; rounds as the GEMV does.
    The input row (up to three 1024-wide parts) is loaded into registers at once; each slot's
    weights are loaded from shared memory one slot ahead of its sums; a residual row block is
    loaded with its first part. With ACT the program's rows are gate rows then the matching up
    rows (the gate/up weight's rows ordered so), and it writes silu(gate) * up (R / 2 rows)."""
    W: gl.constexpr = ring.shape[2]  # 256
    C: gl.constexpr = 1024 // W
    RB: gl.constexpr = ring.shape[1] // C  # weight rows a slot
    NS: gl.constexpr = R // RB * PARTS  # slots of this product
    WARPS: gl.constexpr = gl.num_warps()
    layout: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 1, 32], [WARPS, 1, 1], [2, 1, 0])
    x_layout: gl.constexpr = gl.SliceLayout(0, layout)
    y_layout: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(1, layout))
    t0 = _clock()
    cols = gl.expand_dims(gl.arange(0, C, layout=gl.SliceLayout(1, x_layout)), 1) * W
    cols = cols + gl.expand_dims(gl.arange(0, W, layout=gl.SliceLayout(0, x_layout)), 0)
    x0, x1, x2 = _x_parts(x_ptr, cols, PARTS, SILU_MUL)
    t1 = _clock()
    t_x += t1 - t0
    w_next = _slot_load(ring, ready, i, layout, MODE)
    t2 = _clock()
    t_wait += t2 - t1
    y = gl.zeros([RB], gl.float32, y_layout)
    res = y
    g0 = y
    g1 = y
    g2 = y
    for s in gl.static_range(NS):
        rows = row0 + (s // PARTS) * RB + gl.arange(0, RB, layout=y_layout)
        if RESIDUAL and s % PARTS == 0:
            res = gl.load(out_ptr + rows, cache_modifier=".cg").to(gl.float32)
        w = w_next
        if s + 1 < NS:
            w_next = _slot_load(ring, ready, i + s + 1, layout, MODE)
        if MODE != 3:
            mbarrier.arrive(empty.index((i + s) % ring.shape[0]))
        if MODE != 2:
            y = _slot_sum(y, w, s, PARTS, x0, x1, x2)
            if ACT:  # PARTS == 1: a slot is a row block
                g0, g1, g2, act = _gated(y, s, NS, g0, g1, g2)
                if s >= NS // 2:
                    rows = row0 // 2 + (s - NS // 2) * RB + gl.arange(0, RB, layout=y_layout)
                    gl.store(out_ptr + rows, act.to(gl.bfloat16))
                y = gl.zeros([RB], gl.float32, y_layout)
            elif s % PARTS == PARTS - 1:
                if RESIDUAL:
                    y = y.to(gl.bfloat16).to(gl.float32) + res
                gl.store(out_ptr + rows, y.to(gl.bfloat16))
                y = gl.zeros([RB], gl.float32, y_layout)
    t_slot += _clock() - t2
    return i + NS, t_x, t_wait, t_slot, t_out


@gluon.jit
def _words_bad(words, epoch):
    """How many of these words do not carry ``epoch`` in their high half."""
    return gl.sum(gl.sum(((words >> 32).to(gl.int32) != epoch).to(gl.int32), 1), 0)


@gluon.jit
def _x_words(ptr, part, epoch, SPIN: gl.constexpr, x_layout: gl.constexpr):
    """Part ``part`` (1024 values) of a row published as words (two bf16 in the low half, the
    epoch in the high half: 8-byte stores are single-copy atomic, so a word's flag vouches for
    its values), read until every word carries ``epoch``; fp32 in ``x_layout``. Each warp reads
    and checks the whole part itself: no barrier. Returns (values, 1 if it gave up)."""
    WARPS: gl.constexpr = gl.num_warps()
    wl: gl.constexpr = gl.SliceLayout(0, gl.BlockedLayout([1, 1, 4], [1, 1, 32], [WARPS, 1, 1],
                                                          [2, 1, 0]))  # fmt: skip
    offs = gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(1, wl)), 1) * 128
    offs = offs + gl.expand_dims(gl.arange(0, 128, layout=gl.SliceLayout(0, wl)), 0)
    ptrs = ptr + part * 512 + offs
    words = gl.load(ptrs, volatile=True)
    bad = _words_bad(words, epoch)
    tries = 0
    while (bad > 0) & (tries < SPIN):
        words = gl.load(ptrs, volatile=True)
        bad = _words_bad(words, epoch)
        tries += 1
    lo = (words & 0xFFFF).to(gl.int16).to(gl.bfloat16, bitcast=True).to(gl.float32)
    hi = ((words >> 16) & 0xFFFF).to(gl.int16).to(gl.bfloat16, bitcast=True).to(gl.float32)
    x = gl.reshape(gl.join(lo, hi), [4, 256])
    return gl.convert_layout(x, x_layout), (bad > 0).to(gl.int64)


@gluon.jit
def _publish(ptr, first, y, epoch):
    """Values ``y`` (fp32, rounded to bf16 here) at row ``first`` on of a row published as words
    (pairs of bf16 and the epoch: ``_x_words``)."""
    RB: gl.constexpr = y.shape[0]
    pairs: gl.constexpr = gl.BlockedLayout([2], [32], [gl.num_warps()], [0])  # a pair a thread
    v = y.to(gl.bfloat16).to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
    v = gl.convert_layout(v, pairs)
    idx = first + gl.arange(0, RB, layout=pairs)
    lo, hi = gl.split(gl.reshape(v, [RB // 2, 2]))
    at, _ = gl.split(gl.reshape(idx, [RB // 2, 2]))
    word = (epoch.to(gl.int64) << 32) | (hi.to(gl.int64) << 16) | lo.to(gl.int64)
    gl.store(ptr + at // 2, word)


@gluon.jit
def _product_ll(ring, ready, empty, i, x_ptr, x_epoch, out_ptr, out_epoch, row0, res,
                R: gl.constexpr, PARTS: gl.constexpr, RESIDUAL: gl.constexpr,
                ACT: gl.constexpr, SPIN: gl.constexpr):  # fmt: skip
    """``_product`` with rows published as words (no grid barrier: a program starts a product
    once every word of its input carries the input's epoch). A residual product's rows are the
    program's own rows of the stream, kept in ``res`` (one row block: R == ROWS)."""
    W: gl.constexpr = ring.shape[2]  # 256
    C: gl.constexpr = 1024 // W
    RB: gl.constexpr = ring.shape[1] // C  # weight rows a slot
    NS: gl.constexpr = R // RB * PARTS  # slots of this product
    WARPS: gl.constexpr = gl.num_warps()
    layout: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 1, 32], [WARPS, 1, 1], [2, 1, 0])
    x_layout: gl.constexpr = gl.SliceLayout(0, layout)
    y_layout: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(1, layout))
    x0, stuck = _x_words(x_ptr, 0, x_epoch, SPIN, x_layout)
    x1 = x0
    x2 = x0
    if PARTS > 1:
        x1, stuck1 = _x_words(x_ptr, 1, x_epoch, SPIN, x_layout)
        stuck += stuck1
    if PARTS > 2:
        x2, stuck2 = _x_words(x_ptr, 2, x_epoch, SPIN, x_layout)
        stuck += stuck2
    w_next = _slot_load(ring, ready, i, layout, 0)
    y = gl.zeros([RB], gl.float32, y_layout)
    g0 = y
    g1 = y
    g2 = y
    for s in gl.static_range(NS):
        w = w_next
        if s + 1 < NS:
            w_next = _slot_load(ring, ready, i + s + 1, layout, 0)
        mbarrier.arrive(empty.index((i + s) % ring.shape[0]))
        y = _slot_sum(y, w, s, PARTS, x0, x1, x2)
        if ACT:  # PARTS == 1: a slot is a row block
            g0, g1, g2, act = _gated(y, s, NS, g0, g1, g2)
            if s >= NS // 2:
                _publish(out_ptr, row0 // 2 + (s - NS // 2) * RB, act, out_epoch)
            y = gl.zeros([RB], gl.float32, y_layout)
        elif s % PARTS == PARTS - 1:
            if RESIDUAL:
                y = (y.to(gl.bfloat16).to(gl.float32) + res).to(gl.bfloat16).to(gl.float32)
                res = y
            _publish(out_ptr, row0 + (s // PARTS) * RB, y, out_epoch)
            y = gl.zeros([RB], gl.float32, y_layout)
    return i + NS, res, stuck


@gluon.jit
def _consumer_ll(stream_ptr, counter_ptr, prof_ptr, stream_w, h_w, act_w, ring, ready, empty,
                 L, H: gl.constexpr, QKV: gl.constexpr, AO: gl.constexpr, I2: gl.constexpr,
                 P: gl.constexpr, SPIN: gl.constexpr):  # fmt: skip
    """MODE 7: the chain with rows published as words (``_x_words``): product k of layer l
    publishes epoch base + 4 l + k (the stream before layer 0: base), base counted on from the
    launch count (``counter``), so a replay never reads a word an earlier launch left. Every
    buffer is written once a layer; a program overwrites one only after it has read the next
    product's whole input, which every program wrote after reading this buffer."""
    pid = gl.program_id(0)
    WARPS: gl.constexpr = gl.num_warps()
    y_layout: gl.constexpr = gl.SliceLayout(
        1, gl.SliceLayout(1, gl.BlockedLayout([1, 1, 8], [1, 1, 32], [WARPS, 1, 1], [2, 1, 0]))
    )
    RB: gl.constexpr = H // P
    base = gl.load(counter_ptr) * (4 * L + 2) + 1
    rows = pid * RB + gl.arange(0, RB, layout=y_layout)
    res = gl.load(stream_ptr + rows).to(gl.float32)
    _publish(stream_w, pid * RB, res, base)
    t_start = _clock()
    i = 0
    stuck = (t_start * 0).to(gl.int64)
    for layer in range(L):
        e = base + 4 * layer
        i, res, k = _product_ll(ring, ready, empty, i, stream_w, e, h_w, e + 1, pid * (QKV // P),
                                res, QKV // P, H // 1024, False, False, SPIN)  # fmt: skip
        stuck += k
        i, res, k = _product_ll(ring, ready, empty, i, h_w, e + 1, stream_w, e + 2, pid * RB, res,
                                RB, AO // 1024, True, False, SPIN)  # fmt: skip
        stuck += k
        i, res, k = _product_ll(ring, ready, empty, i, stream_w, e + 2, act_w, e + 3,
                                pid * (I2 // P), res, I2 // P, H // 1024, False, True,
                                SPIN)  # fmt: skip
        stuck += k
        i, res, k = _product_ll(ring, ready, empty, i, act_w, e + 3, stream_w, e + 4, pid * RB,
                                res, RB, I2 // 2048, True, False, SPIN)  # fmt: skip
        stuck += k
    gl.store(stream_ptr + rows, res.to(gl.bfloat16))
    base_ptr = prof_ptr + pid * 8
    gl.store(base_ptr, _clock() - t_start)
    gl.store(base_ptr + 4, stuck)
    if pid == 0:  # every program has read the launch count by now (see above)
        gl.atomic_add(counter_ptr, 1)


@gluon.jit
def _consumer(stream_ptr, h_ptr, g_ptr, counter_ptr, prof_ptr, ring, ready, empty, L,
              H: gl.constexpr, QKV: gl.constexpr, AO: gl.constexpr, I2: gl.constexpr,
              P: gl.constexpr, MODE: gl.constexpr):  # fmt: skip
    """MODE 0: the chain; 1: no grid barriers (the streaming bound, wrong results); 2: no
    barriers and no products (the slots waited for and released: the TMA stream alone); 3: no
    barriers and no loads (the products of whatever the slots hold: the consumer alone); 4: the
    chain, its barriers polled by acquire loads; 5: the chain, gate/up writing silu(gate) * up
    (its weight rows ordered so that a program has matching gate and up rows); 6: the barriers
    alone."""
    pid = gl.program_id(0)
    i = 0
    t_x = _clock() * 0
    t_wait = t_x
    t_slot = t_x
    t_out = t_x
    t_sync = t_x
    t_start = _clock()
    for layer in range(L):
        step = layer * 4
        if MODE != 6:
            i, t_x, t_wait, t_slot, t_out = _product(
                ring, ready, empty, i, stream_ptr, h_ptr, pid * (QKV // P), QKV // P, H // 1024,
                False, False, MODE, t_x, t_wait, t_slot, t_out)  # fmt: skip
        ts = _clock()
        if MODE == 0 or MODE >= 4:
            _grid_sync(counter_ptr, (step + 1) * P, MODE == 4)
        t_sync += _clock() - ts
        if MODE != 6:
            i, t_x, t_wait, t_slot, t_out = _product(
                ring, ready, empty, i, h_ptr, stream_ptr, pid * (H // P), H // P, AO // 1024,
                False, True, MODE, t_x, t_wait, t_slot, t_out)  # fmt: skip
        ts = _clock()
        if MODE == 0 or MODE >= 4:
            _grid_sync(counter_ptr, (step + 2) * P, MODE == 4)
        t_sync += _clock() - ts
        if MODE != 6:
            i, t_x, t_wait, t_slot, t_out = _product(
                ring, ready, empty, i, stream_ptr, g_ptr, pid * (I2 // P), I2 // P, H // 1024,
                False, False, MODE, t_x, t_wait, t_slot, t_out, MODE == 5)  # fmt: skip
        ts = _clock()
        if MODE == 0 or MODE >= 4:
            _grid_sync(counter_ptr, (step + 3) * P, MODE == 4)
        t_sync += _clock() - ts
        if MODE != 6:
            i, t_x, t_wait, t_slot, t_out = _product(
                ring, ready, empty, i, g_ptr, stream_ptr, pid * (H // P), H // P, I2 // 2048,
                MODE != 5, True, MODE, t_x, t_wait, t_slot, t_out)  # fmt: skip
        ts = _clock()
        if MODE == 0 or MODE >= 4:
            _grid_sync(counter_ptr, (step + 4) * P, MODE == 4)
        t_sync += _clock() - ts
    # cycles a program spent: in all, loading x, waiting for slots, on slots, writing, syncing
    base = prof_ptr + pid * 8
    gl.store(base, _clock() - t_start)
    gl.store(base + 1, t_x)
    gl.store(base + 2, t_wait)
    gl.store(base + 3, t_slot)
    gl.store(base + 4, t_out)
    gl.store(base + 5, t_sync)


@gluon.jit
def _chain_fwd(stream_ptr, h_ptr, g_ptr, counter_ptr, prof_ptr, stream_w, h_w, act_w, wa, wb,
               wc, wc_act, wd, L,
               H: gl.constexpr, QKV: gl.constexpr, AO: gl.constexpr, I2: gl.constexpr,
               P: gl.constexpr, STAGES: gl.constexpr, MODE: gl.constexpr):  # fmt: skip
    BOX: gl.constexpr = wa.block_type.shape[0]
    W: gl.constexpr = wa.block_type.shape[1]
    ring = gl.allocate_shared_memory(wa.dtype, [STAGES, BOX, W], wa.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    fence_async_shared()
    if MODE == 7:
        gl.warp_specialize([
            (_consumer_ll, (stream_ptr, counter_ptr, prof_ptr, stream_w, h_w, act_w, ring, ready,
                            empty, L, H, QKV, AO, I2, P, 1 << 16)),
            (_producer, (wa, wb, wc, wc_act, wd, ring, ready, empty, L, H, QKV, AO, I2, P, MODE)),
        ], [1], [24])  # fmt: skip
    else:
        gl.warp_specialize([
            (_consumer, (stream_ptr, h_ptr, g_ptr, counter_ptr, prof_ptr, ring, ready, empty, L,
                         H, QKV, AO, I2, P, MODE)),
            (_producer, (wa, wb, wc, wc_act, wd, ring, ready, empty, L, H, QKV, AO, I2, P, MODE)),
        ], [1], [24])  # fmt: skip


def descriptors(w: torch.Tensor, layers: int, dims, p: int = 128) -> list[TensorDescriptor]:
    """Each product's weights as [L, parts, N, 1024] (K split into 1024-wide parts), read as
    rows of 256: a slot of ROWS weight rows of one part is one box of contiguous memory."""
    hidden, qkv, ao, i2 = dims
    shapes = [(qkv, hidden), (hidden, ao), (i2, hidden), (hidden, i2 // 2)]
    box = [ROWS * PART // 256, 256]
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    out = []
    weights = list(w.split([n * k for n, k in shapes], dim=1))
    # gate/up again, its rows ordered so that program p's are gate's and up's [p * I / P, ...)
    inter = i2 // 2
    per = inter // p
    order = torch.arange(inter).view(p, per)
    order = torch.cat([order, order + inter], dim=1).flatten()
    weights.insert(3, weights[2].view(layers, i2, hidden)[:, order.to(w.device)].flatten(1))
    shapes.insert(3, shapes[2])
    for part, (n, k) in zip(weights, shapes):
        parts = part.reshape(layers, n, k // PART, PART).transpose(1, 2).contiguous()
        rows = parts.view(-1, 256)
        out.append(TensorDescriptor(rows, list(rows.shape), [256, 1], box, layout))
    return out


def gluon_chain(stream, h, g, counter, prof, descs, layers, dims, p=128, stages=12, mode=0,
                warps=4, words=None):  # fmt: skip
    """``stages`` ring slots of 16 KiB each (12: 192 KiB). Mode 7 publishes rows as ``words``
    (``word_buffers``) and counts launches in ``counter``: it must not be zeroed between them."""
    hidden, qkv, ao, i2 = dims
    if mode != 7:
        counter.zero_()
    words = words if words is not None else (stream, stream, stream)
    _chain_fwd[(p,)](stream, h, g, counter, prof, *words, *descs, layers, H=hidden, QKV=qkv,
                     AO=ao, I2=i2, P=p, STAGES=stages, MODE=mode, num_warps=warps)  # fmt: skip


def word_buffers(dims, device) -> tuple[torch.Tensor, ...]:
    """The stream, q/k/v and activation rows as mode 7 publishes them: two bf16 a word."""
    hidden, qkv, _, i2 = dims
    return tuple(torch.zeros(n // 2, dtype=torch.int64, device=device)
                 for n in (hidden, qkv, i2 // 2))  # fmt: skip


def compile_only() -> None:
    """Compile for sm_90 here (no GPU): the kernel's types, layouts and shared memory."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "tests"))  # fmt: skip
    import sm90_compile

    dims, layers = (1024, 4096, 2048, 6144), 2
    stream, w, h, g, counter = make(layers, dims, "cpu")
    descs = descriptors(w, layers, dims)
    prof = torch.zeros(128, 8, dtype=torch.int64)
    for stages in (12,):
        for mode in (0, 1, 2, 3, 4, 5, 6, 7):
            for warps in (4, 8):
                sm90_compile.CompileOnly(_chain_fwd)[(128,)](
                    stream, h, g, counter, prof, *word_buffers(dims, "cpu"), *descs, layers,
                    H=1024, QKV=4096, AO=2048, I2=6144, P=128, STAGES=stages, MODE=mode,
                    num_warps=warps)  # fmt: skip
                print(f"compiled stages={stages} mode={mode} warps={warps}", flush=True)


def main() -> None:
    from nanograph.bench.common import graphed_samples, median

    dims, layers = (1024, 4096, 2048, 6144), 28  # qwen3-0.6b's products
    p = 128
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(torch.cuda.get_device_name(), f"SMs {sms}", flush=True)
    stream0, w, h, g, counter = make(layers, dims, "cuda")
    descs = descriptors(w, layers, dims)
    prof = torch.zeros(p, 8, dtype=torch.int64, device="cuda")
    want = stream0.clone()
    gemv_chain(want, w, h, g, layers, dims)
    arms = {"gemv": lambda s: gemv_chain(s, w, h, g, layers, dims)}
    labels = {0: "gluon", 1: "no-sync", 2: "tma-only", 3: "math-only", 4: "gluon-ld",
              5: "gluon-act", 6: "barriers", 7: "words"}  # fmt: skip
    modes = {int(m): labels[int(m)] for m in os.environ.get("MODES", "7,5,0").split(",")}
    words = word_buffers(dims, "cuda")
    for arm in os.environ.get("ARMS", "12w4,12w8,6w4").split(","):
        stages, warps = (int(x) for x in arm.split("w"))
        for mode, label in modes.items():
            arms[f"{label} {arm}"] = lambda s, n=stages, m=mode, w=warps: gluon_chain(
                s, h, g, counter, prof, descs, layers, dims, p, stages=n, mode=m, warps=w,
                words=words)  # fmt: skip
    for name, run in arms.items():
        stream = stream0.clone()
        prof.zero_()
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
        if "words" in name:  # reads that gave up waiting (0 unless the epochs are wrong)
            print(f"    gave up: {int(prof[:, 4].sum())}", flush=True)
        elif name != "gemv":  # a program's cycles a layer (median over programs; one cold run)
            counts = prof[:, :6].float() / layers
            for label, parts in (("median", counts.median(dim=0).values),
                                 ("min", counts.min(dim=0).values),
                                 ("max", counts.max(dim=0).values)):  # fmt: skip
                cells = ", ".join(f"{k} {v:.0f}" for k, v in zip(PROFILE, parts.tolist()))
                print(f"    cycles a layer, {label} over programs: {cells}", flush=True)


if __name__ == "__main__":
    if "--compile" in sys.argv:
        compile_only()
    else:
        main()
