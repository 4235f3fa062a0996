"""Skinny matrix products for decode: ``out[M, N] = x[M, K] @ weight[N, K]^T`` with M <= 4.

Why: at decode batch 1 a step is a stream through every weight; cuBLAS picks tiles for these
shapes that reach 3.1-3.3 TB/s on the H200 for the q/k/v, o and down projections of qwen3-8b
(4.1 TB/s for gate/up), and the down projection adds a split-K reduction kernel. A kernel
that gives each program a few full rows of the weight needs no reduction across programs.

Invariants:
- Graph-safe: the grid depends on static shapes only.
- Each program owns ``BLOCK_N`` output columns and walks the whole K (no split-K, so no
  second kernel and no atomics); every weight element is read once. x rows are re-read by each
  program from L2 (M x K elements, small next to the weight).
- fp32 accumulation, one rounding to the output dtype.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from nanograph.kernels.launch import LaunchCache

MAX_ROWS = 4  # larger batches go to cuBLAS: the weight is reused enough for tensor cores


@dataclasses.dataclass(frozen=True)
class GemvTiles:
    block_n: int = 16
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 4


@triton.jit
def _weight_block(w_rows, k0, offs_k, n_mask, K):
    """Weight rows of this program, columns k0 .. k0 + BLOCK_K (streamed once: evict first)."""
    k = k0 + offs_k
    k_mask = k < K
    w = tl.load(w_rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0,
                eviction_policy="evict_first")  # fmt: skip
    return w.to(tl.float32), k, k_mask


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    m_mask = offs_m < M
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    x_rows = x_ptr + offs_m[:, None] * stride_xm
    if BLOCK_M == 1:
        # one row: keep the products elementwise and reduce across threads once at the end
        acc1 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):  # pipelined num_stages deep (a launch option)
            w, k, k_mask = _weight_block(w_rows, k0, offs_k, n_mask, K)
            x = tl.load(x_ptr + k, mask=k_mask, other=0.0)
            acc1 += w * x.to(tl.float32)[None, :]
        tl.store(out_ptr + offs_n, tl.sum(acc1, 1).to(out_ptr.dtype.element_ty), mask=n_mask)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):  # pipelined num_stages deep (a launch option)
            w, k, k_mask = _weight_block(w_rows, k0, offs_k, n_mask, K)
            x = tl.load(x_rows + k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            x = x.to(tl.float32)
            for m in tl.static_range(BLOCK_M):
                # row m of x against every weight row of this block: [BLOCK_N]
                x_m = tl.sum(tl.where(offs_m[:, None] == m, x, 0.0), 0)
                part = tl.sum(w * x_m[None, :], 1)
                acc += tl.where(offs_m[:, None] == m, part[None, :], 0.0)
        out = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


_launch = LaunchCache(_gemv_kernel)


@functools.lru_cache(maxsize=256)
def choose_tiles(rows: int, n: int, k: int, device_index: int) -> GemvTiles:
    """Static launch configuration. GPU values are a first guess until swept on the H200
    (``nanograph bench gemv --sweep``); enough programs to give every SM at least two."""
    sms = torch.cuda.get_device_properties(device_index).multi_processor_count
    block_n = 16
    while block_n > 4 and triton.cdiv(n, block_n) < 2 * sms:
        block_n //= 2
    return GemvTiles(block_n=block_n)


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    tiles: GemvTiles | None = None,
) -> torch.Tensor:
    """``x [M, K] @ weight [N, K]^T`` for M <= ``MAX_ROWS``; returns ``[M, N]`` in x's dtype."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"gemv needs x [M, K] and weight [N, K], got {tuple(x.shape)} and "
                         f"{tuple(weight.shape)}")  # fmt: skip
    m, k = x.shape
    n = weight.shape[0]
    if m > MAX_ROWS:
        raise ValueError(f"gemv takes at most {MAX_ROWS} rows, got {m}: use a matmul")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("x and weight must be contiguous in K")
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if tiles is None:
        tiles = choose_tiles(m, n, k, x.device.index or 0) if x.is_cuda else GemvTiles(4, 16, 1, 1)
    block_m = max(1, triton.next_power_of_2(m))
    grid = (triton.cdiv(n, tiles.block_n),)
    _launch(
        grid,
        (x, weight, out),
        (m, n, k, x.stride(0), weight.stride(0), out.stride(0)),
        dict(
            BLOCK_M=block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
            num_stages=tiles.num_stages, num_warps=tiles.num_warps,
        ),
    )  # fmt: skip
    return out
