"""Is a persistent decode kernel worth building? A chain of qwen3-0.6b's one-row products, 28
layers, as one persistent kernel with grid-wide barriers against the graph of GEMV launches the
engine replays (stop 60; run on the device from the repo root:
``python3 docs/wip/persistent_chain_probe.py``; ``--check`` runs the math on CPU under
TRITON_INTERPRET=1 with one program).

Why: issue 18 asks qwen3-0.6b batch 1 for 55% of the HBM roofline; the engine is at 48% on an
H100 (bd9bd52). Its one-row GEMVs stream 1.2-2.2 TB/s (each a single short wave: ramp up, one
or two DRAM round trips, ramp down, ~1.3-1.9 us a product over its bytes' time), and PDL hid
little of that (stop 59: the in-graph times equal the isolated ones). Stop 59's ``norm_out``
found one grid-wide hand-off (hundreds of programs counting in on one address) dearer than a
kernel boundary, which argues against a persistent kernel; but there every program fenced,
counted in and then one program did serial work. Here the question is measured directly: the
products of a layer (q/k/v, o + residual, gate/up, down with SiLU-and-mul in its prologue +
residual; no norms, no attention) over 28 layers of distinct weights (880 MB: every replay
streams them from HBM), as
- ``gemv``: 4 x 28 launches of the engine's GEMV (PDL on sm_90), replayed as one graph;
- ``persistent``: one launch of P = 128 programs (at most one an SM), each owning the same
  output rows of a product in every layer, a grid barrier (one counter, an atomic add a
  program, then polling) after each product; ``ahead=D`` also prefetches into the L2, at each
  product's start, the weights of the product D after it (1/P of them a program), so HBM
  streams across the barriers;
- ``barriers``: the persistent kernel's barriers alone (its products compiled out).
Checks the persistent chain's final residual stream against the GEMV chain's.
PREDICTED (H100, before any run): the GEMV chain ~17 us a layer (stop 59's in-graph products:
4.23 + 3.36 + 5.66 + 4.19); a barrier 1-2 us; persistent without prefetch 15-20 us a layer,
with ahead=2 11-14 (HBM time of a layer's 31.5 MB at 3.0 TB/s: 10.5).
MEASURED (stop 60, H100, 132 SMs, ``h100/stop60_c25a30c/persistent/``, two runs): the GEMV
chain **16.9 us a layer**; the barriers alone 4.2-4.3 us a layer (**~1.05 us a barrier**, any
warp count); persistent 20.7 (16 warps) to 24.0 (4 warps) us a layer without prefetch,
**30-34 with the L2 prefetch** (ahead 1 or 2: the layer's HBM time again, as if every
prefetched line were read twice); each program's next weight slice in registers before the
barrier 20.1 (16 warps, spilling) to 21.3. Results equal the GEMV chain's (0 difference; the
register variant 0.0078 of the largest, its sums in another order). Wrong about the prefetch
and about the products: past its barriers the persistent chain spends ~16 us a layer on the
products, as much as the separate PDL GEMVs take in all. A kernel boundary under PDL costs
about what a grid barrier does, and the separate launches keep more bytes in flight. With
stop 44's persistent MoE block (39.3 against 34.9 us a layer) this closes the persistent
kernel in Triton as the way to issue 18's batch-1 aim.
"""

import sys

import torch
import triton
import triton.language as tl

from nanograph.kernels import pdl


@triton.jit
def _grid_sync(counter_ptr, target):
    """Every program's writes so far are visible to every program after this (the CTA barrier,
    then one release add a program; polling with acquire loads)."""
    tl.debug_barrier()
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _product(x_ptr, w_ptr, out_ptr, pid, N: tl.constexpr, K: tl.constexpr,
             SILU_MUL: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, REPS: tl.constexpr, P: tl.constexpr):  # fmt: skip
    """out[n] (+)= w[n, :] . x for this program's REPS blocks of BLOCK_N rows (blocks pid,
    pid + P, ...); with SILU_MUL x is [2K] and silu(x[:K]) * x[K:] is the row multiplied; with
    RESIDUAL the product rounded to bf16 is added to out in place. Rounds as the GEMV does.
    Activations are read with .cg (past the L1: other SMs wrote them)."""
    offs_k = tl.arange(0, BLOCK_K)
    for i in tl.static_range(REPS):
        offs_n = (pid + i * P) * BLOCK_N + tl.arange(0, BLOCK_N)
        rows = w_ptr + offs_n.to(tl.int64)[:, None] * K
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            w = tl.load(rows + (k0 + offs_k)[None, :], eviction_policy="evict_first")
            x = tl.load(x_ptr + k0 + offs_k, cache_modifier=".cg")
            if SILU_MUL:
                gate = x.to(tl.float32)
                up = tl.load(x_ptr + K + k0 + offs_k, cache_modifier=".cg").to(tl.float32)
                x = (gate * tl.sigmoid(gate) * up).to(out_ptr.dtype.element_ty)
            acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        y = tl.sum(acc, 1)
        if RESIDUAL:
            y = y.to(out_ptr.dtype.element_ty).to(tl.float32)
            y += tl.load(out_ptr + offs_n, cache_modifier=".cg").to(tl.float32)
        tl.store(out_ptr + offs_n, y.to(out_ptr.dtype.element_ty))


@triton.jit
def _prefetch(w_ptr, start, SIZE: tl.constexpr, pid, P: tl.constexpr, LINES: tl.constexpr):
    """L2 prefetch of this program's 1/P of w[start : start + SIZE] (bf16, 64 a line)."""
    chunk: tl.constexpr = SIZE // P
    line = tl.arange(0, LINES)
    ptrs = w_ptr + start + pid * chunk + line * 64
    pdl.prefetch_l2(tl.where(line * 64 < chunk, ptrs, w_ptr + start))


@triton.jit
def _chain_kernel(stream_ptr, w_ptr, h_ptr, g_ptr, counter_ptr, L,
                  H: tl.constexpr, QKV: tl.constexpr, AO: tl.constexpr, I2: tl.constexpr,
                  BN_A: tl.constexpr, BN_B: tl.constexpr, BN_C: tl.constexpr,
                  BN_D: tl.constexpr, R_A: tl.constexpr, R_B: tl.constexpr, R_C: tl.constexpr,
                  R_D: tl.constexpr, BLOCK_K: tl.constexpr, P: tl.constexpr,
                  AHEAD: tl.constexpr, LINES: tl.constexpr, EMPTY: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    SIZE_A: tl.constexpr = QKV * H
    SIZE_B: tl.constexpr = H * AO
    SIZE_C: tl.constexpr = I2 * H
    SIZE_D: tl.constexpr = H * (I2 // 2)
    OFF_B: tl.constexpr = SIZE_A
    OFF_C: tl.constexpr = SIZE_A + SIZE_B
    OFF_D: tl.constexpr = SIZE_A + SIZE_B + SIZE_C
    LAYER: tl.constexpr = SIZE_A + SIZE_B + SIZE_C + SIZE_D
    for layer in range(L):
        wl = w_ptr + tl.cast(layer, tl.int64) * LAYER
        step = layer * 4
        # prefetches: the product AHEAD after each (1: the next in this layer; 2: two on)
        if AHEAD == 1:
            _prefetch(wl, OFF_B, SIZE_B, pid, P, LINES)
        if AHEAD == 2:
            _prefetch(wl, OFF_C, SIZE_C, pid, P, LINES)
        if not EMPTY:
            _product(stream_ptr, wl, h_ptr, pid, QKV, H, False, False, BN_A, BLOCK_K, R_A, P)
        _grid_sync(counter_ptr, (step + 1) * P)
        if AHEAD == 1:
            _prefetch(wl, OFF_C, SIZE_C, pid, P, LINES)
        if AHEAD == 2:
            _prefetch(wl, OFF_D, SIZE_D, pid, P, LINES)
        if not EMPTY:
            _product(h_ptr, wl + OFF_B, stream_ptr, pid, H, AO, False, True, BN_B, BLOCK_K,
                     R_B, P)  # fmt: skip
        _grid_sync(counter_ptr, (step + 2) * P)
        if AHEAD == 1:
            _prefetch(wl, OFF_D, SIZE_D, pid, P, LINES)
        if AHEAD == 2:
            if layer + 1 < L:
                _prefetch(wl + LAYER, 0, SIZE_A, pid, P, LINES)
        if not EMPTY:
            _product(stream_ptr, wl + OFF_C, g_ptr, pid, I2, H, False, False, BN_C, BLOCK_K,
                     R_C, P)  # fmt: skip
        _grid_sync(counter_ptr, (step + 3) * P)
        if AHEAD == 1:
            if layer + 1 < L:
                _prefetch(wl + LAYER, 0, SIZE_A, pid, P, LINES)
        if AHEAD == 2:
            if layer + 1 < L:
                _prefetch(wl + LAYER, OFF_B, SIZE_B, pid, P, LINES)
        if not EMPTY:
            _product(g_ptr, wl + OFF_D, stream_ptr, pid, H, I2 // 2, True, True, BN_D,
                     BLOCK_K, R_D, P)  # fmt: skip
        _grid_sync(counter_ptr, (step + 4) * P)


@triton.jit
def _tile(w_ptr, pid, N: tl.constexpr, K: tl.constexpr, P: tl.constexpr):
    """This program's whole slice of a product's weight, rows [pid * N / P, (pid + 1) * N / P),
    as one register tile (padded to powers of two, masked): one load, every byte in flight."""
    RP: tl.constexpr = triton.next_power_of_2(N // P)
    KP: tl.constexpr = triton.next_power_of_2(K)
    r = tl.arange(0, RP)
    k = tl.arange(0, KP)
    rows = pid * (N // P) + r
    ptrs = w_ptr + rows.to(tl.int64)[:, None] * K + k[None, :]
    mask = (r < N // P)[:, None] & (k < K)[None, :]
    return tl.load(ptrs, mask=mask, other=0.0, eviction_policy="evict_first")


@triton.jit
def _apply(w, x_ptr, out_ptr, pid, N: tl.constexpr, K: tl.constexpr, P: tl.constexpr,
           SILU_MUL: tl.constexpr, RESIDUAL: tl.constexpr):  # fmt: skip
    """out (+)= the tile's rows . x, as ``_product`` rounds."""
    RP: tl.constexpr = triton.next_power_of_2(N // P)
    KP: tl.constexpr = triton.next_power_of_2(K)
    r = tl.arange(0, RP)
    k = tl.arange(0, KP)
    x = tl.load(x_ptr + k, mask=k < K, other=0.0, cache_modifier=".cg")
    if SILU_MUL:
        gate = x.to(tl.float32)
        up = tl.load(x_ptr + K + k, mask=k < K, other=0.0, cache_modifier=".cg").to(tl.float32)
        x = (gate * tl.sigmoid(gate) * up).to(out_ptr.dtype.element_ty)
    y = tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], 1)
    rows = pid * (N // P) + r
    mask = r < N // P
    if RESIDUAL:
        y = y.to(out_ptr.dtype.element_ty).to(tl.float32)
        y += tl.load(out_ptr + rows, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _pipe_kernel(stream_ptr, w_ptr, h_ptr, g_ptr, counter_ptr, L, H: tl.constexpr,
                 QKV: tl.constexpr, AO: tl.constexpr, I2: tl.constexpr,
                 P: tl.constexpr):  # fmt: skip
    """The chain with each program's next weight slice loaded into registers before the
    barrier it must wait at (one product ahead: the load streams while the grid syncs)."""
    pid = tl.program_id(0)
    SIZE_A: tl.constexpr = QKV * H
    SIZE_B: tl.constexpr = H * AO
    SIZE_C: tl.constexpr = I2 * H
    OFF_B: tl.constexpr = SIZE_A
    OFF_C: tl.constexpr = SIZE_A + SIZE_B
    OFF_D: tl.constexpr = SIZE_A + SIZE_B + SIZE_C
    LAYER: tl.constexpr = OFF_D + H * (I2 // 2)
    wa = _tile(w_ptr, pid, QKV, H, P)
    for layer in range(L):
        wl = w_ptr + tl.cast(layer, tl.int64) * LAYER
        step = layer * 4
        _apply(wa, stream_ptr, h_ptr, pid, QKV, H, P, False, False)
        wb = _tile(wl + OFF_B, pid, H, AO, P)
        _grid_sync(counter_ptr, (step + 1) * P)
        _apply(wb, h_ptr, stream_ptr, pid, H, AO, P, False, True)
        wc = _tile(wl + OFF_C, pid, I2, H, P)
        _grid_sync(counter_ptr, (step + 2) * P)
        _apply(wc, stream_ptr, g_ptr, pid, I2, H, P, False, False)
        wd = _tile(wl + OFF_D, pid, H, I2 // 2, P)
        _grid_sync(counter_ptr, (step + 3) * P)
        _apply(wd, g_ptr, stream_ptr, pid, H, I2 // 2, P, True, True)
        nxt = w_ptr + tl.cast((layer + 1) % L, tl.int64) * LAYER  # past the last: layer 0's
        wa = _tile(nxt, pid, QKV, H, P)
        _grid_sync(counter_ptr, (step + 4) * P)


def pipe_chain(stream, w, h, g, counter, layers, dims, p, warps=16):
    hidden, qkv, ao, i2 = dims
    counter.zero_()
    _pipe_kernel[(p,)](stream, w, h, g, counter, layers, H=hidden, QKV=qkv, AO=ao, I2=i2, P=p,
                       num_warps=warps, num_stages=1)  # fmt: skip


def _blocks(n: int, p: int, largest: int) -> tuple[int, int]:
    """(BLOCK_N, blocks a program) splitting n rows evenly over p programs."""
    per = n // p
    assert per * p == n, (n, p)
    block = min(largest, per & -per)  # the largest power of two dividing it
    return block, per // block


def persistent_chain(stream, w, h, g, counter, layers, dims, p, ahead=0, warps=8,
                     block_k=512, empty=False):  # fmt: skip
    hidden, qkv, ao, i2 = dims
    (bn_a, r_a), (bn_b, r_b) = _blocks(qkv, p, 32), _blocks(hidden, p, 32)
    (bn_c, r_c), (bn_d, r_d) = _blocks(i2, p, 16), _blocks(hidden, p, 32)
    largest = max(qkv * hidden, hidden * ao, i2 * hidden, hidden * i2 // 2)
    lines = triton.next_power_of_2(max(1, largest // p // 64))
    counter.zero_()
    _chain_kernel[(p,)](
        stream, w, h, g, counter, layers, H=hidden, QKV=qkv, AO=ao, I2=i2, BN_A=bn_a,
        BN_B=bn_b, BN_C=bn_c, BN_D=bn_d, R_A=r_a, R_B=r_b, R_C=r_c, R_D=r_d,
        BLOCK_K=min(block_k, hidden), P=p, AHEAD=ahead, LINES=lines, EMPTY=empty,
        num_warps=warps, num_stages=3,
    )  # fmt: skip


def gemv_chain(stream, w, h, g, layers, dims):
    """The engine's way: one GEMV launch a product (PDL on sm_90), residuals in place."""
    from nanograph.kernels.gemv import GemvTiles, gemv

    hidden, qkv, ao, i2 = dims
    sizes = [qkv * hidden, hidden * ao, i2 * hidden, hidden * i2 // 2]
    tiles = None if stream.is_cuda else GemvTiles(4, 16, 1, 1)
    for layer in range(layers):
        wa, wb, wc, wd = w[layer].split(sizes)
        gemv(stream, wa.view(qkv, hidden), out=h, tiles=tiles)
        gemv(h[:, :ao], wb.view(hidden, ao), residual=stream, tiles=tiles)
        gemv(stream, wc.view(i2, hidden), out=g, tiles=tiles)
        gemv(g, wd.view(hidden, i2 // 2), silu_mul=True, residual=stream, tiles=tiles)


def make(layers, dims, device):
    hidden, qkv, ao, i2 = dims
    per_layer = qkv * hidden + hidden * ao + i2 * hidden + hidden * i2 // 2
    gen = torch.Generator(device="cpu").manual_seed(0)
    # 0.25 / sqrt(H): the stream stays finite over 28 layers (at 0.5 it overflows)
    w = (torch.randn(layers, per_layer, generator=gen) * 0.25 / hidden**0.5).to(torch.bfloat16)
    stream = torch.randn(1, hidden, generator=gen).to(torch.bfloat16)
    h = torch.zeros(1, qkv, dtype=torch.bfloat16)
    g = torch.zeros(1, i2, dtype=torch.bfloat16)
    counter = torch.zeros(1, dtype=torch.int32)
    return [t.to(device) for t in (stream, w, h, g, counter)]


def check() -> None:
    dims, layers = (32, 64, 32, 96), 3
    for warps in (1, 2):
        stream, w, h, g, counter = make(layers, dims, "cpu")
        want = stream.clone()
        gemv_chain(want, w, h.clone(), g.clone(), layers, dims)
        persistent_chain(stream, w, h, g, counter, layers, dims, p=1, warps=warps, block_k=16)
        err = ((stream.float() - want.float()).abs().max() / want.float().abs().max()).item()
        assert err < 2e-2, err
        assert counter.item() == 4 * layers
        stream, w, h, g, counter = make(layers, dims, "cpu")
        pipe_chain(stream, w, h, g, counter, layers, dims, p=1, warps=warps)
        err = ((stream.float() - want.float()).abs().max() / want.float().abs().max()).item()
        assert err < 2e-2, err
    print("check: ok")


def main() -> None:
    from nanograph.bench.common import graphed_samples, median

    dims, layers = (1024, 4096, 2048, 6144), 28  # qwen3-0.6b's products
    p = 128
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(torch.cuda.get_device_name(), f"SMs {sms}")
    stream0, w, h, g, counter = make(layers, dims, "cuda")
    want = stream0.clone()
    gemv_chain(want, w, h, g, layers, dims)
    arms = {"gemv": lambda s: gemv_chain(s, w, h, g, layers, dims)}
    for warps in (8, 16, 32):
        arms[f"registers ahead w{warps}"] = lambda s, n=warps: pipe_chain(
            s, w, h, g, counter, layers, dims, p, warps=n)  # fmt: skip
    for warps in (8, 16):
        arms[f"barriers w{warps}"] = lambda s, n=warps: persistent_chain(
            s, w, h, g, counter, layers, dims, p, warps=n, empty=True)  # fmt: skip
        for ahead in (0, 1):
            arms[f"persistent w{warps} ahead={ahead}"] = lambda s, n=warps, a=ahead: (
                persistent_chain(s, w, h, g, counter, layers, dims, p, ahead=a, warps=n)
            )
    for name, run in arms.items():
        stream = stream0.clone()
        try:
            run(stream)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - out of resources, a hang caught by timeout
            print(f"{name}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        err = ((stream.float() - want.float()).abs().max() / want.float().abs().max()).item()
        scratch = stream0.clone()
        ms = median(graphed_samples(lambda r=run, s=scratch: r(s), 200))
        print(f"{name:28s} {1000 * ms / layers:6.2f} us a layer ({ms:.3f} ms for {layers}), "
              f"max err against gemv {err:.2g} of the largest, counter {counter.item()} "
              f"(expected {4 * layers * p})", flush=True)  # fmt: skip


if __name__ == "__main__":
    if "--check" in sys.argv:
        check()
    else:
        main()
