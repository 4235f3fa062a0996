"""Does the sorted (prefill) MoE's gap to cuBLAS come from its pointer-based loads? On the H100
at 2048 tokens, one gpt-oss-20b bf16 layer's experts (32 experts, top 4, hidden = inter = 2880)
take 1.33 ms in ``kernels.moe.fused_experts`` (128 x 256 x 64 tiles, 8 warps), while cuBLAS
runs the same rows unsorted (two plain GEMMs) in 0.59 ms, and a dense Triton GEMM that reads
both operands through TMA descriptors (``docs/wip/prefill_gemm_proto.py``) came within 1-3% of
cuBLAS on that device. This script defines the grouped GEMM again with TMA loads and times it
beside main's, in two variants:

- ``b_tma``: the expert weights through a host TMA descriptor over ``w`` viewed as
  ``[E * N, K]`` (tile ``[BLOCK_N, BLOCK_K]`` at ``[expert * N + n0, k0]``, used as
  ``dot(a, w.T)``); A still gathered by pointer (row ``sorted_ids // top_k``); outputs and the
  activation pass as main's (pair rows f).
- ``ab_tma``: gate/up as ``b_tma`` but storing its output at the *sorted* position (row = the
  entry's place in ``sorted_ids``), the activation over that sorted ``[capacity, 2I]`` buffer,
  so the down GEMM reads its A through TMA too (rows ``[pid_m * BLOCK_M, +BLOCK_M)`` of
  ``[capacity, I]``), weights by TMA, and scatters each row to its pair row f with the routing
  weight. Sentinel (padding) rows hold act(bias) there and are masked at the store.

Both end as main does: ``down.view(T, K, H).sum(1, dtype=float32)`` cast to x's dtype. Arms per
case (model, tokens): main at ``choose_tiles``' tiles and at 128 x 256 x 64 / 8 warps (skipped
where they are the same), each TMA variant at a few tiles, and cuBLAS unsorted as the ceiling.
Per arm: median ms of CUDA graph replays (L2 flushed before each, ``bench.common``), TFLOP/s
(``2 T k (H 2I + I H)``), max |diff| from main's default output and whether it is bitwise equal.
A tile that does not compile or launch (shared memory) is recorded with its error.

    PYTHONPATH=$PWD python3 docs/wip/moe_tma_sweep.py --out $OUT/tma.json [--tokens 2048,8192]
    TRITON_INTERPRET=1 PYTHONPATH=$PWD python3 docs/wip/moe_tma_sweep.py --check   # CPU
    TRITON_INTERPRET=1 PYTHONPATH=$PWD python3 docs/wip/moe_tma_sweep.py --dry --out /tmp/d.json
    PYTHONPATH=/tmp/t36:$PWD python3 docs/wip/moe_tma_sweep.py --compile  # CPU: sm_90 builds

``--check`` compares both variants with ``fused_experts`` in float32 under the interpreter
(tails in N and K, biases, both activations, an expert with no tokens, every token on one
expert; ~10 s). ``--dry`` runs the sweep's own code at tiny float32 sizes, untimed. ``--compile``
builds main's kernel and both variants at the device tiles for sm_90 through
``tests/sm90_compile.py``'s ``CompileOnly`` (~25 s) and prints registers, stack, spill stores,
shared memory, HGMMAs, TMA loads (UTMALDG) and async copies (LDGSTS) of each. With Triton 3.6
nothing spills at any tile; at 128 x 256 x 64, 3 stages, gate/up / down: main 192 / 200
registers, 36 LDGSTS in the SASS (a K step's 4 for A + 8 for W, in the prologue's two stages
and the loop); b_tma 181 / 199, 3 UTMALDG + 12 LDGSTS (W by TMA, A gathered); ab_tma 177 /
196, its down 6 UTMALDG and no LDGSTS. Every
tile's shared memory fits the H100's 227 KiB (128 x 256 x 64 at 4 stages: 192 KiB).

Prediction (gpt-oss-20b bf16, H100). Padding bounds any grouped GEMM: each expert's run rounds
up to 128 rows, ~64 wasted of ~256 at 2048 tokens, so ~1.25x cuBLAS's MMA work, i.e. ~0.74 ms
plus ~0.05 for the activation pass and the k-sum: a floor near ~0.8 ms. ``b_tma`` takes the
weight tile's address math, masks and 2/3 of the per-step async copies off the issue slots
(A stays a cp.async gather): ~1.33 -> ~1.0 ms at 2048 tokens (~3.97 -> ~3.0 at 8192).
``ab_tma`` also frees the down GEMM's A loads but runs the activation over the capacity (~1.5x
the pair rows at 2048): ~0.9-0.95 ms. qwen3-30b-a3b (128 rows an expert at 2048: ~50% padding
with 128-row blocks) gains less in proportion: ~0.83 -> ~0.65 ms. If ``b_tma`` stays above
~1.2 ms on gpt-oss-20b, the loads are not the gap (look at the schedule: pipelining of the
gathered A, program order, wave quantization).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from nanograph.kernels import moe

VARIANTS = ("b_tma", "ab_tma")
# (block_m, block_n, block_k, num_warps, num_stages): main's winning tile first; 128 x 256 at
# 4 stages is (128 + 256) x 64 x 2 B x 4 = 192 KiB of operand buffers, near the H100's 227
TMA_TILES = [
    (128, 256, 64, 8, 3),
    (128, 128, 64, 8, 3),
    (128, 128, 64, 8, 4),
    (128, 256, 64, 8, 4),
]
MAIN_TILES = (128, 256, 64, 8, 3)  # main's gpt-oss-20b / qwen3-30b-a3b winner (stop 49)

MODELS = {  # experts, top_k, hidden, inter, activation (biases with clamped_swiglu)
    "gpt-oss-20b": (32, 4, 2880, 2880, "clamped_swiglu"),
    "qwen3-30b-a3b": (128, 8, 2048, 768, "silu"),
}


# The pair count changes with the batch: not specialized, as main's kernel.
@triton.jit(do_not_specialize=["num_pairs"])
def _tma_gemm_kernel(
    a_ptr, a_desc, w_desc, bias_ptr, c_ptr, sorted_ids_ptr, block_expert_ptr, topk_weights_ptr,
    num_pairs, N, K, stride_am, stride_be, stride_cm,
    A_ROW_DIV: tl.constexpr,  # a's row of flat index f: f // A_ROW_DIV (without A_TMA)
    HAS_BIAS: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,  # scale row f by topk_weights[f]
    A_TMA: tl.constexpr,  # A: rows [pid_m * BLOCK_M, +BLOCK_M) of a sorted-order buffer, by TMA
    SORTED_OUT: tl.constexpr,  # C at the sorted position, not at row f
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """``_moe_gemm_kernel``'s c[f, n] = sum_k a[row, k] * w[e, n, k] (+ bias[e, n]) (* weight[f])
    for the BLOCK_M sorted entries of this program's block (expert e), with the weight tile read
    through ``w_desc``: w as [E * N, K], boxes [BLOCK_N, BLOCK_K]. A box that runs past this
    expert's N reads the next expert's rows (or zeros past E * N), and one past K reads zeros:
    those columns of C are masked at the store, and zero K columns add nothing."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:  # past the last run
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = tl.load(sorted_ids_ptr + offs_m).to(tl.int64)
    row_valid = rows < num_pairs
    a_rows = rows // A_ROW_DIV
    n0 = pid_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    n_valid = offs_n < N
    w_row0 = expert * N + n0  # int32: the host checks E * N < 2^31 (TMA coordinates are int32)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if A_TMA:  # sentinel rows hold act(bias) (or garbage): their C rows are masked
            a = a_desc.load([pid_m * BLOCK_M, k0])
        else:  # gathered token rows: TMA on Hopper has no row gather
            offs_k = k0 + tl.arange(0, BLOCK_K)
            a_mask = row_valid[:, None] & (offs_k < K)[None, :]
            a = tl.load(a_ptr + a_rows[:, None] * stride_am + offs_k[None, :], mask=a_mask,
                        other=0)  # fmt: skip
        w = w_desc.load([w_row0, k0])  # [BLOCK_N, BLOCK_K], K contiguous as stored
        acc = tl.dot(a, tl.trans(w), acc, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + expert.to(tl.int64) * stride_be + offs_n, mask=n_valid, other=0)
        acc += bias.to(tl.float32)[None, :]
    if MUL_WEIGHT:
        weight = tl.load(topk_weights_ptr + rows, mask=row_valid, other=0)
        acc *= weight.to(tl.float32)[:, None]
    if SORTED_OUT:
        # every row of the block: the sorted buffer has capacity rows, and a sentinel row's
        # value (bias only: its A row was masked to zero) is read only by rows masked later
        c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=n_valid[None, :])
    else:
        c_ptrs = c_ptr + rows[:, None] * stride_cm + offs_n[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
                 mask=row_valid[:, None] & n_valid[None, :])  # fmt: skip


# The launched kernels, by name: ``--compile`` swaps them for sm90_compile's compiling stand-ins.
KERNELS = {"gemm": _tma_gemm_kernel, "act": moe._activation_kernel}


def _check_tma(name: str, t: torch.Tensor) -> None:
    """TMA reads a 2-D tensor whose base and row stride are 16-byte aligned, rows contiguous."""
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous for its TMA descriptor")
    row_bytes = t.shape[-1] * t.element_size()
    if row_bytes % 16 or t.data_ptr() % 16:
        raise ValueError(
            f"{name}: TMA needs a 16-byte aligned base and row stride; its rows are "
            f"{t.shape[-1]} x {t.element_size()} B = {row_bytes} B (base at {t.data_ptr() % 16} "
            "mod 16)"
        )


def _weight_descriptor(w: torch.Tensor, block_n: int, block_k: int) -> TensorDescriptor:
    """w [E, N, K] as [E * N, K] in [block_n, block_k] boxes (rows past E * N and columns past K
    read as zeros). A host descriptor: built once per call, baked into a captured graph (the
    weights are static, so a replay reads the right memory)."""
    e, n, k = w.shape
    if e * n >= 2**31:
        raise ValueError(f"E * N = {e * n} rows: TMA coordinates are int32")
    return TensorDescriptor(w, [e * n, k], [k, 1], [block_n, block_k])


def _gemm(
    a: torch.Tensor, a_desc: TensorDescriptor | None, w: torch.Tensor, bias: torch.Tensor | None,
    c: torch.Tensor, sorted_ids: torch.Tensor, block_expert: torch.Tensor,
    weights: torch.Tensor, num_pairs: int, tiles: moe.MoeTiles, *, a_row_div: int,
    mul_weight: bool = False, sorted_out: bool = False,
) -> None:  # fmt: skip
    """One grouped GEMM: a program per (sorted block, N tile), as main's ``_grouped_gemm``."""
    _, n, k = w.shape
    grid = (block_expert.shape[0], triton.cdiv(n, tiles.block_n))
    KERNELS["gemm"][grid](
        a, a if a_desc is None else a_desc,  # a placeholder where A is gathered
        _weight_descriptor(w, tiles.block_n, tiles.block_k),
        bias if bias is not None else w, c, sorted_ids, block_expert, weights,
        num_pairs, n, k, a.stride(0), bias.stride(0) if bias is not None else 0, c.stride(0),
        A_ROW_DIV=a_row_div, HAS_BIAS=bias is not None, MUL_WEIGHT=mul_weight,
        A_TMA=a_desc is not None, SORTED_OUT=sorted_out, BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        # fp32 (the interpreter's exact checks): exact products, as main
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else None,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )  # fmt: skip


def tma_fused_experts(
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
    tiles: moe.MoeTiles | None = None,
    variant: str = "b_tma",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``moe.fused_experts``' sorted regime (dense weights: bf16 / fp16 on the device, fp32 for
    the interpreter's checks) with the TMA loads of ``variant`` (module docstring)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}: one of {', '.join(VARIANTS)}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32) or w13.dtype != x.dtype:
        raise ValueError("dense experts in x's dtype (bf16 / fp16; fp32 for checks) only")
    num_tokens, hidden = x.shape
    num_experts, two_i, _ = w13.shape
    inter = two_i // 2
    top_k = topk_ids.shape[1]
    num_pairs = num_tokens * top_k
    tiles = tiles or moe.choose_tiles(num_tokens, top_k, num_experts, hidden, inter, x.device,
                                      x.dtype)  # fmt: skip
    if tiles.pairwise or min(tiles.block_m, tiles.block_n, tiles.block_k) < 16:
        raise ValueError(f"the sorted regime with tiles >= 16 (tl.dot), got {tiles}")
    if x.stride(-1) != 1:
        raise ValueError("x must be contiguous in its last dim")
    _check_tma("w13", w13)  # K = hidden
    _check_tma("w2", w2)  # K = inter
    interleaved = activation == "clamped_swiglu"
    act = moe.ACTIVATIONS[activation]
    gate_stride, up_offset = (2, 1) if interleaved else (1, inter)
    weights = topk_weights.reshape(-1).contiguous()
    ids = topk_ids.contiguous()
    sorted_ids, block_expert = moe.align_by_expert(ids, num_experts, tiles.block_m)
    # ab_tma: gate/up and the activations in sorted order, every entry of the capacity a row
    rows = num_pairs if variant == "b_tma" else sorted_ids.shape[0]
    gate_up = x.new_empty((rows, two_i))
    _gemm(x, None, w13, b13, gate_up, sorted_ids, block_expert, weights, num_pairs, tiles,
          a_row_div=top_k, sorted_out=variant == "ab_tma")  # fmt: skip
    # elementwise a row: over the sorted buffer as well (rows of blocks past the last run are
    # never written, so their activations are garbage that only skipped programs would read)
    acts = x.new_empty((rows, inter))
    KERNELS["act"][(rows, triton.cdiv(inter, moe.ACT_BLOCK))](
        gate_up, acts, inter, gate_up.stride(0), acts.stride(0), gate_stride, up_offset,
        float(alpha), float(limit), ACT=act, BLOCK=moe.ACT_BLOCK, num_warps=4,
    )  # fmt: skip
    a_desc = None
    if variant == "ab_tma":
        _check_tma("the sorted activations", acts)
        a_desc = TensorDescriptor(acts, [rows, inter], [inter, 1], [tiles.block_m, tiles.block_k])
    down = x.new_empty((num_pairs, hidden))
    _gemm(acts, a_desc, w2, b2, down, sorted_ids, block_expert, weights, num_pairs, tiles,
          a_row_div=1, mul_weight=True)  # fmt: skip
    total = down.view(num_tokens, top_k, hidden).sum(dim=1, dtype=torch.float32)
    return total.to(x.dtype) if out is None else out.copy_(total)


# ----------------------------------------------------------------------------------------------
# --check: CPU, interpreter, float32 against main


def _inputs(tokens, experts, top_k, hidden, inter, activation, dtype, g, device="cpu",
            ids=None, bias_scale=0.1):  # fmt: skip
    """x, w13, w2, b13, b2, weights, ids for one layer's experts (biases with clamped_swiglu,
    as gpt-oss), random routing unless ``ids`` is given."""
    x = torch.randn(tokens, hidden, device=device, generator=g).to(dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, device=device, generator=g)
           / hidden**0.5).to(dtype)  # fmt: skip
    w2 = (torch.randn(experts, hidden, inter, device=device, generator=g) / inter**0.5).to(dtype)
    biases = activation == "clamped_swiglu"
    b13 = (torch.randn(experts, 2 * inter, device=device, generator=g) * bias_scale).to(dtype)
    b2 = (torch.randn(experts, hidden, device=device, generator=g) * bias_scale).to(dtype)
    logits = torch.randn(tokens, experts, device=device, generator=g)
    weights, top = torch.topk(logits.softmax(-1), top_k, dim=-1)
    weights = (weights / weights.sum(-1, keepdim=True)).to(dtype)
    ids = top if ids is None else ids.to(device)
    return x, w13, w2, b13 if biases else None, b2 if biases else None, weights, ids


def check() -> int:
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        print("--check runs under TRITON_INTERPRET=1 (CPU)", file=sys.stderr)
        return 2
    g = torch.Generator().manual_seed(0)
    T = moe.MoeTiles
    # (name, tokens, experts, top_k, hidden, inter, activation, tiles, ids): hidden 80 and
    # inter 48 with 32-wide K tiles leave K tails (TMA reads zeros past K); 2I = 96 and H = 80
    # in 64-wide N tiles run into the next expert's rows (masked at the store)
    cases = [
        ("silu 5 tokens", 5, 4, 2, 64, 32, "silu", T(16, 16, 16, 1, 1), None),
        ("swiglu+bias 17 tokens", 17, 6, 3, 64, 48, "clamped_swiglu", T(16, 16, 16, 1, 1), None),
        ("silu 40 tokens, 32-row blocks", 40, 5, 2, 64, 32, "silu", T(32, 16, 16, 2, 1), None),
        ("swiglu+bias N and K tails", 23, 4, 2, 80, 48, "clamped_swiglu", T(16, 64, 32, 2, 1),
         None),
        ("silu N and K tails, top 3", 31, 6, 3, 80, 48, "silu", T(16, 64, 32, 2, 1), None),
    ]  # fmt: skip
    # expert 2 of 5 gets no tokens; then every token on expert 3 (top 1) and on experts 3, 1
    no_two = torch.stack([torch.randperm(4, generator=g)[:2] for _ in range(29)])
    no_two = torch.where(no_two >= 2, no_two + 1, no_two)
    cases += [
        ("swiglu+bias, an expert with no tokens", 29, 5, 2, 64, 32, "clamped_swiglu",
         T(16, 16, 16, 1, 1), no_two),
        ("silu, every token on one expert (top 1)", 37, 4, 1, 64, 48, "silu",
         T(16, 32, 16, 1, 1), torch.full((37, 1), 3)),
        ("swiglu+bias, every token on experts 3 and 1", 21, 4, 2, 64, 32, "clamped_swiglu",
         T(16, 16, 16, 1, 1), torch.tensor([[3, 1]]).repeat(21, 1)),
    ]  # fmt: skip
    failed = 0
    for name, tokens, experts, top_k, hidden, inter, activation, tiles, ids in cases:
        args = _inputs(tokens, experts, top_k, hidden, inter, activation, torch.float32, g,
                       ids=ids)  # fmt: skip
        want = moe.fused_experts(*args, activation, tiles=tiles)
        for variant in VARIANTS:
            got = tma_fused_experts(*args, activation, tiles=tiles, variant=variant)
            ok = torch.allclose(got, want, atol=1e-4, rtol=1e-4)
            failed += not ok
            diff = (got - want).abs().max().item()
            same = " (bitwise equal)" if torch.equal(got, want) else ""
            print(f"{'PASS' if ok else 'FAIL'} {variant:6s} {name}: max |diff| {diff:.1e}{same}",
                  flush=True)  # fmt: skip
    # bf16 plumbing (the device's dtype): the interpreter's bf16 products are not main's to the
    # bit, so a loose tolerance
    args = _inputs(19, 4, 2, 64, 32, "clamped_swiglu", torch.bfloat16, g)
    tiles = T(16, 16, 16, 1, 1)
    want = moe.fused_experts(*args, "clamped_swiglu", tiles=tiles).float()
    for variant in VARIANTS:
        got = tma_fused_experts(*args, "clamped_swiglu", tiles=tiles, variant=variant).float()
        ok = torch.allclose(got, want, atol=3e-2, rtol=3e-2)
        failed += not ok
        diff = (got - want).abs().max().item()
        print(f"{'PASS' if ok else 'FAIL'} {variant:6s} bf16 swiglu+bias: max |diff| {diff:.1e}")
    # a K whose rows are not 16-byte aligned (bf16 hidden 36: 72 B) is refused, not misread
    args = _inputs(9, 4, 2, 36, 32, "silu", torch.bfloat16, g)
    try:
        tma_fused_experts(*args, "silu", tiles=tiles)
        print("FAIL misaligned K: no error raised")
        failed += 1
    except ValueError as e:
        print(f"PASS misaligned K refused: {e}")
    print(f"{'all passed' if not failed else f'{failed} FAILED'}")
    return 1 if failed else 0


# ----------------------------------------------------------------------------------------------
# --compile: CPU, sm_90 builds through tests/sm90_compile.py


def compile_sm90() -> int:
    """Builds both variants' kernels at the device tiles for sm_90 (Triton's nvidia backend
    without a GPU: run with Triton 3.6 on PYTHONPATH, the device's version) through
    ``tests/sm90_compile.py``'s ``CompileOnly`` (which specializes arguments as a launch does),
    and prints each build's registers, stack, spill stores, shared memory and HGMMAs."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("--compile needs real JIT kernels: unset TRITON_INTERPRET", file=sys.stderr)
        return 2
    path = Path(__file__).resolve().parents[2] / "tests" / "sm90_compile.py"
    spec = importlib.util.spec_from_file_location("sm90_compile", path)
    sm90 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sm90)
    # CompileOnly drops what triton.compile returns: record it around the call
    builds = []
    real_compile = triton.compile

    def recording_compile(*args, **kwargs):
        compiled = real_compile(*args, **kwargs)
        builds.append(compiled)
        return compiled

    triton.compile = recording_compile
    KERNELS["gemm"] = sm90.CompileOnly(_tma_gemm_kernel)
    KERNELS["act"] = sm90.CompileOnly(moe._activation_kernel)
    # main's grouped GEMM too, at the same tiles: the baseline's registers and loads
    moe._launch_gemm.kernel = sm90.CompileOnly(moe._launch_gemm.kernel)
    moe._launch_act.kernel = sm90.CompileOnly(moe._launch_act.kernel)
    # H100: 227 KiB of shared memory a block at most (opt-in)
    max_shared = 227 * 1024
    report, failed = [], 0
    for model, (experts, top_k, hidden, inter, activation) in MODELS.items():
        tokens = 2048  # the tiles, not the token count, make a variant
        # empty tensors: never read on the CPU, only their dtypes, shapes and alignment matter
        bf = torch.bfloat16
        x = torch.empty(tokens, hidden, dtype=bf)
        w13 = torch.empty(experts, 2 * inter, hidden, dtype=bf)
        w2 = torch.empty(experts, hidden, inter, dtype=bf)
        biases = activation == "clamped_swiglu"
        b13 = torch.empty(experts, 2 * inter, dtype=bf) if biases else None
        b2 = torch.empty(experts, hidden, dtype=bf) if biases else None
        ids = torch.randint(0, experts, (tokens, top_k))
        weights = torch.ones(tokens, top_k, dtype=bf)
        for variant in ("main", *VARIANTS):
            for bm, bn, bk, warps, stages in TMA_TILES:
                tiles = moe.MoeTiles(bm, bn, bk, warps, stages)
                label = f"{model} {variant} {bm}x{bn}x{bk} {warps}w {stages}s"
                before = len(builds)
                try:
                    if variant == "main":
                        moe.fused_experts(x, w13, w2, b13, b2, weights, ids, activation,
                                          tiles=tiles)  # fmt: skip
                    else:
                        tma_fused_experts(x, w13, w2, b13, b2, weights, ids, activation,
                                          tiles=tiles, variant=variant)  # fmt: skip
                except Exception as e:  # noqa: BLE001 - a failing build is a result
                    failed += 1
                    print(f"{label}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
                    report.append(dict(arm=label, error=f"{type(e).__name__}: {e}"))
                    continue
                # gate/up, the activation, down in launch order
                for kernel, compiled in zip(("gate_up", "act", "down"), builds[before:]):
                    if kernel == "act":
                        continue
                    row = dict(arm=label, kernel=kernel, **_usage(compiled))
                    row["fits"] = row["shared"] <= max_shared
                    report.append(row)
                    print(f"{label} {kernel}: {row['regs']} regs, stack {row['stack']}, "
                          f"{row['spill_stores']} spill stores, shared {row['shared']} B"
                          f"{'' if row['fits'] else ' (over 227 KiB)'}, {row['hgmma']} HGMMA, "
                          f"{row['tma_loads']} UTMALDG, {row['async_copies']} LDGSTS",
                          flush=True)  # fmt: skip
    print(f"{len(report)} builds, {failed} failed")
    return 1 if failed else 0


def _usage(compiled) -> dict:
    """Registers and stack (cuobjdump -res-usage), spill stores and HGMMAs (SASS), dynamic
    shared memory (Triton's metadata) of a compiled kernel."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")  # fmt: skip
    cubin = Path(f"/tmp/moe_tma_sweep_{os.getpid()}.cubin")
    cubin.write_bytes(compiled.asm["cubin"])
    try:
        usage, sass = (
            subprocess.run(
                [tool, flag, str(cubin)], capture_output=True, text=True, check=True
            ).stdout
            for flag in ("-res-usage", "-sass")
        )
    finally:
        cubin.unlink()
    regs = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    return dict(
        regs=int(regs.group(1)) if regs else None,
        stack=int(stack.group(1)) if stack else None,
        spill_stores=len(re.findall(r"\bSTL\b", sass)),
        shared=compiled.metadata.shared,
        hgmma=sass.count("HGMMA"),
        # the loads as the SM issues them: TMA (UTMALDG) against async copies (LDGSTS, one per
        # thread and 16 bytes): the weight tile's should have moved from the second to the first
        tma_loads=sass.count("UTMALDG"),
        async_copies=sass.count("LDGSTS"),
    )


# ----------------------------------------------------------------------------------------------
# the device sweep


# --dry: the sweep's own code on the CPU under the interpreter (float32, tiny layers, each arm
# run once and not timed), to catch a broken script before it costs device time
DRY_MODELS = {
    "tiny-swiglu": (6, 2, 64, 48, "clamped_swiglu"),
    "tiny-silu": (8, 3, 80, 32, "silu"),
}
DRY_TILES = [(16, 32, 16, 2, 1), (32, 16, 32, 2, 1)]
DRY_MAIN_TILES = (16, 16, 16, 1, 1)


def _case(model: str, tokens: int, g: torch.Generator, rep_ms: int, dry: bool = False) -> dict:
    from nanograph.bench.common import graphed_samples, median

    experts, top_k, hidden, inter, activation = (DRY_MODELS if dry else MODELS)[model]
    device, dtype = ("cpu", torch.float32) if dry else ("cuda", torch.bfloat16)
    args = _inputs(tokens, experts, top_k, hidden, inter, activation, dtype, g, device=device)
    x = args[0]
    out = torch.empty_like(x)
    flops = 2 * tokens * top_k * (hidden * 2 * inter + inter * hidden)
    default = moe.choose_tiles(tokens, top_k, experts, hidden, inter, x.device, dtype)
    default_t = (default.block_m, default.block_n, default.block_k, default.num_warps,
                 default.num_stages)  # fmt: skip
    reference = moe.fused_experts(*args, activation, tiles=default)

    def time_ms(fn) -> float:  # graph replays, L2 flushed before each; dry: run once, no time
        if dry:
            fn()
            return float("nan")
        return median(graphed_samples(fn, rep_ms))

    # (label, tiles, variant): main's default, main's winner where it differs, then each TMA
    # variant at each tile
    main_tiles, tma_tiles = (DRY_MAIN_TILES, DRY_TILES) if dry else (MAIN_TILES, TMA_TILES)
    arms = [("main", default_t, None)]
    if main_tiles != default_t:
        arms.append(("main", main_tiles, None))
    arms += [(variant, t, variant) for variant in VARIANTS for t in tma_tiles]
    rows = []
    for label, t, variant in arms:
        tiles = moe.MoeTiles(*t)
        row = dict(arm=label, tiles=list(t))
        try:
            if variant is None:
                step = lambda tiles=tiles: moe.fused_experts(*args, activation, tiles=tiles,
                                                             out=out)  # fmt: skip
            else:
                step = lambda tiles=tiles, v=variant: tma_fused_experts(
                    *args, activation, tiles=tiles, variant=v, out=out)  # fmt: skip
            got = step().clone()
            ms = time_ms(step)
            row.update(ms=ms, tflops=flops / ms / 1e9,
                       max_abs_diff=(got.float() - reference.float()).abs().max().item(),
                       bitwise=torch.equal(got, reference))  # fmt: skip
        except Exception as e:  # noqa: BLE001 - a tile the device refuses is a result too
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        if not dry:  # a failed launch: surface its error here, not in the next arm
            try:
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - the context may be gone; say so, go on
                row.setdefault("error", f"{type(e).__name__}: {str(e)[:300]}")
        rows.append(row)
        _say(row)
    # cuBLAS on the same rows, unsorted: the ceiling of the two grouped GEMMs
    a = torch.randn(tokens * top_k, hidden, device=device, generator=g).to(dtype)
    wa = torch.randn(hidden, 2 * inter, device=device, generator=g).to(dtype)
    h = torch.randn(tokens * top_k, inter, device=device, generator=g).to(dtype)
    wb = torch.randn(inter, hidden, device=device, generator=g).to(dtype)
    ms = time_ms(lambda: (a @ wa, h @ wb))
    rows.append(dict(arm="cublas unsorted", ms=ms, tflops=flops / ms / 1e9))
    _say(rows[-1])
    return dict(model=model, tokens=tokens, default=list(default_t), rows=rows)


def _say(row: dict) -> None:
    tiles = ""
    if "tiles" in row:
        bm, bn, bk, warps, stages = row["tiles"]
        tiles = f"{bm}x{bn}x{bk} {warps}w {stages}s"
    if "error" in row:
        said = row["error"][:160]
    else:
        said = f"{row['ms']:.3f} ms {row['tflops']:.0f} TFLOP/s"
        if "bitwise" in row:
            said += f", max |diff| {row['max_abs_diff']:.2e}"
            said += " (bitwise equal)" if row["bitwise"] else ""
    print(f"  {row['arm']:15s} {tiles:18s} {said}", flush=True)


def sweep(tokens: list[int], models: list[str], out: str, rep_ms: int, dry: bool) -> None:
    g = torch.Generator(device="cpu" if dry else "cuda").manual_seed(0)
    results = dict(device="cpu (dry run)" if dry else torch.cuda.get_device_name(),
                   triton=triton.__version__, torch=torch.__version__, cases=[])  # fmt: skip
    for model in models:
        for t in tokens:
            print(f"{model} {'float32' if dry else 'bf16'} T={t}", flush=True)
            case = _case(model, t, g, rep_ms, dry)
            ok = [r for r in case["rows"] if "ms" in r and r["arm"] != "cublas unsorted"]
            if ok:
                best = min(ok, key=lambda r: r["ms"])
                print(f"  main default {ok[0]['ms']:.3f} ms, best {best['arm']} {best['tiles']} "
                      f"{best['ms']:.3f} ms, cuBLAS {case['rows'][-1]['ms']:.3f} ms",
                      flush=True)  # fmt: skip
            results["cases"].append(case)
            with open(out, "w") as f:  # after each case: a later failure keeps what ran
                json.dump(results, f, indent=1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="CPU, TRITON_INTERPRET=1: vs main")
    p.add_argument("--compile", action="store_true", help="CPU: sm_90 builds, registers")
    p.add_argument("--dry", action="store_true",
                   help="CPU, TRITON_INTERPRET=1: the sweep at tiny sizes, untimed")  # fmt: skip
    p.add_argument("--tokens", default=None, help="comma-separated (default 2048,8192; dry 40)")
    p.add_argument("--models", default=None, help=f"comma-separated of {', '.join(MODELS)}")
    p.add_argument("--rep-ms", type=int, default=80, help="replay time an arm (~50 replays)")
    p.add_argument("--out", default="moe_tma_sweep.json")
    args = p.parse_args()
    # ab_tma runs the activation over rows no program wrote (blocks past the last run, their
    # memory as torch.empty left it): the interpreter's numpy may overflow there and warn;
    # those rows never reach the output
    warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning)
    if args.check:
        return check()
    if args.compile:
        return compile_sm90()
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if args.dry != interpreted:
        print("--dry runs under TRITON_INTERPRET=1, the sweep without it", file=sys.stderr)
        return 2
    if not args.dry and not torch.cuda.is_available():
        print("the sweep needs a CUDA device (--check, --compile and --dry run on the CPU)",
              file=sys.stderr)  # fmt: skip
        return 2
    tokens = args.tokens or ("40" if args.dry else "2048,8192")
    models = args.models or ",".join(DRY_MODELS if args.dry else MODELS)
    sweep([int(t) for t in tokens.split(",")], models.split(","), args.out, args.rep_ms,
          args.dry)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
