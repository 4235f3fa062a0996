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
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from nanograph.kernels.launch import LaunchCache

# Rows a launch takes: the MMA's rows (the kernel's ROWS), padded (rows past M are masked)
MAX_ROWS = 16


@dataclasses.dataclass(frozen=True)
class RowsTiles:
    block_n: int = 64
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 5


@triton.jit(do_not_specialize=["M"])
def _rows_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    SILU_OUT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    ROWS: tl.constexpr = 16  # MAX_ROWS: the MMA's smallest N; rows at or past M are masked
    offs_m = tl.arange(0, ROWS)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = (offs_n < N)[:, None]
    m_mask = (offs_m < M)[:, None]
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
    up_rows = w_ptr + (offs_n + N).to(tl.int64)[:, None] * stride_wn + offs_k[None, :]  # SILU_OUT
    x_rows = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
    acc = tl.zeros([BLOCK_N, ROWS], tl.float32)
    acc_up = acc
    for k0 in range(0, K, BLOCK_K):  # pipelined num_stages deep (a launch option)
        k_mask = (k0 + offs_k < K)[None, :]
        x = tl.load(x_rows + k0, mask=m_mask & k_mask, other=0.0)
        w = tl.load(w_rows + k0, mask=n_mask & k_mask, other=0.0, eviction_policy="evict_first")
        acc = tl.dot(w, tl.trans(x), acc)
        if SILU_OUT:
            w_up = tl.load(up_rows + k0, mask=n_mask & k_mask, other=0.0,
                           eviction_policy="evict_first")  # fmt: skip
            acc_up = tl.dot(w_up, tl.trans(x), acc_up)
    y = acc
    if SILU_OUT:  # gate and up rounded as the plain product writes them, then silu_and_mul
        gate = acc.to(out_ptr.dtype.element_ty).to(tl.float32)
        up = acc_up.to(out_ptr.dtype.element_ty).to(tl.float32)
        y = gate * tl.sigmoid(gate) * up
    out = out_ptr + offs_m[None, :] * stride_om + offs_n[:, None]
    tl.store(out, y.to(out_ptr.dtype.element_ty), mask=n_mask & (offs_m < M)[None, :])


# compile_ahead: start-up compiles each product shape's variant on the thread pool
_launch = LaunchCache(_rows_kernel, compile_ahead=True)


@functools.lru_cache(maxsize=256)
def choose_tiles(rows: int, device_index: int, silu_out: bool = False) -> RowsTiles:
    """Static launch configuration for a weight of ``rows`` rows, from the H200 sweep
    (``nanograph bench gemv --rows 5,8 --sweep``, stop 39): 64 weight rows a program (with
    ``silu_out`` 32 gate and 32 up rows). While the grid leaves most SMs one program, 256-wide
    K blocks five stages deep (qwen3-8b's 5-row o / down 11.1 / 28.0 us against 12.3 / 32.0 in
    128-wide blocks); where several programs share an SM, 128-wide blocks three deep (gate/up
    50.4, lm_head 280.8 us; five stages 52.4 / 283.7)."""
    sms = torch.cuda.get_device_properties(device_index).multi_processor_count
    tiles = RowsTiles()
    if triton.cdiv(rows, tiles.block_n) >= 2 * sms:
        tiles = dataclasses.replace(tiles, block_k=128, num_stages=3)
    if silu_out:  # two weight rows an output: as many rows a program as a plain launch
        tiles = dataclasses.replace(tiles, block_n=tiles.block_n // 2)
    return tiles


def gemm_rows(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    silu_out: bool = False,
    out: torch.Tensor | None = None,
    tiles: RowsTiles | None = None,
) -> torch.Tensor:
    """``x [M, K] @ weight [N, K]^T`` -> ``[M, N]`` in x's dtype, 2 <= M <= ``MAX_ROWS``; with
    ``silu_out`` the product ``p [M, N]`` becomes ``silu(p[:, :N/2]) * p[:, N/2:]``."""
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
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    elif out.shape != (m, n) or out.dtype != x.dtype or out.stride(1) != 1:
        raise ValueError(f"out must be a [{m}, {n}] of {x.dtype}, contiguous in its last dim")
    if tiles is None:
        tiles = (
            choose_tiles(rows, x.device.index or 0, silu_out) if x.is_cuda
            else RowsTiles(16, 16, 1, 1)
        )  # fmt: skip
    launched = _launch(
        (triton.cdiv(n, tiles.block_n),),
        (x, weight, out),
        (m, n, k, x.stride(0), weight.stride(0), out.stride(0)),
        dict(
            SILU_OUT=silu_out, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages,
        ),
    )  # fmt: skip
    if not launched:  # only compiled (start-up's parallel compiles): a defined output
        out.zero_()
    return out
