"""Graph-safe fused mixture-of-experts in Triton: routing (``route``: top-k and its weights,
one program per token), then the experts in two static regimes chosen by token count.

- Few tokens (decode, ``num_tokens <= PAIRWISE_MAX_TOKENS``): one weight-streaming GEMV per
  (token, expert) pair for gate/up, then one program per (token, output block) that walks the
  token's k experts through the down projection (activation fused into its operand load) and
  sums them weighted: two kernels, no sorting, no metadata. A token reads only its experts.
- More tokens: the (token, expert) pairs are sorted by expert into blocks of BLOCK_M rows with
  device-side torch ops, then two grouped GEMMs (``tl.dot``) run per block with the block's
  expert weights: gate/up, an elementwise pass for the activation, then down with the routing
  weight applied; a reduction over k returns to token order. (The activation fused into the
  down GEMM's operand load was recomputed by each of its N / BLOCK_N programs a row block, 45x
  on gpt-oss-20b: stop 49 measured the pass apart 3.1x faster a layer, ``choose_tiles``.)

Layouts (fixed; the MoE layer of ``nanograph.models.moe`` holds its weights this way):
- ``w13 [E, 2I, H]``: each expert's gate and up rows, either concatenated (gate rows 0..I-1, up
  rows I..2I-1: ``silu``) or interleaved (gate 2j, up 2j+1: gpt-oss' ``clamped_swiglu``, which
  also has biases ``b13 [E, 2I]`` and ``b2 [E, H]``); ``w2 [E, H, I]``.
- MXFP4 experts (gpt-oss' released weights, kept 4-bit): each of ``w13`` / ``w2`` is its packed
  codes ``[E, N, K / 2]`` uint8 (two E2M1 values a byte, the low nibble first) with scales
  ``[E, N, K / 32]`` uint8 (E8M0: one power of two per 32 values along K), the layout of the
  checkpoint's ``_blocks`` / ``_scales`` pairs. The kernels decode a tile after loading it, so
  a weight crosses HBM at ~4.25 bits a value; decoded values equal ``loader.mxfp4``'s
  dequantization exactly (an E2M1 value times a power of two is exact in fp32 and bf16) for
  scales up to 240 (``_mx_halves``).
- ``topk_ids [T, K]`` (int64) and ``topk_weights [T, K]``: token t's k-th expert and its weight.
  Flat index ``f = t * K + k`` names one (token, expert) pair.

Invariants:
- No host reads and no data-dependent shapes: every size and the regime derive from static
  sizes (T, K, E and the tiles), so one capture replays for any routing. The expert-sorted
  order holds at most ``T*K + min(T*K, E) * (BLOCK_M - 1)`` entries (each non-empty expert's
  run padded up to a multiple of BLOCK_M); unused entries hold the sentinel ``T*K`` and blocks
  past the last run have expert -1, so their programs exit at once.
- A token's result does not depend on the other tokens of the batch (padding rows, batch
  composition), within a regime; the regime boundary is a decode bucket (8), so a padded decode
  batch and the same batch run eagerly take the same regime.
- The activation is computed in fp32 and rounded to the activations' dtype (the model's) before
  its product (as the unfused gate/up -> activation -> down would store it); products
  accumulate in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from nanograph.kernels.launch import LaunchCache

ACTIVATIONS = {"silu": 1, "clamped_swiglu": 2}  # the kernels' ACT
MX_BLOCK = 32  # MXFP4 values sharing a scale


@triton.jit
def _as_value(bits):
    """A float16 bit pattern (int32) as float32."""
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _mx_halves(codes, scales, ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    """codes [ROWS, BLOCK_K / 2] uint8 and scales [ROWS, BLOCK_K / 32] uint8 (E8M0: 2^(s - 127))
    -> (low nibbles' values, high nibbles' values), each [ROWS, BLOCK_K / 2] fp32: the values
    at even and at odd K.

    An E2M1 code's sign and three magnitude bits, put into a float16's sign bit and its bits
    11-9 (the exponent's low two and the mantissa's top one), read as the value times 2^-14
    (0.5 as float16's subnormal 2^-15): a few integer operations and a conversion decode it
    exactly. The 2^14 goes into the scale, 2^(s - 113), built from its float32 exponent field
    (one a group of 32 values; past s = 240, values beyond 2^113 that no checkpoint holds, it
    stays 240's)."""
    b = codes.to(tl.int32)
    lo = _as_value(((b << 12) & 0x8000) | ((b & 7) << 9))
    hi = _as_value(((b << 8) & 0x8000) | ((b & 0x70) << 5))
    scale = (tl.minimum(scales.to(tl.int32) + 14, 254) << 23).to(tl.float32, bitcast=True)
    groups: tl.constexpr = BLOCK_K // 32
    lo = (lo.reshape(ROWS, groups, 16) * scale[:, :, None]).reshape(ROWS, BLOCK_K // 2)
    hi = (hi.reshape(ROWS, groups, 16) * scale[:, :, None]).reshape(ROWS, BLOCK_K // 2)
    return lo, hi


@triton.jit
def _mx_decode(codes, scales, ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    """``_mx_halves`` interleaved back: the [ROWS, BLOCK_K] fp32 values in K order (value 2j
    from byte j's low nibble), as a tensor-core operand needs them."""
    lo, hi = _mx_halves(codes, scales, ROWS, BLOCK_K)
    return tl.join(lo, hi).reshape(ROWS, BLOCK_K)


@triton.jit
def _load_mx(w_rows, ws_rows, k0, K, row_mask, BLOCK_K: tl.constexpr, STREAM: tl.constexpr):
    """The codes [rows, BLOCK_K / 2] and scales [rows, BLOCK_K / 32] of columns k0 ..
    k0 + BLOCK_K of MXFP4 weight rows (``w_rows``: each row's codes, ``ws_rows``: its scales).
    STREAM: read once (evict first)."""
    kb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    ks = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    code_mask = row_mask[:, None] & (kb < K // 2)[None, :]
    if STREAM:
        codes = tl.load(w_rows[:, None] + kb[None, :], mask=code_mask, other=0,
                        eviction_policy="evict_first")  # fmt: skip
    else:
        codes = tl.load(w_rows[:, None] + kb[None, :], mask=code_mask, other=0)
    scale_mask = row_mask[:, None] & (ks < K // 32)[None, :]
    scales = tl.load(ws_rows[:, None] + ks[None, :], mask=scale_mask, other=127)
    return codes, scales


@dataclass(frozen=True)
class MoeTiles:
    block_m: int  # sorted (token, expert) rows per program; every expert segment pads to it
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    pairwise: bool = False  # the few-token regime: GEMVs per (token, expert) pair
    # the pairwise down projection's (BLOCK_N, BLOCK_K, num_warps, num_stages); None: the above
    down: tuple[int, int, int, int] | None = None


# Up to this many tokens the pairwise GEMVs run (a decode bucket: see the module docstring).
PAIRWISE_MAX_TOKENS = 8


def choose_tiles(
    num_tokens: int, top_k: int, num_experts: int, hidden: int, inter: int, device: torch.device,
    dtype: torch.dtype = torch.bfloat16, mxfp4: bool = False,
) -> MoeTiles:  # fmt: skip
    """Static launch configuration from static sizes (``inter``: an expert's width). Pairwise:
    gate/up in 16-row programs over 256-wide K blocks in 4 warps, 3 stages (swept inside a CUDA
    graph of qwen3-30b-a3b-shaped decode layers on the H200, stop 44: 34.1 against 35.0 us a
    layer for the batch-1 GEMV's 16 x 512 in 8 warps, 4 stages; the engine's decode graph
    2.390 against 2.415 ms at batch 1, 8.04 against 8.28 at batch 8, gpt-oss-20b 2.435
    against 2.474), and ``_down_tiles`` for the down projection. Sorted: rows per block from
    the mean rows per expert (tl.dot needs >= 16), and from 128 rows an expert the tiles that
    won stop 49's sweep on the H100 (``docs/wip/moe_prefill_sweep.py``, one layer's experts at
    2048 / 8192 tokens, ms): bf16 128 x 256 x 64 in 8 warps (gpt-oss-20b 1.33 / 3.97 against
    64 x 64's 1.90 / 8.26, qwen3-30b-a3b 0.83 / 2.00 against 0.99 / 3.27), MXFP4 128 x 128
    (2.02 / 6.39 against 2.52 / 9.91, and 128 x 256's 2.65 / 8.23); between 64 and 128
    rows 64 x 128 in 4 warps, 4 stages (qwen3-30b-a3b at 2048 tokens: 0.91 against 64 x 64's
    0.99). float32 (exact products, not a speed path) keeps 64 x 64 tiles: the large ones
    overflow shared memory. ``device`` may be CUDA without a GPU (``tests/sm90_compile.py``
    compiling ahead)."""
    pairwise = num_tokens <= PAIRWISE_MAX_TOKENS
    if device.type != "cuda":  # the interpreter: small tiles keep CPU tests fast
        return MoeTiles(16, 16 if pairwise else 32, 32, 1, 1, pairwise)
    if pairwise:
        return MoeTiles(block_m=1, block_n=16, block_k=256, num_warps=4, num_stages=3,
                        pairwise=True, down=_down_tiles(hidden, inter, top_k, device))  # fmt: skip
    mean_rows = num_tokens * top_k / num_experts
    if mean_rows <= 64 or dtype == torch.float32:
        block_m = 16 if mean_rows <= 16 else 32 if mean_rows <= 64 else 64
        return MoeTiles(block_m=block_m, block_n=64, block_k=64)
    if mean_rows < 128:
        return MoeTiles(block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=4)
    return MoeTiles(block_m=128, block_n=128 if mxfp4 else 256, block_k=64, num_warps=8)


def tile_token_counts(
    w13: torch.Tensor, w13_scales: torch.Tensor | None, top_k: int, dtype: torch.dtype,
    max_tokens: int,
) -> list[int]:  # fmt: skip
    """The fewest tokens that reach each launch configuration ``fused_experts`` picks for 1 to
    ``max_tokens`` tokens of ``dtype`` activations through these experts (``choose_tiles``):
    start-up runs a forward of each, so that no batch size compiles a variant inside a graph
    capture or on a request's path. The configuration changes at thresholds of the token
    count (each holds an interval), so a binary search finds each interval's end."""
    num_experts, two_i, hidden = _dense_shape(w13, w13_scales)

    def tiles(tokens: int) -> MoeTiles:
        return choose_tiles(tokens, top_k, num_experts, hidden, two_i // 2, w13.device, dtype,
                            mxfp4=w13_scales is not None)  # fmt: skip

    counts: list[int] = []
    first = 1
    while first <= max_tokens:
        counts.append(first)
        same, differs = first, max_tokens + 1  # tiles(same) == tiles(first); differs: not known
        while differs - same > 1:
            middle = (same + differs) // 2
            if tiles(middle) == tiles(first):
                same = middle
            else:
                differs = middle
        first = differs
    return counts


@triton.jit
def _route_kernel(
    logits_ptr, weights_ptr, ids_ptr, num_experts, stride_l,
    TOP_K: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr,
    SOFTMAX_FIRST: tl.constexpr, RENORMALIZE: tl.constexpr,
):  # fmt: skip
    """Token t = program 0: top-k of its router logits by repeated argmax (the lowest index
    wins a tie), weights as ``models.moe.route`` defines them, in fp32, stored rounded."""
    token = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, E_PAD)
    valid = offs < num_experts
    logits = tl.load(logits_ptr + token * stride_l + offs, mask=valid, other=float("-inf"))
    scores = logits.to(tl.float32)
    if SOFTMAX_FIRST:
        probs = tl.exp(scores - tl.max(scores, 0))
        scores = tl.where(valid, probs / tl.sum(probs, 0), float("-inf"))
    k_offs = tl.arange(0, K_PAD)
    top = tl.zeros((K_PAD,), dtype=tl.float32)
    ids = tl.zeros((K_PAD,), dtype=tl.int64)
    for j in tl.static_range(TOP_K):
        best = tl.max(scores, 0)
        index = tl.argmax(scores, 0)
        top = tl.where(k_offs == j, best, top)
        ids = tl.where(k_offs == j, index.to(tl.int64), ids)
        scores = tl.where(offs == index, float("-inf"), scores)
    chosen = k_offs < TOP_K
    if SOFTMAX_FIRST:
        if RENORMALIZE:
            top = top / tl.sum(tl.where(chosen, top, 0.0), 0)
    else:
        top = tl.exp(top - tl.max(tl.where(chosen, top, float("-inf")), 0))
        top = top / tl.sum(tl.where(chosen, top, 0.0), 0)
    tl.store(weights_ptr + token * TOP_K + k_offs, top.to(weights_ptr.dtype.element_ty),
             mask=chosen)  # fmt: skip
    tl.store(ids_ptr + token * TOP_K + k_offs, ids, mask=chosen)


_launch_route = LaunchCache(_route_kernel)


def route(
    logits: torch.Tensor, top_k: int, softmax_first: bool, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``models.moe.route`` in one kernel: (weights [T, K] in the logits' dtype, ids [T, K]
    int64). One program per token; the logits row fits one block (E <= a few thousand)."""
    num_tokens, num_experts = logits.shape
    weights = logits.new_empty((num_tokens, top_k))
    ids = torch.empty((num_tokens, top_k), dtype=torch.int64, device=logits.device)
    if num_tokens == 0:
        return weights, ids
    _launch_route(
        (num_tokens,),
        (logits, weights, ids),
        (num_experts, logits.stride(0)),
        dict(
            TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k),
            E_PAD=triton.next_power_of_2(num_experts), SOFTMAX_FIRST=softmax_first,
            RENORMALIZE=renormalize, num_warps=1 if num_experts <= 256 else 4, num_stages=1,
        ),
    )  # fmt: skip
    return weights, ids


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
    rank = torch.arange(num_pairs, device=flat.device) - starts.index_select(0, experts)
    destination = padded_starts.index_select(0, experts) + rank  # distinct entries
    sorted_ids = torch.full((capacity,), num_pairs, dtype=torch.int32, device=flat.device)
    sorted_ids.scatter_(0, destination, order.to(torch.int32))
    block_starts = torch.arange(0, capacity, block_m, device=flat.device)
    # the expert whose padded run contains the block's first entry (empty runs are skipped)
    block_expert = torch.searchsorted(padded_ends, block_starts, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1)
    return sorted_ids, block_expert.to(torch.int32)


# The pair count changes with the batch: not specialized, so a new batch size compiles nothing.
@triton.jit(do_not_specialize=["num_pairs"])
def _moe_gemm_kernel(
    a_ptr, w_ptr, ws_ptr, bias_ptr, c_ptr, sorted_ids_ptr, block_expert_ptr, topk_weights_ptr,
    num_pairs, N, K, stride_am, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_be,
    stride_cm,
    A_ROW_DIV: tl.constexpr,  # a's row of flat index f: f // A_ROW_DIV (top_k: token rows)
    HAS_BIAS: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,  # scale row f by topk_weights[f]
    MXFP4: tl.constexpr,  # w: packed codes, ws: their scales (module docstring)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """c[f, n] = sum_k a[f // A_ROW_DIV, k] * w[e, n, k] (+ bias[e, n]) (* weight[f]) for
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
    if MXFP4:
        w_rows = w_ptr + expert * stride_we + offs_n.to(tl.int64) * stride_wn
        ws_rows = ws_ptr + expert * stride_se + offs_n.to(tl.int64) * stride_sn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_valid = offs_k < K
        a_mask = row_valid[:, None] & k_valid[None, :]
        a = tl.load(a_ptr + a_rows[:, None] * stride_am + offs_k[None, :], mask=a_mask, other=0)
        if MXFP4:  # decoded as [N, K] rows, then turned into the [K, N] operand
            codes, scales = _load_mx(w_rows, ws_rows, k0, K, n_valid, BLOCK_K, False)
            w = tl.trans(_mx_decode(codes, scales, BLOCK_N, BLOCK_K)).to(a_ptr.dtype.element_ty)
        else:
            w = tl.load(w_base + offs_k[:, None] * stride_wk,
                        mask=k_valid[:, None] & n_valid[None, :], other=0)  # fmt: skip
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
    a: torch.Tensor, w: torch.Tensor, ws: torch.Tensor | None, bias: torch.Tensor | None,
    c: torch.Tensor, sorted_ids: torch.Tensor, block_expert: torch.Tensor,
    topk_weights: torch.Tensor, tiles: MoeTiles, *, a_row_div: int, mul_weight: bool = False,
) -> None:  # fmt: skip
    num_experts, n, k = _dense_shape(w, ws)
    grid = (block_expert.shape[0], triton.cdiv(n, tiles.block_n))
    _launch_gemm(
        grid,
        (a, w, w if ws is None else ws, bias if bias is not None else w, c, sorted_ids,
         block_expert, topk_weights),
        (
            c.shape[0], n, k, a.stride(0), w.stride(0), w.stride(1), w.stride(2),
            0 if ws is None else ws.stride(0), 0 if ws is None else ws.stride(1),
            bias.stride(0) if bias is not None else 0, c.stride(0),
        ),
        dict(
            A_ROW_DIV=a_row_div, HAS_BIAS=bias is not None, MUL_WEIGHT=mul_weight,
            MXFP4=ws is not None, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
            BLOCK_K=tiles.block_k,
            # fp32: exact products, as kernels.attention (tf32x3 tiles overflowed shared memory
            # there on the H200); 16-bit: the default
            DOT_PRECISION="ieee" if a.dtype == torch.float32 else None,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages,
        ),
    )  # fmt: skip


@triton.jit
def _activation(a_ptr, k, mask, gate_stride, up_offset, alpha, limit, ACT: tl.constexpr):
    """act(gate, up)[k] in fp32 from a gate/up row at ``a_ptr`` (layout: module docstring)."""
    gate = tl.load(a_ptr + k * gate_stride, mask=mask, other=0).to(tl.float32)
    up = tl.load(a_ptr + k * gate_stride + up_offset, mask=mask, other=0).to(tl.float32)
    if ACT == 1:
        return gate * tl.sigmoid(gate) * up
    gate = tl.minimum(gate, limit)
    up = tl.minimum(tl.maximum(up, -limit), limit)
    return (up + 1.0) * gate * tl.sigmoid(gate * alpha)


@triton.jit
def _activation_kernel(
    a_ptr, c_ptr, N, stride_am, stride_cm, gate_stride, up_offset, alpha, limit,
    ACT: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """c[f, :N] = act(gate_up[f]) rounded to c's dtype, for row f = program 0."""
    row = tl.program_id(0).to(tl.int64)
    k = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = k < N
    act = _activation(a_ptr + row * stride_am, k, mask, gate_stride, up_offset, alpha, limit, ACT)
    tl.store(c_ptr + row * stride_cm + k, act.to(c_ptr.dtype.element_ty), mask=mask)


_launch_act = LaunchCache(_activation_kernel)
ACT_BLOCK = 1024


@triton.jit
def _pair_gate_up_kernel(
    x_ptr, w_ptr, ws_ptr, bias_ptr, c_ptr, ids_ptr,
    N, K, stride_xm, stride_we, stride_wn, stride_se, stride_sn, stride_be, stride_cm,
    TOP_K: tl.constexpr, HAS_BIAS: tl.constexpr, MXFP4: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    """c[f, n] = x[f // TOP_K] . w13[ids[f], n] (+ b13[ids[f], n]) for pair f = program 0."""
    pair = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    x_row = x_ptr + (pair // TOP_K).to(tl.int64) * stride_xm
    if MXFP4:  # even and odd K apart: a byte's two values meet x[2j] and x[2j + 1]
        mx_rows = w_ptr + expert * stride_we + offs_n.to(tl.int64) * stride_wn
        mx_scales = ws_ptr + expert * stride_se + offs_n.to(tl.int64) * stride_sn
        acc = tl.zeros((BLOCK_N, BLOCK_K // 2), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            codes, scales = _load_mx(mx_rows, mx_scales, k0, K, n_mask, BLOCK_K, True)
            lo, hi = _mx_halves(codes, scales, BLOCK_N, BLOCK_K)
            k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_row + k, mask=k < K, other=0).to(tl.float32)
            x_even, x_odd = tl.split(tl.reshape(x, (BLOCK_K // 2, 2)))
            acc += lo * x_even[None, :]
            acc += hi * x_odd[None, :]
        out = tl.sum(acc, 1)
    else:
        w_rows = w_ptr + expert * stride_we + offs_n.to(tl.int64)[:, None] * stride_wn
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + offs_k
            w = tl.load(w_rows + k[None, :], mask=n_mask[:, None] & (k < K)[None, :], other=0,
                        eviction_policy="evict_first")  # fmt: skip
            x = tl.load(x_row + k, mask=k < K, other=0).to(tl.float32)
            acc += w.to(tl.float32) * x[None, :]
        out = tl.sum(acc, 1)
    if HAS_BIAS:
        out += tl.load(bias_ptr + expert * stride_be + offs_n, mask=n_mask, other=0).to(tl.float32)
    tl.store(c_ptr + pair.to(tl.int64) * stride_cm + offs_n, out.to(c_ptr.dtype.element_ty),
             mask=n_mask)  # fmt: skip


@triton.jit
def _pair_down_kernel(
    a_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr, ids_ptr, topk_weights_ptr,
    N, K, stride_am, stride_we, stride_wn, stride_se, stride_sn, stride_be, stride_om,
    gate_stride, up_offset, alpha, limit,
    TOP_K: tl.constexpr, K_PAD: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr,
    MXFP4: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ACCUMULATE: tl.constexpr,
):  # fmt: skip
    """out[t, n] = sum_j weight[t, j] * (act(gate_up[t*K + j]) . w2[ids[t, j], n] (+ b2)) for
    token t = program 0: the k experts summed in fp32 in one program. ACCUMULATE:
    ``out[t, n] +=`` instead (the fused decode's residual stream; each program owns its
    elements, so the read-modify-write needs no atomics).

    All k experts load together, as one [K_PAD, BLOCK_N, BLOCK_K] tile a K block (experts
    past TOP_K masked): the expert ids are read once, before the loop, so no weight address
    depends on a load inside it, and every iteration has k experts' rows in flight. (A loop
    per expert, then one (expert, K block) loop, streamed qwen3-30b-a3b's down projections at
    ~1.0 and ~1.2 TB/s.) The routing weight scales the activation operand. MXFP4: the experts
    one after another inside the K loop (unrolled, so still all in flight), each a [BLOCK_N,
    BLOCK_K / 2] tile of bytes into one accumulator: a [K_PAD, BLOCK_N, BLOCK_K] tile decoded
    spilled in gpt-oss' tiles and reshaped through shared memory (sm_90, Triton 3.6: 13
    instructions a weight against 16)."""
    token = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    offs_j = tl.arange(0, K_PAD)
    n_mask, j_mask = offs_n < N, offs_j < TOP_K
    pairs = token * TOP_K + offs_j
    experts = tl.load(ids_ptr + pairs, mask=j_mask, other=0).to(tl.int64)
    scales = tl.load(topk_weights_ptr + pairs, mask=j_mask, other=0).to(tl.float32)
    if MXFP4:  # expert by expert (unrolled: all k in flight), even and odd K apart
        acc = tl.zeros((BLOCK_N, BLOCK_K // 2), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + offs_k
            for j in tl.static_range(TOP_K):
                # expert j's id and weight from the ones read before the loop (loop-invariant:
                # hoisted, so no weight address waits on a load inside the loop)
                expert = tl.sum(tl.where(offs_j == j, experts, 0))
                weight = tl.sum(tl.where(offs_j == j, scales, 0.0))
                pair = token * TOP_K + j
                act = _activation(a_ptr + pair.to(tl.int64) * stride_am, k, k < K, gate_stride,
                                  up_offset, alpha, limit, ACT)  # fmt: skip
                act = act.to(a_ptr.dtype.element_ty).to(tl.float32) * weight
                act_even, act_odd = tl.split(tl.reshape(act, (BLOCK_K // 2, 2)))
                rows = offs_n.to(tl.int64)
                codes, w_scales = _load_mx(w_ptr + expert * stride_we + rows * stride_wn,
                                           ws_ptr + expert * stride_se + rows * stride_sn, k0, K,
                                           n_mask, BLOCK_K, True)  # fmt: skip
                lo, hi = _mx_halves(codes, w_scales, BLOCK_N, BLOCK_K)
                acc += lo * act_even[None, :]
                acc += hi * act_odd[None, :]
        total = tl.sum(acc, 1)
    else:
        a_rows = a_ptr + pairs.to(tl.int64) * stride_am  # [K_PAD]
        w_rows = (w_ptr + experts[:, None, None] * stride_we
                  + offs_n.to(tl.int64)[None, :, None] * stride_wn)  # fmt: skip
        w_mask = j_mask[:, None, None] & n_mask[None, :, None]
        acc = tl.zeros((K_PAD, BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):  # pipelined num_stages deep (a launch option)
            k = k0 + offs_k
            k_mask = k < K
            act = _activation(a_rows[:, None], k[None, :], j_mask[:, None] & k_mask[None, :],
                              gate_stride, up_offset, alpha, limit, ACT)  # fmt: skip
            act = act.to(a_ptr.dtype.element_ty).to(tl.float32) * scales[:, None]
            w = tl.load(w_rows + k[None, None, :], mask=w_mask & k_mask[None, None, :], other=0,
                        eviction_policy="evict_first")  # fmt: skip
            acc += w.to(tl.float32) * act[:, None, :]
        total = tl.sum(tl.sum(acc, 2), 0)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + experts[:, None] * stride_be + offs_n[None, :],
                       mask=j_mask[:, None] & n_mask[None, :], other=0)  # fmt: skip
        total += tl.sum(bias.to(tl.float32) * scales[:, None], 0)
    out_row = out_ptr + token.to(tl.int64) * stride_om + offs_n
    if ACCUMULATE:  # rounded first, as the unfused path stores the sum before adding it
        total = total.to(out_ptr.dtype.element_ty).to(tl.float32)
        total += tl.load(out_row, mask=n_mask, other=0).to(tl.float32)
    tl.store(out_row, total.to(out_ptr.dtype.element_ty), mask=n_mask)


_launch_pair_gate_up = LaunchCache(_pair_gate_up_kernel)
_launch_pair_down = LaunchCache(_pair_down_kernel)


def _pairwise(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, w13_scales: torch.Tensor | None,
    w2_scales: torch.Tensor | None, b13: torch.Tensor | None, b2: torch.Tensor | None,
    weights: torch.Tensor, ids: torch.Tensor, tiles: MoeTiles, act: int, gate_stride: int,
    up_offset: int, alpha: float, limit: float, out: torch.Tensor, accumulate: bool,
) -> None:  # fmt: skip
    num_tokens, top_k = ids.shape
    _, two_i, hidden = _dense_shape(w13, w13_scales)
    gate_up = x.new_empty((num_tokens * top_k, two_i))
    ws13 = w13 if w13_scales is None else w13_scales
    _launch_pair_gate_up(
        (num_tokens * top_k, triton.cdiv(two_i, tiles.block_n)),
        (x, w13, ws13, b13 if b13 is not None else w13, gate_up, ids),
        (two_i, hidden, x.stride(0), w13.stride(0), w13.stride(1), ws13.stride(0),
         ws13.stride(1), b13.stride(0) if b13 is not None else 0, gate_up.stride(0)),
        dict(TOP_K=top_k, HAS_BIAS=b13 is not None, MXFP4=w13_scales is not None,
             BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, num_warps=tiles.num_warps,
             num_stages=tiles.num_stages),
    )  # fmt: skip
    down = tiles.down or (tiles.block_n, tiles.block_k, tiles.num_warps, tiles.num_stages)
    down_n, down_k, down_warps, down_stages = down
    ws2 = w2 if w2_scales is None else w2_scales
    _launch_pair_down(
        (num_tokens, triton.cdiv(hidden, down_n)),
        (gate_up, w2, ws2, b2 if b2 is not None else w2, out, ids, weights),
        (hidden, two_i // 2, gate_up.stride(0), w2.stride(0), w2.stride(1), ws2.stride(0),
         ws2.stride(1), b2.stride(0) if b2 is not None else 0, out.stride(0), gate_stride,
         up_offset, float(alpha), float(limit)),
        dict(TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k), ACT=act,
             HAS_BIAS=b2 is not None, MXFP4=w2_scales is not None, BLOCK_N=down_n,
             BLOCK_K=down_k, ACCUMULATE=accumulate, num_warps=down_warps,
             num_stages=down_stages),
    )  # fmt: skip


def _dense_shape(w: torch.Tensor, scales: torch.Tensor | None) -> tuple[int, int, int]:
    """[E, N, K] of an expert weight, dense or MXFP4 (packed codes [E, N, K / 2])."""
    e, n, k = w.shape
    return (e, n, k) if scales is None else (e, n, 2 * k)


def _down_tiles(hidden: int, inter: int, top_k: int, device: torch.device) -> tuple[int, ...]:
    """The pairwise down projection's (BLOCK_N, BLOCK_K, num_warps, num_stages) on a GPU. Its N
    is the hidden size (2048 on qwen3-30b-a3b), so output rows a program halve from 16 while a
    token's grid would leave an SM without a program; a program's tile is top_k x BLOCK_N x
    BLOCK_K, so K blocks of 256 (768 wide experts: two blocks of 512 would half-fill the
    second) shrink until the tile holds at most 16K elements; 8 warps while the K loop is short,
    4 when it is long. H200 sweeps (``bench gemv --sweep``, a token's experts): qwen3-30b-a3b
    (3 K blocks) 23.9 us at 8 x 8 x 256 with 8 warps (29.9 at 8 x 4 x 256, 24.7 with 4 warps);
    gpt-oss-20b (12 K blocks) 62.5 us at 4 x 16 x 256 with 4 warps (70.8 with 8)."""
    cuda = device.type == "cuda" and torch.cuda.is_available()
    sms = torch.cuda.get_device_properties(device).multi_processor_count if cuda else 132
    block_n = 16
    while block_n > 4 and triton.cdiv(hidden, block_n) < sms:
        block_n //= 2
    block_k = 256 if inter <= 1024 else 512
    while block_k > 32 and triton.next_power_of_2(top_k) * block_n * block_k > 16384:
        block_k //= 2
    return block_n, block_k, 8 if triton.cdiv(inter, block_k) <= 4 else 4, 2


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
    out: torch.Tensor | None = None,
    accumulate: bool = False,
    w13_scales: torch.Tensor | None = None,
    w2_scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t]) for ``x [T, H]``; see the
    module docstring for the weight layouts. Returns ``out`` ([T, H] in x's dtype); with
    ``accumulate`` the sum is added to ``out`` (given; the pairwise path of small batches).
    With ``w13_scales`` / ``w2_scales`` the weights are MXFP4: packed codes and their scales."""
    num_tokens, hidden = x.shape
    num_experts, two_i, _ = _dense_shape(w13, w13_scales)
    top_k = topk_ids.shape[1]
    tensors = (x, w13, w2) + tuple(t for t in (w13_scales, w2_scales) if t is not None)
    if any(t.stride(-1) != 1 for t in tensors):
        raise ValueError("x and the expert weights must be contiguous in their last dim")
    if (w13_scales is None) != (w2_scales is None):
        raise ValueError("MXFP4 experts need scales for both w13 and w2")
    tiles = tiles or choose_tiles(num_tokens, top_k, num_experts, hidden, two_i // 2, x.device,
                                  x.dtype, mxfp4=w13_scales is not None)  # fmt: skip
    if w13_scales is not None:
        _check_mxfp4(w13, w13_scales, w2, w2_scales, tiles)
    if accumulate and (out is None or not tiles.pairwise):
        raise ValueError("accumulate adds into a given out, on the pairwise path only")
    if out is None:
        out = torch.empty_like(x)
    interleaved = activation == "clamped_swiglu"
    act = ACTIVATIONS[activation]
    gate_stride, up_offset = (2, 1) if interleaved else (1, two_i // 2)
    weights = topk_weights.reshape(-1).contiguous()
    ids = topk_ids.contiguous()
    if tiles.pairwise:
        _pairwise(x, w13, w2, w13_scales, w2_scales, b13, b2, weights, ids, tiles, act,
                  gate_stride, up_offset, alpha, limit, out, accumulate)  # fmt: skip
        return out
    if min(tiles.block_m, tiles.block_n, tiles.block_k) < 16:
        raise ValueError(f"MoE tiles must be >= 16 (tl.dot), got {tiles}")
    num_pairs = num_tokens * top_k
    sorted_ids, block_expert = align_by_expert(ids, num_experts, tiles.block_m)
    gate_up = x.new_empty((num_pairs, two_i))
    _grouped_gemm(x, w13, w13_scales, b13, gate_up, sorted_ids, block_expert, weights, tiles,
                  a_row_div=top_k)  # fmt: skip
    acts = x.new_empty((num_pairs, two_i // 2))
    _launch_act(
        (num_pairs, triton.cdiv(two_i // 2, ACT_BLOCK)), (gate_up, acts),
        (two_i // 2, gate_up.stride(0), acts.stride(0), gate_stride, up_offset, float(alpha),
         float(limit)),
        dict(ACT=act, BLOCK=ACT_BLOCK, num_warps=4),
    )  # fmt: skip
    down = x.new_empty((num_pairs, hidden))
    _grouped_gemm(acts, w2, w2_scales, b2, down, sorted_ids, block_expert, weights, tiles,
                  a_row_div=1, mul_weight=True)  # fmt: skip
    return out.copy_(down.view(num_tokens, top_k, hidden).sum(dim=1, dtype=torch.float32))


def _check_mxfp4(
    w13: torch.Tensor, w13_scales: torch.Tensor, w2: torch.Tensor, w2_scales: torch.Tensor,
    tiles: MoeTiles,
) -> None:  # fmt: skip
    """Packed codes and scales that pair, and K tiles the scale groups divide."""
    for name, w, scales in (("w13", w13, w13_scales), ("w2", w2, w2_scales)):
        if w.dtype != torch.uint8 or scales.dtype != torch.uint8:
            raise ValueError(f"MXFP4 {name} codes and scales must be uint8")
        e, n, half = w.shape
        if tuple(scales.shape) != (e, n, 2 * half // MX_BLOCK) or (2 * half) % MX_BLOCK:
            raise ValueError(
                f"MXFP4 {name}: codes {tuple(w.shape)} and scales {tuple(scales.shape)} do not "
                f"pair (codes [E, N, K / 2], scales [E, N, K / {MX_BLOCK}])"
            )
    block_ks = [tiles.block_k] + ([tiles.down[1]] if tiles.down else [])
    if any(k % MX_BLOCK for k in block_ks):
        raise ValueError(f"MXFP4 experts need K tiles that are multiples of {MX_BLOCK}: {tiles}")
