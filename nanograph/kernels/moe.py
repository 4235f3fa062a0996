"""Graph-safe fused mixture-of-experts: expert-sorted token blocks built on the device, and two
grouped GEMMs in Triton (the experts' gate/up product, then the down product with the
activation fused into its operand load).

Layouts (fixed; the MoE layer of ``nanograph.models.moe`` holds its weights this way):
- ``w13 [E, 2I, H]``: each expert's gate and up rows, either concatenated (gate rows 0..I-1, up
  rows I..2I-1: ``silu``) or interleaved (gate 2j, up 2j+1: gpt-oss' ``clamped_swiglu``, which
  also has biases ``b13 [E, 2I]`` and ``b2 [E, H]``); ``w2 [E, H, I]``.
- ``topk_ids [T, K]`` (int64) and ``topk_weights [T, K]``: token t's k-th expert and its weight.
  Flat index ``f = t * K + k`` names one (token, expert) pair.

Invariants:
- No host reads and no data-dependent shapes: every size is derived from static sizes (T, K, E
  and the tile), so one capture replays for any routing. The expert-sorted order holds at most
  ``T*K + min(T*K, E) * (BLOCK_M - 1)`` entries (each non-empty expert's segment is padded up
  to a multiple of BLOCK_M); unused entries hold the sentinel ``T*K`` and blocks past the last
  segment have expert -1, so their programs exit at once.
- A block of BLOCK_M sorted entries belongs to one expert, so a program multiplies its rows by
  that expert's weights only: decode at small batch reads only the selected experts.
- Results land at flat index f (not in sorted order), so the weighted sum over k back to token
  order is a plain reduction; sums are in fp32 with one rounding to the activation dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from nanograph.kernels.launch import LaunchCache

ACTIVATIONS = {"none": 0, "silu": 1, "clamped_swiglu": 2}


@dataclass(frozen=True)
class MoeTiles:
    block_m: int  # sorted (token, expert) rows per program; every expert segment pads to it
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


def choose_tiles(num_pairs: int, num_experts: int, device: torch.device) -> MoeTiles:
    """Rows per block from the mean rows per expert (static: T*K and E); tl.dot needs >= 16."""
    mean_rows = num_pairs / num_experts
    block_m = 16 if mean_rows <= 16 else 32 if mean_rows <= 64 else 64
    if device.type != "cuda":  # the interpreter: small tiles keep CPU tests fast
        return MoeTiles(block_m=16, block_n=32, block_k=32, num_warps=1, num_stages=1)
    return MoeTiles(block_m=block_m, block_n=64, block_k=64)


def sorted_capacity(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Static upper bound on the expert-sorted, block-padded length (a multiple of block_m)."""
    bound = num_pairs + min(num_pairs, num_experts) * (block_m - 1)
    return triton.cdiv(bound, block_m) * block_m


def align_by_expert(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted_ids [P] int32, block_expert [P / block_m] int32) for ``topk_ids [T, K]``.

    ``sorted_ids`` lists flat indices f grouped by expert, each expert's run padded with the
    sentinel T*K to a multiple of ``block_m``; ``block_expert[b]`` is the expert of block b,
    or -1 past the last run. Torch ops only, static shapes, no host reads.
    """
    flat = topk_ids.reshape(-1)
    num_pairs = flat.numel()
    capacity = sorted_capacity(num_pairs, num_experts, block_m)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_ends = padded.cumsum(0)
    padded_starts = padded_ends - padded
    starts = counts.cumsum(0) - counts
    experts, order = torch.sort(flat, stable=True)
    rank = torch.arange(num_pairs, device=flat.device) - starts[experts]
    sorted_ids = torch.full((capacity,), num_pairs, dtype=torch.int32, device=flat.device)
    sorted_ids[padded_starts[experts] + rank] = order.to(torch.int32)
    block_starts = torch.arange(0, capacity, block_m, device=flat.device)
    # the expert whose padded run contains the block's first entry (empty runs are skipped)
    block_expert = torch.searchsorted(padded_ends, block_starts, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1)
    return sorted_ids, block_expert.to(torch.int32)


@triton.jit
def _moe_gemm_kernel(
    a_ptr, w_ptr, bias_ptr, c_ptr, sorted_ids_ptr, block_expert_ptr, topk_weights_ptr,
    num_pairs, N, K, stride_am, stride_we, stride_wn, stride_wk, stride_be, stride_cm,
    gate_stride, up_offset, alpha, limit,
    A_ROW_DIV: tl.constexpr,  # a's row of flat index f: f // A_ROW_DIV (top_k: token rows)
    ACT: tl.constexpr,  # 0: a as is; 1: silu(gate) * up; 2: gpt-oss clamped SwiGLU
    HAS_BIAS: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,  # scale row f by topk_weights[f]
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """c[f, n] = sum_k act(a)[f // A_ROW_DIV, k] * w[e, n, k] (+ bias[e, n]) (* weight[f]) for
    the BLOCK_M sorted rows f of this program's block, all routed to expert e."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    expert = expert.to(tl.int64)
    rows = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_valid = rows < num_pairs
    a_rows = rows // A_ROW_DIV
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_valid = offs_n < N
    w_base = w_ptr + expert * stride_we + offs_n[None, :] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_valid = offs_k < K
        a_mask = row_valid[:, None] & k_valid[None, :]
        if ACT == 0:
            a = tl.load(a_ptr + a_rows[:, None] * stride_am + offs_k[None, :], mask=a_mask, other=0)
        else:
            gate_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * gate_stride
            gate = tl.load(gate_ptrs, mask=a_mask, other=0).to(tl.float32)
            up = tl.load(gate_ptrs + up_offset, mask=a_mask, other=0).to(tl.float32)
            if ACT == 1:
                act = gate * tl.sigmoid(gate) * up
            else:
                gate = tl.minimum(gate, limit)
                up = tl.minimum(tl.maximum(up, -limit), limit)
                act = (up + 1.0) * gate * tl.sigmoid(gate * alpha)
            a = act.to(w_ptr.dtype.element_ty)
        w = tl.load(
            w_base + offs_k[:, None] * stride_wk, mask=k_valid[:, None] & n_valid[None, :], other=0
        )
        acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + expert * stride_be + offs_n, mask=n_valid, other=0)
        acc += bias.to(tl.float32)[None, :]
    if MUL_WEIGHT:
        weight = tl.load(topk_weights_ptr + rows, mask=row_valid, other=0)
        acc *= weight.to(tl.float32)[:, None]
    c_ptrs = c_ptr + rows[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_valid[:, None] & n_valid[None, :])


_launch_gemm = LaunchCache(_moe_gemm_kernel)


def _grouped_gemm(
    a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, c: torch.Tensor,
    sorted_ids: torch.Tensor, block_expert: torch.Tensor, topk_weights: torch.Tensor,
    tiles: MoeTiles, *, a_row_div: int, act: int, gate_stride: int = 1, up_offset: int = 0,
    alpha: float = 0.0, limit: float = 0.0, mul_weight: bool = False,
) -> None:  # fmt: skip
    num_experts, n, k = w.shape
    grid = (block_expert.shape[0], triton.cdiv(n, tiles.block_n))
    _launch_gemm(
        grid,
        (a, w, bias if bias is not None else w, c, sorted_ids, block_expert, topk_weights),
        (
            c.shape[0], n, k, a.stride(0), w.stride(0), w.stride(1), w.stride(2),
            bias.stride(0) if bias is not None else 0, c.stride(0), gate_stride, up_offset,
            float(alpha), float(limit),
        ),
        dict(
            A_ROW_DIV=a_row_div, ACT=act, HAS_BIAS=bias is not None, MUL_WEIGHT=mul_weight,
            BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
            DOT_PRECISION="ieee" if a.dtype == torch.float32 else None,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages,
        ),
    )  # fmt: skip


def fused_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    b13: torch.Tensor | None,
    b2: torch.Tensor | None,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
    alpha: float = 1.702,
    limit: float = 7.0,
    tiles: MoeTiles | None = None,
) -> torch.Tensor:
    """sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t]) for ``x [T, H]``; see the
    module docstring for the weight layouts. Returns [T, H] in x's dtype."""
    num_tokens, hidden = x.shape
    num_experts, two_i, _ = w13.shape
    top_k = topk_ids.shape[1]
    num_pairs = num_tokens * top_k
    if x.stride(-1) != 1 or w13.stride(-1) != 1 or w2.stride(-1) != 1:
        raise ValueError("x and the expert weights must be contiguous in their last dim")
    tiles = tiles or choose_tiles(num_pairs, num_experts, x.device)
    if min(tiles.block_m, tiles.block_n, tiles.block_k) < 16:
        raise ValueError(f"MoE tiles must be >= 16 (tl.dot), got {tiles}")
    sorted_ids, block_expert = align_by_expert(topk_ids, num_experts, tiles.block_m)
    weights = topk_weights.reshape(-1).contiguous()
    gate_up = x.new_empty((num_pairs, two_i))
    _grouped_gemm(x, w13, b13, gate_up, sorted_ids, block_expert, weights, tiles,
                  a_row_div=top_k, act=ACTIVATIONS["none"])  # fmt: skip
    interleaved = activation == "clamped_swiglu"
    down = x.new_empty((num_pairs, hidden))
    _grouped_gemm(
        gate_up, w2, b2, down, sorted_ids, block_expert, weights, tiles, a_row_div=1,
        act=ACTIVATIONS[activation], gate_stride=2 if interleaved else 1,
        up_offset=1 if interleaved else two_i // 2, alpha=alpha, limit=limit, mul_weight=True,
    )  # fmt: skip
    return down.view(num_tokens, top_k, hidden).sum(dim=1, dtype=torch.float32).to(x.dtype)
