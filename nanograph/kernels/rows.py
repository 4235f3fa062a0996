"""Few-row matrix products: ``out[M, N] = x[M, K] @ weight[N, K]^T`` for 2 <= M <= ``MAX_ROWS``
(a speculative verify of k + 1 tokens at batch 1, a decode batch of a few requests;
``layers.ops`` sends products of 2 to ``FEW_ROWS`` rows here).

Why: like a batch-1 decode step, such a product is a stream through the weight. cuBLAS picks
tiles for qwen3-8b's 5-row products that stream the q/k/v, o and down weights at 3.1, 2.5 and
3.2 TB/s on the H200. This kernel puts the weight in the MMA's A operand (``swap-AB``, as
small-M GEMM kernels do): a program multiplies a [BLOCK_N, BLOCK_K] weight tile by the
[BLOCK_K, 16] transposed rows, rows past M masked, so on Hopper a 64-row weight tile is one
warpgroup MMA fed by asynchronous copies, pipelined ``num_stages`` deep. Measured (stop 39,
``nanograph bench gemv --rows 5,8 --sweep``, ``benchmarks/results/h200/stop39_*``): qwen3-8b's
5-row q/k/v, o and down products in 15.5 / 11.1 / 28.0 us against cuBLAS's 16.1 / 13.6 / 31.3,
gate/up with the activation in 50.4 against cuBLAS's product and activation kernel's 52.8, the
LM head in 280.8 against 301.9. Shapes that lost (``docs/wip/rows_proto.py``): the rows as the A
operand in 16 x 16 tiles (263082c, reverted), the one-row GEMV's elementwise products with the
rows in registers (2.5-3x slower), and a SiLU-and-mul of x on load for the down projection (3x
slower in every tile: the activated rows pass through registers, which breaks the copy
pipeline), so the activation is fused into the gate/up product's epilogue (``silu_out``).

Invariants:
- Graph-safe: the grid depends on static shapes only; M is a runtime value (not specialized),
  so one compiled variant per product shape serves every row count from 2 to MAX_ROWS.
- Products accumulate in fp32 over K and are rounded once to x's dtype.
- ``silu_out``: the weight is ``[2N, K]``, gate rows then up rows (the MLP's packed gate/up); a
  program multiplies gate rows n and up rows N + n of its BLOCK_N outputs, rounds both to the
  dtype as the plain product would write them, and writes only ``silu(gate) * up``: exactly
  what ``fused.silu_and_mul`` of the plain product would have written.
- An RMSNorm taken in (``norm``, a ``NormedRows``): x is the residual stream's rows times the
  norm's weight, written with the stream's sums of squares in parts by the product that last
  added into the stream (``next_norm``); each program loads the parts before its weight
  stream, sums them in one fixed order and scales its output rows by 1/rms before rounding.
  Not the unfused path's numbers (that rounds ``x * 1/rms * weight``, this ``x * weight``):
  within the dtype's rounding of them.
- ``residual``: ``residual += product`` in place (the product rounded to the dtype first, the
  sum rounded once, as ``add_rmsnorm`` adds), by the program that writes each output (which
  loads its slice of the stream before its weight stream); with ``next_norm = (g, eps)``
  that program also writes its slice of the updated stream times g (rounded once) and of
  its rows' sums of squares (of the stream as rounded): each program its own columns and
  part, no hand-off between them.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from nanograph.kernels import pdl
from nanograph.kernels.counters import split_counters
from nanograph.kernels.launch import LaunchCache

# Rows a launch takes: the MMA's rows (the kernel's ROWS), padded (rows past M are masked)
MAX_ROWS = 16


@dataclasses.dataclass(frozen=True)
class RowsTiles:
    block_n: int = 64
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 5
    split_k: int = 1  # programs sharing one weight tile's K range (the last to finish reduces)


@triton.jit(do_not_specialize=["M", "norm_tiles"])
def _rows_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    part_ptr,  # fp32 [split_k, 2 if SILU_OUT else 1, ROWS, N]: split-K partials
    counters_ptr,  # int32, one per weight tile, zero between launches (kernels/counters.py)
    sumsq_in_ptr,  # NORM: fp32 [norm_tiles, ROWS], the stream's sums of squares in parts
    scaled_ptr,  # SCALED: where residual * g goes
    scale_w_ptr,  # SCALED: g [N]
    sumsq_out_ptr,  # SCALED: fp32 [programs on N, ROWS], each one's columns' sums of squares
    M,
    N,
    K,
    K_SPLIT,  # K columns a program multiplies (a multiple of BLOCK_K)
    stride_xm,
    stride_wn,
    stride_om,
    stride_sm,
    norm_tiles,
    eps,
    SILU_OUT: tl.constexpr,
    NORM: tl.constexpr,  # scale output row m by 1 / rms of the stream (module docstring)
    NORM_TILES: tl.constexpr,  # norm_tiles' next power of two
    RESIDUAL: tl.constexpr,  # out is the residual stream: out += product
    SCALED: tl.constexpr,  # with RESIDUAL: also scaled = the updated stream * g
    SPLIT_K: tl.constexpr,
    PDL: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    L2_STEP: tl.constexpr,  # weight elements in a 128-byte line
):
    ROWS: tl.constexpr = 16  # MAX_ROWS: the MMA's smallest N; rows at or past M are masked
    k_start = tl.program_id(1) * K_SPLIT
    k_len = tl.minimum(K_SPLIT, K - k_start)
    offs_m = tl.arange(0, ROWS)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = (offs_n < N)[:, None]
    m_mask = (offs_m < M)[:, None]
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + k_start + offs_k[None, :]
    up_rows = w_rows + N.to(tl.int64) * stride_wn  # SILU_OUT: the up rows, N rows further
    x_rows = x_ptr + offs_m[:, None] * stride_xm + k_start + offs_k[None, :]
    if PDL:
        # this program's first two weight blocks into the L2 while the kernel before it
        # finishes (rows past N and columns past K read row N - 1 and column K - 1)
        lines = tl.arange(0, 2 * BLOCK_K // L2_STEP) * L2_STEP
        n_in = tl.minimum(offs_n, N - 1).to(tl.int64)[:, None] * stride_wn
        k_in = k_start + tl.minimum(lines, k_len - 1)[None, :]
        pdl.prefetch_l2(w_ptr + n_in + k_in)
        if SILU_OUT:
            pdl.prefetch_l2(w_ptr + N.to(tl.int64) * stride_wn + n_in + k_in)
        tl.extra.cuda.gdc_wait()  # x was written by the kernel before
    # loaded before the loop, used after it: their latency hides under the weight's stream
    if NORM:
        tiles = tl.arange(0, NORM_TILES)
        sumsq_parts = tl.load(sumsq_in_ptr + tiles[:, None] * ROWS + offs_m[None, :],
                              mask=(tiles < norm_tiles)[:, None], other=0.0)  # fmt: skip
    out = out_ptr + offs_m[None, :] * stride_om + offs_n[:, None]
    out_mask = n_mask & (offs_m < M)[None, :]
    if RESIDUAL:
        stream = tl.load(out, mask=out_mask, other=0.0).to(tl.float32)
    if SCALED:
        g = tl.load(scale_w_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK_N, ROWS], tl.float32)
    acc_up = acc
    for k0 in range(0, k_len, BLOCK_K):  # pipelined num_stages deep (a launch option)
        k_mask = (k0 + offs_k < k_len)[None, :]
        x = tl.load(x_rows + k0, mask=m_mask & k_mask, other=0.0)
        w = tl.load(w_rows + k0, mask=n_mask & k_mask, other=0.0, eviction_policy="evict_first")
        acc = tl.dot(w, tl.trans(x), acc)
        if SILU_OUT:
            w_up = tl.load(up_rows + k0, mask=n_mask & k_mask, other=0.0,
                           eviction_policy="evict_first")  # fmt: skip
            acc_up = tl.dot(w_up, tl.trans(x), acc_up)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()  # the next kernel may start its prefetch
    if SPLIT_K:
        # write this program's partials, count in; the last of the tile's programs sums them
        # (the barrier orders every thread's stores before the atomic)
        splits = tl.num_programs(1)
        parts = 2 if SILU_OUT else 1
        part = (part_ptr + offs_m[None, :] * N + offs_n[:, None]
                + tl.program_id(1).to(tl.int64) * parts * ROWS * N)  # fmt: skip
        tl.store(part, acc, mask=n_mask)
        if SILU_OUT:
            tl.store(part + ROWS * N, acc_up, mask=n_mask)
        tl.debug_barrier()
        counter = counters_ptr + tl.program_id(0)
        if tl.atomic_add(counter, 1, sem="acq_rel") != splits - 1:
            return  # another program of this tile is still running; the last one sums
        first = part_ptr + offs_m[None, :] * N + offs_n[:, None]
        acc = tl.zeros([BLOCK_N, ROWS], tl.float32)
        acc_up = acc
        for s in range(0, splits):  # in split order: the sum does not depend on who is last
            at = first + s * parts * ROWS * N
            acc += tl.load(at, mask=n_mask, other=0.0, cache_modifier=".cg")
            if SILU_OUT:
                acc_up += tl.load(at + ROWS * N, mask=n_mask, other=0.0, cache_modifier=".cg")
        tl.store(counter, 0)  # every program has counted in: ready for the next launch
    if NORM:
        inv_rms = tl.rsqrt(tl.sum(sumsq_parts, 0) / K + eps)
        acc = acc * inv_rms[None, :]
        acc_up = acc_up * inv_rms[None, :]
    y = acc
    if SILU_OUT:  # gate and up rounded as the plain product writes them, then silu_and_mul
        gate = acc.to(out_ptr.dtype.element_ty).to(tl.float32)
        up = acc_up.to(out_ptr.dtype.element_ty).to(tl.float32)
        y = gate * tl.sigmoid(gate) * up
    if RESIDUAL:
        y = y.to(out_ptr.dtype.element_ty).to(tl.float32) + stream
    y = y.to(out_ptr.dtype.element_ty)
    tl.store(out, y, mask=out_mask)
    if SCALED:
        # this program's columns of the updated stream: their sums of squares for the next
        # norm's 1/rms (masked columns and rows are zero), and the stream times the weight
        squares = tl.where(out_mask, y.to(tl.float32) * y.to(tl.float32), 0.0)
        tl.store(sumsq_out_ptr + tl.program_id(0) * ROWS + offs_m, tl.sum(squares, 0))
        scaled = scaled_ptr + offs_m[None, :] * stride_sm + offs_n[:, None]
        tl.store(scaled, (y.to(tl.float32) * g[:, None]).to(out_ptr.dtype.element_ty),
                 mask=out_mask)  # fmt: skip


# compile_ahead: start-up compiles each product shape's variant on the thread pool
_launch = LaunchCache(_rows_kernel, compile_ahead=True)


@functools.lru_cache(maxsize=256)
def choose_tiles(rows: int, k: int, device_index: int, silu_out: bool = False) -> RowsTiles:
    """Static launch configuration for a weight of ``rows`` x ``k``, from the H200 sweeps
    (``nanograph bench gemv --rows 2,5 --sweep``, stops 39 and 40; qwen3-8b and qwen3-0.6b):
    - 64 weight rows a program (with ``silu_out`` 32 gate and 32 up rows); other counts were
      within a few percent.
    - Where the weight tiles leave SMs idle (fewer than half as many tiles as SMs), a tile's K
      range is split over up to SMs / 2 programs (``split_k``): a program walks its range one
      block after another at ~0.36 us a block whatever its tile, so qwen3-0.6b's 5-row o and
      down (16 tiles) took 5.8 / 7.3 us in one program a tile and 4.3 / 4.9 in four.
    - K blocks: 128 wide, 3 stages, where several programs share an SM (qwen3-8b's gate/up
      50.6 us, lm_head 282); 128 wide, 4 stages, where a program's range is at most 1024
      (qwen3-0.6b's gate/up 6.4 us against 8.1 in 256-wide blocks); else 256 wide, 5 stages
      (qwen3-8b's o / down 11.2 / 28.1 us against 12.3 / 32.0 in 128-wide blocks)."""
    sms = torch.cuda.get_device_properties(device_index).multi_processor_count
    weight_tiles = triton.cdiv(rows, 64)
    split = max(1, (sms // 2) // weight_tiles)
    if weight_tiles >= 2 * sms:
        tiles = RowsTiles(block_k=128, num_stages=3)
    elif k <= 1024 * split:
        tiles = RowsTiles(block_k=128, num_stages=4)
    else:
        tiles = RowsTiles(block_k=256, num_stages=5)
    # silu_out: two weight rows an output, so as many weight rows a program as a plain launch;
    # gemm_rows spreads the K blocks over at most split_k programs, none empty
    return dataclasses.replace(tiles, block_n=32 if silu_out else 64, split_k=split)


@dataclasses.dataclass(frozen=True)
class NormedRows:
    """Rows of the residual stream made ready, by the few-row product that last added into it
    (``gemm_rows_normed``), for an RMSNorm of weight g and ``eps`` taken into the next one
    (``gemm_rows(rows.scaled, ..., norm=rows)``): ``scaled`` is the stream times g, ``sumsq``
    the stream's sums of squares in parts (fp32 ``[parts, MAX_ROWS]``, one part per program
    that wrote a slice of the stream's columns)."""

    scaled: torch.Tensor
    sumsq: torch.Tensor
    eps: float


def gemm_rows(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    silu_out: bool = False,
    norm: NormedRows | None = None,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    tiles: RowsTiles | None = None,
) -> torch.Tensor:
    """``x [M, K] @ weight [N, K]^T`` -> ``[M, N]`` in x's dtype, 2 <= M <= ``MAX_ROWS``; with
    ``silu_out`` the product ``p [M, N]`` becomes ``silu(p[:, :N/2]) * p[:, N/2:]``. With
    ``norm`` (x is ``norm.scaled``) each row of the product is scaled by the stream's 1/rms:
    the product of the RMSNorm's output. With ``residual`` the product is added to it in place
    and it is returned (give no ``out``; ``gemm_rows_normed`` also readies the next norm)."""
    return _gemm_rows(x, weight, silu_out, norm, residual, None, out, tiles)[0]


def gemm_rows_normed(
    x: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor,
    next_norm: tuple[torch.Tensor, float],
    tiles: RowsTiles | None = None,
) -> NormedRows:
    """``residual += x @ weight^T`` in place, and the updated stream ready for the RMSNorm of
    weight and eps ``next_norm`` taken into the next product."""
    return _gemm_rows(x, weight, False, None, residual, next_norm, None, tiles)[1]


def _gemm_rows(
    x: torch.Tensor,
    weight: torch.Tensor,
    silu_out: bool,
    norm: NormedRows | None,
    residual: torch.Tensor | None,
    next_norm: tuple[torch.Tensor, float] | None,
    out: torch.Tensor | None,
    tiles: RowsTiles | None,
) -> tuple[torch.Tensor, NormedRows | None]:
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"gemm_rows needs x [M, K] and weight [N, K], got {tuple(x.shape)} and "
                         f"{tuple(weight.shape)}")  # fmt: skip
    m, (n, k) = x.shape[0], weight.shape
    if not 2 <= m <= MAX_ROWS:
        raise ValueError(f"gemm_rows takes 2 to {MAX_ROWS} rows, got {m}: the GEMV takes one, "
                         "a matmul more")  # fmt: skip
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("x and weight must be contiguous in K")
    if x.dtype != weight.dtype:
        raise ValueError(f"x is {x.dtype} but the weight {weight.dtype}")
    rows = n  # weight rows streamed
    if silu_out:
        if n % 2:
            raise ValueError(f"silu_out needs an even number of weight rows (gate, up), got {n}")
        n //= 2
    if residual is not None:
        if out is not None or silu_out:
            raise ValueError("with a residual the product is added into it: no out, no silu_out")
        out = residual
    if norm is not None and (norm.scaled is not x or norm.sumsq.dtype != torch.float32
                             or norm.sumsq.shape[1:] != (MAX_ROWS,)):  # fmt: skip
        raise ValueError("with norm, x is norm.scaled (NormedRows from gemm_rows_normed)")
    if next_norm is not None and (next_norm[0].shape != (n,) or next_norm[0].stride(0) != 1):
        raise ValueError(f"next_norm's weight must be a contiguous [{n}]")
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    elif out.shape != (m, n) or out.dtype != x.dtype or out.stride(1) != 1:
        raise ValueError(f"out must be a [{m}, {n}] of {x.dtype}, contiguous in its last dim")
    if tiles is None:
        tiles = (
            choose_tiles(rows, k, x.device.index or 0, silu_out) if x.is_cuda
            else RowsTiles(16, 16, 1, 1)
        )  # fmt: skip
    blocks = triton.cdiv(k, tiles.block_k)
    per_split = triton.cdiv(blocks, tiles.split_k)  # K blocks a program multiplies
    split = triton.cdiv(blocks, per_split)  # programs a weight tile's K range takes
    grid = (triton.cdiv(n, tiles.block_n), split)
    if split > 1:
        parts = torch.empty(split, 2 if silu_out else 1, MAX_ROWS, n, dtype=torch.float32,
                            device=x.device)  # fmt: skip
        counters = split_counters(x.device, grid[0])
    else:  # unused: any pointer (a one-program tile is its own variant, SPLIT_K False)
        parts = counters = out
    normed = None
    if next_norm is not None:
        normed = NormedRows(
            torch.empty_like(out),
            torch.empty(grid[0], MAX_ROWS, dtype=torch.float32, device=x.device),
            next_norm[1],
        )
    use_pdl = pdl.enabled(x)
    launched = _launch(
        grid,
        (x, weight, out, parts, counters, norm.sumsq if norm is not None else out,
         *((normed.scaled, next_norm[0], normed.sumsq) if normed is not None else (out,) * 3)),
        (m, n, k, per_split * tiles.block_k, x.stride(0), weight.stride(0), out.stride(0),
         normed.scaled.stride(0) if normed is not None else 0,
         norm.sumsq.shape[0] if norm is not None else 1, norm.eps if norm is not None else 0.0),
        dict(
            SILU_OUT=silu_out, NORM=norm is not None, RESIDUAL=residual is not None,
            SCALED=normed is not None,
            NORM_TILES=triton.next_power_of_2(norm.sumsq.shape[0]) if norm is not None else 1,
            SPLIT_K=split > 1, PDL=use_pdl, BLOCK_N=tiles.block_n,
            BLOCK_K=tiles.block_k, L2_STEP=128 // weight.element_size(),
            num_warps=tiles.num_warps, num_stages=tiles.num_stages, launch_pdl=use_pdl,
        ),
    )  # fmt: skip
    if not launched:  # only compiled (start-up's parallel compiles): defined outputs
        if residual is None:  # (a residual keeps its own)
            out.zero_()
        if normed is not None:
            normed.scaled.zero_()
            normed.sumsq.zero_()
    return out, normed
