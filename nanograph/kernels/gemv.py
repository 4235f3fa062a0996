"""One-row matrix products for decode at batch 1: ``out[1, N] = x[1, K] @ weight[N, K]^T``.

Why: a batch-1 decode step is a stream through every weight. cuBLAS picks tiles for these
shapes that reach 2.3-3.0 TB/s on the H200 for qwen3-8b's q/k/v, o and down projections (and
the down projection adds a split-K reduction kernel); this kernel reaches 2.9-3.4 TB/s there
(``nanograph bench gemv``). With two or more rows it lost to cuBLAS by 3-20x in every tile
shape tried, so it takes one row only. A ``tl.dot`` variant on a 16-row tile (rows past M
masked) lost too: at 5 rows (a speculative verify) on qwen3-8b's products 4.95 ms a step
against cuBLAS's 4.39, which streams 5-row products at 2.6-4.1 TB/s
(``benchmarks/results/h200/gemv_rows5_d147c49.json``; reverted).

Invariants:
- Graph-safe: the grid depends on static shapes only.
- Each program owns ``BLOCK_N`` output columns and walks the whole K (no split-K, so no
  second kernel and no atomics); every weight element is read once, x from L2 by every program.
- The products stay elementwise in fp32 across K blocks and are reduced once at the end.
- ``silu_mul``: x is ``[1, 2K]`` (gate, up) and the product takes ``silu(gate) * up`` rounded
  to x's dtype, exactly the input ``fused.silu_and_mul`` would have written, so the MLP's
  activation kernel disappears without changing the numbers.
- ``norm_weight`` (RMSNorm in the prologue): x is the un-normalised residual stream; every
  program first sums x^2 over the whole row (K values from L2: the row is small) for 1/rms, then
  multiplies ``x * inv_rms * norm_weight`` rounded to x's dtype, exactly the row ``rmsnorm``
  would have written, so the norm kernel before the product disappears.
- ``silu_out`` (SiLU-and-mul in the epilogue): the weight is ``[2N, K]``, gate rows then up
  rows (the MLP's packed gate/up); a program computes gate rows n and up rows N + n of its
  BLOCK_N outputs, rounds both to the dtype as the unfused product would write them, and
  writes only ``silu(gate) * up``. ``choose_tiles`` is asked for 2N rows and halves BLOCK_N, so
  a program streams as many weight rows as a plain launch of the same product.
- ``residual`` (residual add in the epilogue): ``residual += product`` in place, the product
  rounded to the dtype before the add and the sum rounded once, as ``add_rmsnorm`` rounds it.
  Each output element is read and written by the one program that owns it, after the wait.
- ``bias``: added to the fp32 product before its one rounding, as ``F.linear`` adds it (so a
  ``residual`` then adds the rounded biased product, as the unfused add does).
- ``normed_out`` (with ``norm_weight``): program 0 also writes the normalised row it multiplies
  (every program computes the same row), so a later kernel can read it: a MoE router takes the
  post-attention norm this way and its experts read the row, with no norm kernel before it.
  Nothing reads it in this launch; the kernels after it wait for this one to finish.
- On sm_90+ it is launched as a programmatic dependent launch (PDL): its programs may start
  while the previous kernel finishes, load their first weight block (the weight never depends
  on that kernel), then wait for it (``gdc_wait``) before reading x. Nothing is written before
  the wait. The kernels before it (norms, attention) let dependents launch early.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from nanograph.kernels import pdl
from nanograph.kernels.launch import LaunchCache


@dataclasses.dataclass(frozen=True)
class GemvTiles:
    block_n: int = 16
    block_k: int = 512
    num_warps: int = 8
    num_stages: int = 4


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    norm_w_ptr,
    residual_ptr,
    bias_ptr,
    normed_ptr,
    N,
    K,
    stride_wn,
    eps,
    SILU_MUL: tl.constexpr,
    NORM: tl.constexpr,
    SILU_OUT: tl.constexpr,
    RESIDUAL: tl.constexpr,
    BIAS: tl.constexpr,
    NORMED_OUT: tl.constexpr,  # with NORM: program 0 writes the normalised row to normed_ptr
    ROUND_OUT: tl.constexpr,  # a float32 out: the product rounded to x's dtype first
    PDL: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    up_rows = w_ptr + (offs_n + N).to(tl.int64)[:, None] * stride_wn  # SILU_OUT: up rows
    # the first K block, peeled: its weights load before waiting for the previous kernel
    w = _weight_block(w_rows, offs_k, n_mask, K)
    w_up = w
    if SILU_OUT:
        w_up = _weight_block(up_rows, offs_k, n_mask, K)
    if PDL:
        tl.extra.cuda.gdc_wait()
    inv_rms = 1.0
    if NORM:
        inv_rms = _inv_rms(x_ptr, offs_k, K, eps, BLOCK_K)
    x = _x_block(x_ptr, offs_k, K, SILU_MUL, NORM, norm_w_ptr, inv_rms)
    if NORMED_OUT:
        _store_normed(normed_ptr, x, offs_k, K)
    acc = w.to(tl.float32) * x[None, :]
    acc_up = w_up.to(tl.float32) * x[None, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):  # pipelined num_stages deep (a launch option)
        w = _weight_block(w_rows, k0 + offs_k, n_mask, K)
        x = _x_block(x_ptr, k0 + offs_k, K, SILU_MUL, NORM, norm_w_ptr, inv_rms)
        if NORMED_OUT:
            _store_normed(normed_ptr, x, k0 + offs_k, K)
        acc += w.to(tl.float32) * x[None, :]
        if SILU_OUT:
            w_up = _weight_block(up_rows, k0 + offs_k, n_mask, K)
            acc_up += w_up.to(tl.float32) * x[None, :]
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()  # after the loop: the last wave is running
    y = tl.sum(acc, 1)
    if BIAS:
        y += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    if SILU_OUT:  # gate and up rounded as the unfused product writes them, then silu_and_mul
        gate = y.to(out_ptr.dtype.element_ty).to(tl.float32)
        up = tl.sum(acc_up, 1).to(out_ptr.dtype.element_ty).to(tl.float32)
        y = gate * tl.sigmoid(gate) * up
    if RESIDUAL:
        y = y.to(out_ptr.dtype.element_ty).to(tl.float32)
        y += tl.load(residual_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    if ROUND_OUT:
        y = y.to(x_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + offs_n, y.to(out_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def _weight_block(w_rows, k, n_mask, K):
    # streamed once per step: evict first, keep L2 for the activations
    return tl.load(w_rows + k[None, :], mask=n_mask[:, None] & (k < K)[None, :], other=0.0,
                   eviction_policy="evict_first")  # fmt: skip


@triton.jit
def _store_normed(normed_ptr, x, k, K):
    """Program 0's block of the normalised row (x: its values, already rounded to the dtype)."""
    if tl.program_id(0) == 0:
        tl.store(normed_ptr + k, x.to(normed_ptr.dtype.element_ty), mask=k < K)


@triton.jit
def _inv_rms(x_ptr, offs_k, K, eps, BLOCK_K: tl.constexpr):
    """1 / rms of the row x[0:K], in fp32."""
    squares = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + k0 + offs_k, mask=k0 + offs_k < K, other=0.0).to(tl.float32)
        squares += x * x
    return tl.rsqrt(tl.sum(squares, 0) / K + eps)


@triton.jit
def _x_block(x_ptr, k, K, SILU_MUL: tl.constexpr, NORM: tl.constexpr, norm_w_ptr, inv_rms):
    """x[k] in fp32; with SILU_MUL, silu(gate[k]) * up[k] rounded to x's dtype first; with
    NORM, x[k] * inv_rms * norm_w[k] rounded to x's dtype first."""
    x = tl.load(x_ptr + k, mask=k < K, other=0.0)
    if SILU_MUL:
        gate = x.to(tl.float32)
        up = tl.load(x_ptr + K + k, mask=k < K, other=0.0).to(tl.float32)
        x = (gate * tl.sigmoid(gate) * up).to(x_ptr.dtype.element_ty)
    if NORM:
        w = tl.load(norm_w_ptr + k, mask=k < K, other=0.0).to(tl.float32)
        x = (x.to(tl.float32) * inv_rms * w).to(x_ptr.dtype.element_ty)
    return x.to(tl.float32)


_launch = LaunchCache(_gemv_kernel)


# Products of this many rows or more (an LM head: the vocabulary) run many waves of programs,
# which stream faster 4 rows a program in 1024-wide K blocks and 4 warps (H200 sweep at d847e3a,
# ``bench gemv --sweep``: qwen3-0.6b's LM head 74.3 -> 69.8 us, qwen3-30b-a3b's 140.0 -> 136.1,
# gpt-oss-20b's 265.5 -> 250.0)
LM_HEAD_ROWS = 65536


@functools.lru_cache(maxsize=256)
def choose_tiles(n: int, k: int, device_index: int) -> GemvTiles:
    """Static launch configuration, from the H200 sweeps (``nanograph bench gemv --sweep``):
    512-wide K blocks and 8 warps; fewer output rows a program while the grid would give an
    SM fewer than two programs (qwen3-8b's o and down: 8 rows). At the fewest rows (4: the
    smallest grids) a long K goes in 1024-wide blocks, so each program keeps as many bytes in
    flight (qwen3-30b-a3b's o projection 6.9 -> 5.9 us, its 128-expert router 3.1 -> 2.3). An
    LM head takes its own tiles (``LM_HEAD_ROWS``), and a product too small for 4-row
    programs to fill the SMs, over a K of 2048 or more, one row a program."""
    if n >= LM_HEAD_ROWS:
        return GemvTiles(block_n=4, block_k=1024, num_warps=4, num_stages=3)
    sms = torch.cuda.get_device_properties(device_index).multi_processor_count
    if triton.cdiv(n, 4) < sms and k >= 2048:
        # Too few rows to fill the GPU at 4 a program, over a long K (a MoE router): one row a
        # program, its whole K in flight at once. H200, stop 44, qwen3-30b-a3b's router (128 x
        # 2048) inside a graph of decode layers: 33.5 against 34.1 us a layer for 4 x 1024 in 8
        # warps. (Small products with a short K, as in the tests' tiny models, were not
        # measured this way and keep the tiles below.)
        return GemvTiles(block_n=1, block_k=min(triton.next_power_of_2(k), 2048), num_warps=4,
                         num_stages=2)  # fmt: skip
    block_n = GemvTiles.block_n
    while block_n > 4 and triton.cdiv(n, block_n) < 2 * sms:
        block_n //= 2
    block_k = 1024 if block_n == 4 and k >= 2048 else GemvTiles.block_k
    return GemvTiles(block_n=block_n, block_k=block_k)


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    silu_mul: bool = False,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    silu_out: bool = False,
    residual: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    normed_out: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    tiles: GemvTiles | None = None,
) -> torch.Tensor:
    """``x [1, K] @ weight [N, K]^T`` -> ``[1, N]`` in x's dtype; with ``silu_mul`` x is
    ``[1, 2K]`` and ``silu(x[:, :K]) * x[:, K:]`` is the row multiplied; with ``norm_weight``
    it is ``rmsnorm(x, norm_weight, eps)``. With ``silu_out`` the product ``p [1, N]`` becomes
    ``silu(p[:, :N/2]) * p[:, N/2:]``, ``[1, N/2]``. With ``residual`` the result is added to
    it in place and ``residual`` is returned (``out`` must then be None). A float32 ``out``
    takes the product rounded to x's dtype (what the product in x's dtype, then ``.float()``,
    gives: the LM head's logits without a cast kernel). ``bias [N]`` is added before the
    product is rounded. ``normed_out`` (a ``[1, K]`` of x's dtype, with ``norm_weight``) is
    given the normalised row the product multiplied."""
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(f"gemv needs x [1, K] and weight [N, K], got {tuple(x.shape)} and "
                         f"{tuple(weight.shape)}")  # fmt: skip
    n, k = weight.shape
    if x.shape[0] != 1:
        raise ValueError(f"gemv takes one row, got {x.shape[0]}: use a matmul")
    if x.shape[1] != (2 * k if silu_mul else k):
        raise ValueError(f"x has {x.shape[1]} columns; the weight [N, K] = {tuple(weight.shape)} "
                         f"needs {'2K' if silu_mul else 'K'}")  # fmt: skip
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("x and weight must be contiguous in K")
    if silu_mul and norm_weight is not None:
        raise ValueError("gemv normalises x or takes silu_and_mul of it, not both")
    rows = n  # weight rows streamed
    if silu_out:
        if n % 2 or residual is not None:
            raise ValueError(f"silu_out needs an even number of weight rows (gate, up), got {n}, "
                             "and no residual")  # fmt: skip
        n //= 2
    if norm_weight is not None and (norm_weight.shape != (k,) or norm_weight.stride(0) != 1):
        raise ValueError(f"norm_weight must be a contiguous [{k}], got {tuple(norm_weight.shape)}")
    if bias is not None and (silu_out or bias.shape != (n,) or bias.stride(0) != 1):
        raise ValueError(f"bias must be a contiguous [{n}] (and no silu_out), got "
                         f"{tuple(bias.shape)}")  # fmt: skip
    if normed_out is not None:
        if norm_weight is None:
            raise ValueError("normed_out is the normalised row: it needs norm_weight")
        if normed_out.shape != (1, k) or normed_out.dtype != x.dtype or normed_out.stride(1) != 1:
            raise ValueError(f"normed_out must be a contiguous [1, {k}] of {x.dtype}, got "
                             f"{tuple(normed_out.shape)} of {normed_out.dtype}")  # fmt: skip
    if residual is not None:
        if residual.shape != (1, n) or residual.dtype != x.dtype or residual.stride(1) != 1:
            raise ValueError(f"residual must be a contiguous [1, {n}] of {x.dtype}, got "
                             f"{tuple(residual.shape)} of {residual.dtype}")  # fmt: skip
        if out is not None:
            raise ValueError("with a residual the product is added into it: give no out")
        out = residual
    if out is None:
        out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    round_out = out.dtype != x.dtype
    if (out.shape != (1, n) or out.stride(1) != 1
            or round_out and (out.dtype != torch.float32 or silu_out)):  # fmt: skip
        raise ValueError(f"out must be a contiguous [1, {n}] of {x.dtype} (or float32, without "
                         f"silu_out), got {tuple(out.shape)} of {out.dtype}")  # fmt: skip
    if tiles is None:
        tiles = choose_tiles(rows, k, x.device.index or 0) if x.is_cuda else GemvTiles(4, 16, 1, 1)
        if silu_out:  # two weight rows an output: as many rows a program as a plain launch
            tiles = dataclasses.replace(tiles, block_n=max(tiles.block_n // 2, 1))
    use_pdl = pdl.enabled(x)
    _launch(
        (triton.cdiv(n, tiles.block_n),),
        (
            x, weight, out, norm_weight if norm_weight is not None else weight,
            residual if residual is not None else out,
            bias if bias is not None else weight,
            normed_out if normed_out is not None else x,
        ),
        (n, k, weight.stride(0), eps),
        dict(
            SILU_MUL=silu_mul, NORM=norm_weight is not None, SILU_OUT=silu_out,
            RESIDUAL=residual is not None, BIAS=bias is not None,
            NORMED_OUT=normed_out is not None, ROUND_OUT=round_out,
            PDL=use_pdl, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
            num_stages=tiles.num_stages, num_warps=tiles.num_warps, launch_pdl=use_pdl,
        ),
    )  # fmt: skip
    return out
