"""Prototype (issue 18): FlashAttention-3-style causal prefill attention for Hopper, in Gluon.

Issue 18's 8k aim: qwen3-0.6b's 8192-token prefill in <= 30 ms (now 33.1 ms), attention ~16.4 ms
of it. Our extend kernel (plain ``triton.language``) runs 1 x 8192 with qwen3-0.6b heads in
0.604 ms (~455 TFLOP/s), the TMA prototype ``extend_contiguous_proto.py`` 0.565, cuDNN 0.51
(536): cuDNN-level attention would save ~2 ms over the 28 layers. ``tl`` cannot overlap the
softmax with the tensor cores (Triton waits right after each dot); Gluon's Hopper dialect can.

The kernel: one CTA per (BLOCK_M query rows, one q head) of one sequence; causal, GQA, q/k/v
contiguous [N, H, D] bf16 (N a multiple of 128 is what is checked; other N rely on TMA's zero
fill and clipped stores, checked at 1000 and reported apart). Heaviest query tiles first in a
1-D grid, heads minor (a kv head's q heads run together: its K/V stays in L2). Per CTA:
- Q once by TMA; K and V blocks by TMA into rings of STAGES buffers, each slot with a "ready"
  mbarrier (expect-tx bytes) and an "empty" one; K and V apart, so S = Q K^T starts before V.
- FA3's intra-warpgroup pipeline: iteration j issues S_j = Q K_j^T (async wgmma), rescales O
  under it, issues O += P_{j-1} V_{j-1} (P in registers, the A operand), waits for S_j only
  (num_outstanding=1) and runs block j's softmax while P V runs, then waits for P V.
- Blocks below the diagonal unmasked, the diagonal ones masked (a uniform branch), those above
  skipped. Softmax scale folded into exp2 (one FFMA an element), max kept on raw scores.
- Three structures (VARIANTS): ``ws``, FA3's warp specialization through ``gl.warp_specialize``:
  a 1-warp producer partition (24 registers) issues every TMA load, the default partition (1
  or 2 warpgroups, 64 rows each) computes with the freed registers (240 at 128 rows, via
  maxnreg + setmaxnreg). ``ws2``: FA3's layout proper, the two consumer warpgroups in two
  partitions that run free of each other, so one's softmax can overlap the other's MMAs (FA3
  orders them with named barriers, ping-pong; Gluon 3.6 has none: the warp scheduler
  interleaves them). ``pipe``: no producer, the consumer refills the ring itself (software
  pipelining in one partition: the fallback if warp specialization hangs or loses).
- Two ptxas findings (sm_90 SASS, --compile checks them): converting P to bf16 at the end of
  the softmax made ptxas write the new P into the registers the running P V reads and hoist
  P V's wait above the softmax (no overlap); P now crosses the loop edge in float32 and is
  converted at the top of the next iteration. And ptxas hoists a wgmma wait to the top of its
  basic block: the softmax sits inside both arms of the diagonal-block branch, so P V's wait,
  after the join, stays after the exp2 work.

    PYTHONPATH=/tmp/t36:. python3 docs/wip/gluon_attention_proto.py --compile   # CPU, sm_90
    python3 docs/wip/gluon_attention_proto.py --dry --out /tmp/dry.json         # CPU, harness
    python3 docs/wip/gluon_attention_proto.py --out OUT.json                    # GPU, ~2 min

GPU mode: each variant's first launches run in a child process with a timeout (correctness
against float32 SDPA at 1024 and 8192 tokens for both head layouts, tolerance 2e-2 max abs, and
one launch at every timed length), so a hang (a barrier-phase bug) or a fault is recorded and
the rest go on; then the passing ones, the tl prototype and SDPA's backends are timed (median
of >= 20 launches, CUDA events) at --lengths, printed and written to --out.

PREDICTION (1 x 8192, qwen3-0.6b heads, H200; best variant ws2_m128_n128_s2 or ws_m128_n128_s2):
~0.50 ms, ~550 TFLOP/s (range 0.45-0.56 ms), i.e. at cuDNN (0.51 ms, 536). Why: FA3 reaches
~600-660 TFLOP/s causal forward at D=128 bf16 on H100 at 8k-16k. The SASS of the main loop
has FA3's overlap (a warpgroup's 128-key block: 16 HGMMA and 66 MUFU.EX2 among 456 instructions
on the unmasked path, P V's wait after the last exp2), but no ping-pong order between the
warpgroups, two partition barriers a block (each mbarrier arrive syncs its partition), and one
tile per CTA at one CTA an SM (164 KB shared memory): 1024 tiles of uneven length on 132 SMs,
each with an unhidden start (Q, first K) and store, ~4% of the time. So ~85-90% of FA3's rate.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

# (name, BLOCK_M, BLOCK_N, STAGES, WS). WS 0: no warp specialization; 1: a producer warp and one
# consumer partition of BLOCK_M // 16 warps; 2: a producer warp and two consumer partitions of
# 64 rows (4 warps) each. Checked in this order, the kinds alternating: a hang in one kind does
# not use up the check budget before the others ran.
VARIANTS = [
    ("ws_m128_n128_s2", 128, 128, 2, 1),  # FA3's tiles for D=128
    ("pipe_m128_n128_s2", 128, 128, 2, 0),
    ("ws2_m128_n128_s2", 128, 128, 2, 2),  # FA3's layout: 2 consumer warpgroups, free-running
    ("ws_m128_n64_s3", 128, 64, 3, 1),
    ("pipe_m128_n64_s3", 128, 64, 3, 0),
    ("ws_m64_n64_s2", 64, 64, 2, 1),  # one consumer warpgroup, 2 CTAs an SM
]
LAYOUTS = {"qwen3-0.6b": (16, 8, 128), "qwen3-8b": (32, 8, 128)}
TOLERANCE = 2e-2  # max abs error against float32 SDPA (outputs of magnitude <~ 4, bf16 out)


def _maxnreg(block_m: int, ws: int) -> int | None:
    """The launch register cap; setmaxnreg moves the producer's unused share to the consumers.

    128 rows: 8 consumer warps + a producer warpgroup = 384 threads, 1 CTA/SM: 65536 / 384 ->
    168 (consumers then get (168 * 12 - 24 * 4) / 8 = 240, FA3's budget; WS 2 the same, in two
    partitions). 64 rows: 8 warps, 2 CTAs/SM: 128 (consumers 232).
    """
    if not ws:
        return None
    return 168 if block_m == 128 else 128


@gluon.jit
def _tma_load(desc, row, col, bar, buf, pred):
    mbarrier.expect(bar, desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(desc, [row, col], bar, buf, pred=pred)


@gluon.jit
def _load_q(q_desc, q_smem, q_bar, m0, q_col):
    """The tile's Q, one box per consumer partition, on one barrier."""
    SPLIT: gl.constexpr = q_smem.shape[0]
    ROWS: gl.constexpr = q_smem.shape[1]
    mbarrier.expect(q_bar, SPLIT * q_desc.block_type.nbytes)
    for i in gl.static_range(SPLIT):
        tma.async_copy_global_to_shared(q_desc, [m0 + i * ROWS, q_col], q_bar, q_smem.index(i))


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, bars, m0, q_col, kv_col, n_blocks):
    """The load partition (one warp): Q, then K_j and V_j as their ring slots free up."""
    q_bar, k_ready, v_ready, k_empty, v_empty = bars
    STAGES: gl.constexpr = k_bufs.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.shape[1]
    _load_q(q_desc, q_smem, q_bar, m0, q_col)
    for j in range(n_blocks):
        slot = j % STAGES
        # a fresh mbarrier counts as having completed the phase before 0: the first lap of the
        # ring waits on parity 1 and passes at once
        free_phase = ((j // STAGES) & 1) ^ 1
        mbarrier.wait(k_empty.index(slot), free_phase)
        _tma_load(k_desc, j * BLOCK_N, kv_col, k_ready.index(slot), k_bufs.index(slot), True)
        mbarrier.wait(v_empty.index(slot), free_phase)
        _tma_load(v_desc, j * BLOCK_N, kv_col, v_ready.index(slot), v_bufs.index(slot), True)


@gluon.jit
def _release(desc, bufs, ready, empty, block, kv_col, n_blocks, WS: gl.constexpr):
    """Block ``block``'s K (or V) slot is consumed: hand it to the producer, or (no producer)
    refill it with block + STAGES right here."""
    STAGES: gl.constexpr = bufs.shape[0]
    BLOCK_N: gl.constexpr = bufs.shape[1]
    slot = block % STAGES
    if WS:  # every consumer partition arrives (the barrier counts them)
        mbarrier.arrive(empty.index(slot))  # lowered with a partition barrier first
    else:
        _tma_load(desc, (block + STAGES) * BLOCK_N, kv_col, ready.index(slot), bufs.index(slot),
                  block + STAGES < n_blocks)  # fmt: skip


@gluon.jit
def _mask(s, j, m0, s_layout: gl.constexpr):
    """A diagonal block: keys past the row are out."""
    ROWS: gl.constexpr = s.shape[0]
    BLOCK_N: gl.constexpr = s.shape[1]
    rows = m0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
    keys = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    return gl.where(gl.expand_dims(keys, 0) <= gl.expand_dims(rows, 1), s, -float("inf"))


@gluon.jit
def _softmax(s, m_i, l_i, qk_scale):
    """Online softmax of one S block (raw scores; the scale is folded into exp2's FFMA)."""
    # block 0 holds key 0, which every row sees: m_new is finite from the first block on
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    m_scaled = m_new * qk_scale
    alpha = gl.exp2(m_i * qk_scale - m_scaled)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_scaled, 1))
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, m_new, l_i, alpha


@gluon.jit
def _consumer(k_desc, v_desc, o_desc, q_smem, k_bufs, v_bufs, bars, m0, q_col, kv_col, n_blocks,
              n_full, qk_scale, WS: gl.constexpr):  # fmt: skip
    """Query rows m0 .. m0 + ROWS (this partition's) against the tile's n_blocks key blocks."""
    q_bar, k_ready, v_ready, k_empty, v_empty = bars
    ROWS: gl.constexpr = q_smem.shape[0]
    HEAD_DIM: gl.constexpr = q_smem.shape[1]
    STAGES: gl.constexpr = k_bufs.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.shape[1]
    WARPS: gl.constexpr = gl.num_warps()
    # one warpgroup per 64 rows; S's instruction is 64 x BLOCK_N, O's 64 x HEAD_DIM
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                       instr_shape=[16, BLOCK_N, 16])  # fmt: skip
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])  # fmt: skip
    # P as P V's register A operand: S's accumulator fragment already is this layout (bf16)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)

    # block 0 alone: its softmax has no P V to hide behind
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_ready.index(0), 0)
    s_tok = warpgroup_mma(q_smem, k_bufs.index(0).permute((1, 0)), s_zero, use_acc=False,
                          is_async=True)  # fmt: skip
    s = warpgroup_mma_wait(0, deps=[s_tok])
    _release(k_desc, k_bufs, k_ready, k_empty, 0, kv_col, n_blocks, WS)
    m_i = gl.full([ROWS], -float("inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([ROWS], gl.float32, gl.SliceLayout(1, s_layout))
    if n_full == 0:
        s = _mask(s, 0, m0, s_layout)
    p, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale)
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)

    # P_{j-1} crosses the loop edge in float32 (S's registers) and becomes P V's bf16 operand
    # at the top of iteration j, after the wait that retired the P V reading the old operand:
    # converted at the end of the softmax instead, ptxas writes the new operand into the
    # registers the running P V still reads and hoists that wait above the softmax (no overlap)
    for j in range(1, n_blocks):
        slot = j % STAGES
        prev = (j - 1) % STAGES
        p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
        mbarrier.wait(k_ready.index(slot), (j // STAGES) & 1)
        s_tok = warpgroup_mma(q_smem, k_bufs.index(slot).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)  # fmt: skip
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)  # under S's MMA
        mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
        o_tok = warpgroup_mma(p_op, v_bufs.index(prev), acc, is_async=True)
        # wgmma groups retire in order: one outstanding = S_j done, P V still running
        s = warpgroup_mma_wait(1, deps=[s_tok])
        _release(k_desc, k_bufs, k_ready, k_empty, j, kv_col, n_blocks, WS)
        # the whole softmax inside the branch: ptxas hoists a wgmma wait to the top of its
        # basic block, and P V's wait below must stay after the exp2 work it should overlap
        if j >= n_full:
            p, m_i, l_i, alpha = _softmax(_mask(s, j, m0, s_layout), m_i, l_i, qk_scale)
        else:
            p, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale)
        acc = warpgroup_mma_wait(0, deps=[o_tok, p_op])[0]
        _release(v_desc, v_bufs, v_ready, v_empty, j - 1, kv_col, n_blocks, WS)

    last = n_blocks - 1
    p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
    mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
    o_tok = warpgroup_mma(p_op, v_bufs.index(last % STAGES), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=[o_tok, p_op])[0]

    # epilogue: O / l through this partition's (now idle) Q buffer and one TMA store
    out = acc / gl.expand_dims(gl.convert_layout(l_i, o_rows), 1)
    q_smem.store(out.to(gl.bfloat16))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [m0, q_col], q_smem)
    tma.store_wait(0)


@gluon.jit
def _attention_fwd(q_desc, k_desc, v_desc, o_desc, n_tokens, num_q_heads, group, qk_scale,
                   STAGES: gl.constexpr, WS: gl.constexpr):  # fmt: skip
    SPLIT: gl.constexpr = 2 if WS == 2 else 1  # consumer partitions
    ROWS: gl.constexpr = q_desc.block_type.shape[0]  # query rows a consumer partition
    BLOCK_M: gl.constexpr = ROWS * SPLIT
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    pid = gl.program_id(0)
    # heaviest query tiles first; the heads of one tile (and of one kv head) side by side
    tile = gl.cdiv(n_tokens, BLOCK_M) - 1 - pid // num_q_heads
    head = pid % num_q_heads
    m0 = tile * BLOCK_M
    q_col = head * HEAD_DIM
    kv_col = (head // group) * HEAD_DIM
    # every consumer partition runs all the tile's blocks: the producer waits for each to free
    n_blocks = gl.cdiv(gl.minimum(m0 + BLOCK_M, n_tokens), BLOCK_N)
    n_full = m0 // BLOCK_N  # blocks wholly below the diagonal

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [SPLIT, ROWS, HEAD_DIM], q_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=SPLIT)
        mbarrier.init(v_empty.index(i), count=SPLIT)
    fence_async_shared()  # the inits before any TMA or another partition sees the barriers
    bars = (q_bar, k_ready, v_ready, k_empty, v_empty)
    loads = (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, bars, m0, q_col, kv_col, n_blocks)

    if WS == 2:  # FA3's layout: a producer warp, two consumer warpgroups of 64 rows each
        gl.warp_specialize([
            (_consumer, (k_desc, v_desc, o_desc, q_smem.index(0), k_bufs, v_bufs, bars, m0,
                         q_col, kv_col, n_blocks, n_full, qk_scale, WS)),
            (_consumer, (k_desc, v_desc, o_desc, q_smem.index(1), k_bufs, v_bufs, bars,
                         m0 + ROWS, q_col, kv_col, n_blocks, n_full, qk_scale, WS)),
            (_producer, loads),
        ], [4, 1], [240, 24])  # fmt: skip
    elif WS == 1:
        gl.warp_specialize([
            (_consumer, (k_desc, v_desc, o_desc, q_smem.index(0), k_bufs, v_bufs, bars, m0,
                         q_col, kv_col, n_blocks, n_full, qk_scale, WS)),
            (_producer, loads),
        ], [1], [24])  # fmt: skip
    else:
        # no producer: Q and the first STAGES blocks now, the rest as slots free up
        _load_q(q_desc, q_smem, q_bar, m0, q_col)
        for i in gl.static_range(STAGES):
            _tma_load(k_desc, i * BLOCK_N, kv_col, k_ready.index(i), k_bufs.index(i), i < n_blocks)
            _tma_load(v_desc, i * BLOCK_N, kv_col, v_ready.index(i), v_bufs.index(i), i < n_blocks)
        _consumer(k_desc, v_desc, o_desc, q_smem.index(0), k_bufs, v_bufs, bars, m0, q_col,
                  kv_col, n_blocks, n_full, qk_scale, WS)  # fmt: skip


# ------------------------------------------------------------------------------------ host side
LOG2E = 1.4426950408889634
CHECK_SIZES = (1024, 1000, 8192)  # 1000: a ragged tail (TMA zero fill, clipped store), told apart
DRY = False  # --dry: CPU, tiny sizes, the float32 reference stands in for the kernel


def _descriptors(q, k, v, out, block_m, block_n):
    """2-D views [N, H * D]: a (rows, head) tile is one TMA box [rows, D] at column head * D."""
    n, _, d = q.shape

    def make(x, rows):
        layout = gl.NVMMASharedLayout.get_default_for([rows, d], gl.bfloat16)
        return TensorDescriptor.from_tensor(x.view(n, -1), [rows, d], layout)

    return make(q, block_m), make(k, block_n), make(v, block_n), make(out, block_m)


def _options(block_m, ws) -> dict:
    """num_warps: the default partition's (all consumer rows, or the first 64 with WS 2)."""
    maxnreg = _maxnreg(block_m, ws)
    num_warps = 4 if ws == 2 else block_m // 16
    return {"num_warps": num_warps, **({"maxnreg": maxnreg} if maxnreg else {})}


def gluon_attention(q, k, v, variant) -> torch.Tensor:
    _, block_m, block_n, stages, ws = variant
    n, hq, d = q.shape
    out = torch.empty_like(q)
    grid = (triton.cdiv(n, block_m) * hq,)
    descs = _descriptors(q, k, v, out, block_m // (2 if ws == 2 else 1), block_n)
    scale = d**-0.5 * LOG2E
    _attention_fwd[grid](
        *descs, n, hq, hq // k.shape[1], scale, stages, ws, **_options(block_m, ws)
    )
    return out


def _reference(q, k, v) -> torch.Tensor:
    """float32 SDPA on [H, N, D] (k/v repeated per q head: every backend takes that)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    group = q.shape[1] // k.shape[1]
    qh, kh, vh = (x.transpose(0, 1).float() for x in (q, k, v))
    kh, vh = kh.repeat_interleave(group, 0), vh.repeat_interleave(group, 0)
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):  # not math at 8k
        out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
    return out.transpose(0, 1)


def _inputs(n, heads, dev):
    hq, hkv, d = heads
    g = torch.Generator(device=dev).manual_seed(n + hq)
    return tuple(torch.randn(n, h, d, device=dev, generator=g).bfloat16() for h in (hq, hkv, hkv))


# ------------------------------------------------------------------------- --compile (CPU, sm_90)
def _sass_loop(sass: str) -> dict:
    """The key loop (the smallest loop holding S's wgmma, A from shared memory, and P V's, A from
    registers): instructions in all, on the shortest path through it (an unmasked block) and the
    longest (a diagonal one), and whether P V's wait comes after that path's last exp2."""
    found = re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)
    ins = [(int(a, 16), " ".join(t.split())) for a, t in found]
    at = {a: i for i, (a, _) in enumerate(ins)}

    def target(i):  # "BRA 0x..", or "BRA P2, 0x.." (a branch also taken on a uniform P2)
        m = re.search(r"BRA (?:!?U?P\d, )?(0x[0-9a-f]+)", ins[i][1])
        return at.get(int(m.group(1), 16)) if m else None

    loops = [(target(i), i) for i in range(len(ins)) if target(i) is not None and target(i) < i]
    loops = [(lo, hi) for lo, hi in loops
             if {re.search(r"HGMMA\S* R\d+, (.)", t).group(1)
                 for _, t in ins[lo:hi + 1] if "HGMMA" in t} == {"g", "R"}]  # fmt: skip
    if not loops:
        return {"loop": None}
    lo, hi = min(loops, key=lambda loop: loop[1] - loop[0])
    paths, stack = [], [(lo, [])]
    while stack:  # every path through the body's forward branches (exits: not taken)
        i, path = stack.pop()
        while i < hi:
            path = path + [i]
            j = target(i)
            if j is not None and lo < j <= hi:
                if ins[i][1].startswith("@"):
                    stack.append((i + 1, path))
                i = j
            else:
                i += 1
        paths.append(path + [hi])
    short = [ins[i][1] for i in min(paths, key=len)]
    last_exp2 = max(i for i, t in enumerate(short) if "MUFU.EX2" in t)
    pv_wait = [i for i, t in enumerate(short) if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in t]
    return {"loop": hi - lo + 1, "unmasked_path": len(short),
            "diagonal_path": max(map(len, paths)), "hgmma": sum("HGMMA" in t for t in short),
            "mufu": sum("MUFU" in t for t in short),
            "pv_wait_after_exp2": bool(pv_wait) and min(pv_wait) > last_exp2}  # fmt: skip


def compile_variants() -> int:
    """Compiles every variant for sm_90 (Triton's bundled ptxas), as a launch at 8192 tokens with
    qwen3-0.6b heads would; registers and spills from Triton's bundled cuobjdump."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    failed = 0
    for variant in VARIANTS:
        name, block_m, block_n, stages, ws = variant
        q = torch.empty(8192, 16, 128, dtype=torch.bfloat16)
        descs = _descriptors(q, q[:, :8], q[:, :8], q, block_m // (2 if ws == 2 else 1), block_n)
        signature = {f"{x}_desc": f"tensordesc<bf16{list(t.block_shape)},{t.layout!r}>"
                     for x, t in zip("qkvo", descs)}  # fmt: skip
        signature.update(n_tokens="i32", num_q_heads="i32", group="i32", qk_scale="fp32",
                         STAGES="constexpr", WS="constexpr")  # fmt: skip
        names = list(signature)
        attrs = {(names.index(x),): [["tt.divisibility", 16]] for x in ("n_tokens", "num_q_heads")}
        constexprs = {(names.index("STAGES"),): stages, (names.index("WS"),): ws}
        try:
            t0 = time.time()
            source = GluonASTSource(_attention_fwd, signature, constexprs, attrs)
            target = GPUTarget("cuda", 90, 32)
            compiled = triton.compile(source, target=target, options=_options(block_m, ws))
            seconds = time.time() - t0
            path = f"/tmp/gluon_attention_{name}.cubin"
            with open(path, "wb") as f:
                f.write(compiled.asm["cubin"])
            usage, sass = (
                subprocess.run(
                    [tool, flag, path], capture_output=True, text=True, check=True
                ).stdout
                for flag in ("-res-usage", "-sass")
            )
            spills = int(re.search(r"LOCAL:(\d+)", usage).group(1))  # spill slots live there
            setmaxnreg = re.findall(
                r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", compiled.asm["ptx"]
            )
            row = {"regs": int(re.search(r"REG:(\d+)", usage).group(1)),
                   "highest_reg": max(int(r) for r in re.findall(r"\bR(\d+)\b", sass)),
                   "setmaxnreg": sorted(set(map(int, setmaxnreg))), "spill_bytes": spills,
                   "shared_bytes": compiled.metadata.shared, "compile_s": round(seconds, 1),
                   **_sass_loop(sass)}  # fmt: skip
            failed += spills > 0
        except Exception as exc:  # noqa: BLE001 - report every variant, then fail
            row = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
            failed += 1
        print(f"{name}: {row}", flush=True)
    return 1 if failed else 0


# -------------------------------------------------------------- GPU checks, in child processes
def _device() -> torch.device:
    if DRY:
        return torch.device("cpu")
    # no kernel here asks for a scratch allocation; one that does must not fail for want of it
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))  # fmt: skip
    torch.zeros(1, device="cuda")  # the context now: not inside a variant's check timeout
    return torch.device("cuda")


def _run(q, k, v, variant):
    if DRY:
        return _reference(q, k, v).bfloat16()
    out = gluon_attention(q, k, v, variant)
    torch.cuda.synchronize()
    return out


def _check_variant(variant, lengths, dev, refs) -> dict:
    """Errors against float32 SDPA; each timed length run once more (a hang shows up here)."""
    errors, ragged = {}, {}
    for layout, heads in LAYOUTS.items():
        for n in CHECK_SIZES:
            q, k, v = _inputs(n, heads, dev)
            if (layout, n) not in refs:
                refs[(layout, n)] = _reference(q, k, v)
            err = (_run(q, k, v, variant).float() - refs[(layout, n)]).abs().max().item()
            (errors if n % 128 == 0 else ragged)[f"{layout} {n}"] = err
        for n in set(lengths) - set(CHECK_SIZES):
            finite = _run(*_inputs(n, heads, dev), variant).isfinite().all().item()
            errors[f"{layout} {n} finite"] = 0.0 if finite else float("nan")
    bad = [key for key, err in errors.items() if not err <= TOLERANCE]  # NaN fails too
    return {"status": "failed" if bad else "passed", "errors": errors, "ragged": ragged}


def child(names, lengths, hang) -> None:
    """Checks the named variants in turn: ``START name`` before each, ``RESULT {json}`` after;
    stops after a Python error (a CUDA fault poisons the context: the parent starts anew)."""
    dev, refs = _device(), {}
    print("READY", flush=True)
    for name in names:
        print(f"START {name}", flush=True)
        if name == hang:
            time.sleep(3600)  # --simulate-hang: what a barrier-phase bug looks like
        t0 = time.time()
        try:
            variant = next(v for v in VARIANTS if v[0] == name)
            result = _check_variant(variant, lengths, dev, refs)
        except Exception as exc:  # noqa: BLE001 - a compile error, a fault
            result = {"status": "error", "error": f"{type(exc).__name__}: {str(exc)[:1500]}"}
        result.update(name=name, check_s=round(time.time() - t0, 1))
        print("RESULT " + json.dumps(result), flush=True)
        if result["status"] == "error":
            return


def check_in_children(names, args) -> dict:
    """Each variant's first launches in a child process with a timeout: a hung, faulting or
    failing variant is recorded, the next child goes on with the rest; all within the budget."""
    results, pending = {}, list(names)
    deadline = time.time() + args.check_budget
    while pending:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", ",".join(pending),
               "--lengths", args.lengths] + (["--dry"] if DRY else [])  # fmt: skip
        cmd += ["--simulate-hang", args.simulate_hang] if args.simulate_hang else []
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines: queue.Queue = queue.Queue()

        def pump(proc=proc, lines=lines):
            for line in proc.stdout:
                lines.put(line.rstrip("\n"))
            lines.put(None)  # the child exited

        threading.Thread(target=pump, daemon=True).start()
        current, since, log, started = None, time.time(), [], False
        while True:
            limit = args.variant_timeout if current else args.start_timeout
            try:
                line = lines.get(timeout=max(min(since + limit, deadline) - time.time(), 0.01))
            except queue.Empty:
                proc.kill()  # the child this loop started, by its handle
                line = "TIMEOUT"
            if line is None or line == "TIMEOUT":
                rc = proc.wait()
                if time.time() >= deadline:
                    lost, status = list(pending), "time budget"
                elif current:
                    lost, status = [current], "hung" if line else "crashed"
                else:  # stopped after a variant's error: go on; died at start: give up
                    lost, status = ([], "") if started else (list(pending), "child failed")
                for name in lost:
                    results[name] = {"status": status, "rc": rc, "log": "\n".join(log[-8:])}
                    pending.remove(name)
                    print(f"check {name}: {status} (rc {rc})", flush=True)
                break
            if line.startswith("START "):
                current, since, log, started = line[6:], time.time(), [], True
            elif line.startswith("RESULT "):
                result = json.loads(line[7:])
                name = result.pop("name")
                results[name] = result
                pending.remove(name)
                current, since = None, time.time()
                print(f"check {name}: {result}", flush=True)
            elif line == "READY":
                since = time.time()
            else:
                log.append(line)
    return results


# ------------------------------------------------------------------------------------- timing
def _time_ms(fn, rep_ms) -> float:
    """Median of >= 20 launches (CUDA events; L2 flushed before each, as do_bench does)."""
    if DRY:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return sorted(times)[1]
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):  # warm-up, and a rough cost for the launch count
        fn()
    torch.cuda.synchronize()
    n = max(20, min(500, int(rep_ms / max((time.perf_counter() - t0) / 3 * 1e3, 1e-3))))
    events = [[torch.cuda.Event(enable_timing=True) for _ in range(2)] for _ in range(n)]
    for start, end in events:
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return sorted(start.elapsed_time(end) for start, end in events)[n // 2]


def _tl_prototype():
    """docs/wip/extend_contiguous_proto.py by path, in its best stop-38 tiles (128 rows, TMA)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "extend_contiguous_proto.py")
    spec = importlib.util.spec_from_file_location("extend_contiguous_proto", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def run(q, k, v):
        group_pad = triton.next_power_of_2(q.shape[1] // k.shape[1])
        return module.extend_contiguous(q, k, v, 128 // group_pad, 128, 8, 3, True)

    return run


def _sdpa_arms(q, k, v):
    """(label, fn or None, info) per SDPA backend on [1, H, N, D] (contiguous): enable_gqa, else
    k/v repeated per q head outside the timed call, else unsupported."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qh, kh, vh = (x.transpose(0, 1).unsqueeze(0).contiguous() for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    tries = [("enable_gqa", kh, vh, True),
             ("repeat_interleave", kh.repeat_interleave(group, 1), vh.repeat_interleave(group, 1),
              False)]  # fmt: skip
    for backend in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"):
        errors = []
        for how, kk, vv, gqa in tries:

            def fn(kk=kk, vv=vv, gqa=gqa, backend=backend):
                with sdpa_kernel(getattr(SDPBackend, backend)):
                    f = torch.nn.functional.scaled_dot_product_attention
                    return f(qh, kk, vv, is_causal=True, enable_gqa=gqa)

            try:
                fn()
                yield f"sdpa_{backend.lower()}", fn, {"gqa": how}
                break
            except RuntimeError as exc:
                errors.append(f"{how}: {str(exc).splitlines()[0][:160]}")
        else:
            yield f"sdpa_{backend.lower()}", None, {"unsupported": errors}


def measure(length, layout, heads, passing, tl_run, args, dev) -> dict:
    q, k, v = _inputs(length, heads, dev)
    flops = 4 * length * length * heads[0] * heads[2] / 2
    arms = {}

    def arm(label, fn, info):
        try:
            if fn is not None:
                ms = _time_ms(fn, args.rep_ms)
                info = {"ms": round(ms, 4), "tflops": round(flops / ms / 1e9, 1), **info}
        except Exception as exc:  # noqa: BLE001 - an arm that cannot run is recorded
            info = {"error": f"{type(exc).__name__}: {str(exc)[:200]}", **info}
        arms[label] = info
        print(f"{length} {layout} {label}: {info}", flush=True)

    for variant in passing:
        arm(variant[0], lambda variant=variant: _run(q, k, v, variant), {})
    if tl_run is not None:
        info = {}
        try:
            if length <= 8192:  # its error too, as a check on the harness
                info["err"] = (tl_run(q, k, v).float() - _reference(q, k, v)).abs().max().item()
            arm("tl_proto", lambda: tl_run(q, k, v), info)
        except Exception as exc:  # noqa: BLE001
            arm("tl_proto", None, {"error": f"{type(exc).__name__}: {str(exc)[:200]}"})
    for label, fn, info in _sdpa_arms(q, k, v):
        arm(label, fn, info)
    return {"length": length, "layout": layout, "arms": arms}


def main() -> int:
    global DRY, CHECK_SIZES
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compile", action="store_true", help="CPU: compile every variant, sm_90")
    ap.add_argument("--dry", action="store_true", help="CPU: the harness with the GPU stubbed")
    ap.add_argument("--out", help="JSON results")
    ap.add_argument("--lengths", default="8192,32768")
    ap.add_argument("--variants", help="comma-separated subset of the variant names")
    ap.add_argument("--rep-ms", type=int, default=100, help="timed launches' span (>= 20 runs)")
    ap.add_argument("--variant-timeout", type=float, default=30.0, help="s for one check")
    ap.add_argument("--start-timeout", type=float, default=60.0, help="s for a child's imports")
    ap.add_argument("--check-budget", type=float, default=130.0, help="s for all checks")
    ap.add_argument("--simulate-hang", help="with --dry: this variant's check hangs")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.compile:
        return compile_variants()
    DRY = args.dry
    if DRY:
        args.lengths, CHECK_SIZES = "256", (128, 100)
    lengths = [int(x) for x in args.lengths.split(",")]
    if args.child:
        child(args.child.split(","), lengths, args.simulate_hang if DRY else None)
        return 0
    t0 = time.time()
    names = args.variants.split(",") if args.variants else [v[0] for v in VARIANTS]
    checks = check_in_children(names, args)
    passing = [v for v in VARIANTS if checks.get(v[0], {}).get("status") == "passed"]
    print(f"checks: {time.time() - t0:.0f} s, passing {[v[0] for v in passing]}", flush=True)
    dev = _device()
    try:
        tl_run = _tl_prototype()
    except Exception as exc:  # noqa: BLE001 - the arm is skipped, and said so
        print(f"tl prototype not importable, its arm skipped: {exc}", flush=True)
        tl_run = None
    env = {"device": "cpu (dry)" if DRY else torch.cuda.get_device_name(),
           "triton": triton.__version__, "torch": torch.__version__,
           "commit": os.environ.get("NANOGRAPH_COMMIT"), "tolerance": TOLERANCE}  # fmt: skip
    results = []

    def save():  # after every row: a run cut short still leaves what it measured
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"env": env, "variants": VARIANTS, "checks": checks, "results": results},
                          f, indent=1)  # fmt: skip

    save()
    for length in lengths:
        for layout, heads in LAYOUTS.items():
            results.append(measure(length, layout, heads, passing, tl_run, args, dev))
            save()
            if not DRY:
                torch.cuda.empty_cache()
    print(f"{'length':>6} {'layout':<11} {'arm':<26} {'ms':>8} {'TFLOP/s':>8}")
    for row in results:
        for label, arm in row["arms"].items():
            ms, tflops = arm.get("ms", "-"), arm.get("tflops", "-")
            print(f"{row['length']:>6} {row['layout']:<11} {label:<26} {ms:>8} {tflops:>8}")
    print(f"total {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
