"""Prototype (issue 18): FA3-style varlen extend attention for Hopper in Gluon, paged prefix.

What: ``gluon_attention_proto.py``'s kernel (TMA ring, 1-warp producer partition, consumer
warpgroups in their own partitions, async wgmma with the softmax under the previous block's
P V) behind the engine's extend interface, ``paged_attention(..., new_kv=(k_rows, v_rows))``:
- varlen batches: q rows ``[T, Hq, D]`` of R requests concatenated (``query_start_loc`` int32
  [R + 1], ``seq_lens`` [R] = cached prefix + new tokens, ``query_lens`` [R]);
- a cached prefix per request in the paged cache ``k_cache``/``v_cache [pages * 16, Hkv, D]``
  (slot = page * 16 + offset, ``page_table`` int32 [R, max_pages]), every prefix key seen by
  every new token; the new keys from this forward's rows ``new_kv`` [T, Hkv, D], causal;
- graph safe: the grid is ``(T // BLOCK_M + R) * Hq`` (static sizes only); each program finds
  its (request, q block) by a binary search over ``query_start_loc`` (the engine's
  ``_find_request``: request r's blocks start at ``query_start_loc[r] // BLOCK_M + r``) and
  exits when it has no tile; no host reads of lengths. Rows of sentinel slots (query_len 0)
  and padding rows are not written.

Why: issue 18's aim, qwen3-0.6b's 8192-token prefill in <= 30 ms (now 33.1 ms), attention ~16
ms of it. The single-sequence prototype ran 1 x 8192 with qwen3-8b heads at 549 TFLOP/s (1.002
ms; 0.564 ms with 0.6b heads), 1 x 32k at 596, ahead of the engine's plain-Triton kernel (~490)
and within 3-5% of cuDNN, on an H100; it cannot serve the engine without this interface.

How (per program: one tile of BLOCK_M query rows of one request x one q head):
- Key blocks in one sequence: the prefix's cdiv(P, BLOCK_N) blocks (P = seq_len - query_len),
  then the new keys' blocks, counted from the request's first new token, up to the tile's
  diagonal. The producer warp issues every load into the K and V rings (ready/empty mbarriers
  as in the single-sequence prototype); the consumers do not know where a block came from,
  only whether it is masked (the prefix's last block when P % BLOCK_N != 0: keys >= P out; a
  new block on the diagonal: causal), one masked arm for both.
- New keys by TMA from a 2-D descriptor over the rows [T, Hkv * D] (box [BLOCK_N, D]); a box
  may run into the next request's rows (finite values: masked by the causal mask, since every
  row of a request is below it) or past T (zero fill). Q likewise ([T, Hq * D], box [64 or
  128, D]); the output by TMA when a partition's 64 (128) rows all belong to the request, else
  by a masked pointer store (a box would write the next request's rows).
- Prefix keys by TMA per page: Hopper has no TMA gather, and a page is 16 rows; a
  descriptor over the cache viewed [pages * 16, Hkv * D] with box [16, D] loads BLOCK_N / 16
  pages of a block into row slices of the ring slot, all on the slot's one mbarrier (expect-tx
  of the whole block). Why TMA per page and not pointer loads (cp.async) into shared memory:
  it keeps the producer a single warp of 24 registers and the consumers unchanged (same
  swizzled buffers, same barriers, no extra warps or register budget for address math), and
  a 4 KB (D = 128, bf16) box per page is well above the size where TMA's per-message cost
  matters. The --compile PTX check: a [16, 128] slice of a [128, 128] buffer gets, per 64-column
  half, a box at +2048 bytes per page (the half's row-slice of the 128-byte-swizzled layout).
  Page-table entries past the prefix's last page are not read: the last prefix page is
  loaded again instead (keys masked; its values must be finite: the engine's pages are).
- Three variants: ws2 (FA3's layout, two free-running consumer warpgroups of 64 rows), ws (one
  consumer partition of 8 warps), ws2 with 64-key blocks and 3 stages.

Run (Triton 3.6 at /tmp/t36 on the CPU side):
    PYTHONPATH=/tmp/t36:. python3 docs/wip/gluon_extend_proto.py --compile  # CPU, sm_90
        (registers, spills: 0 required, shared memory, the page-slice PTX check; rc 1 on failure)
    PYTHONPATH=. python3 docs/wip/gluon_extend_proto.py --dry --out /tmp/dry.json  # CPU, harness
    PYTHONPATH=. python3 docs/wip/gluon_extend_proto.py --out OUT.json  # GPU (H100/H200), ~3 min

GPU mode: each variant's checks in a child process with a timeout (a barrier-phase hang or a
fault is recorded and the rest go on), against a float32 torch reference (per request: prefix
keys gathered from the pages + the new keys, causal on the new part, GQA), both head layouts,
cases (a) 1 x 8192 new, (b) 4 x 2048 new, (c) prefix 4096 + 4096 new, (d) prefixes
(0, 16, 100, 1000, 3000), new (1, 17, 300, 1024, 2000) and 2 sentinel slots (rows outside the
requests must keep a marker), (e) a CUDA graph captured on (d)'s buffers (8192 + 128 token rows,
7 slots) and replayed with (b)'s lengths written into them. Then the passing variants, the
engine's ``paged_attention(new_kv=...)`` (its error checked too) and SDPA cuDNN (a, b, dense)
timed (CUDA events, median of >= 20, L2 flushed), printed and written to --out.

PREDICTION, case (a) (1 x 8192, no prefix) against the single-sequence ws2 (0.564 ms 0.6b heads,
1.002 ms 8b heads, H100): ~0.58 ms and ~1.03 ms (+2-4%; range 0.56-0.62 / 0.99-1.08). Why: the
main loop is the same code (the block's source is the producer's business; the mask test has
one more compare), so the steady state is unchanged. The costs: the tile search (a binary
search over query_start_loc, 1 step at R = 1) and the scalar loads of the lengths before the
first TMA, ~1-2 us a tile on its critical path (1024 tiles / 132 SMs ~ 8 waves: ~10-15 us); the
grid has (T // 128 + R) * Hq programs, 1 x Hq more than needed, that exit at once; and tiles no
longer ordered heaviest-first strictly by tile (the reversed flat order is the same for R = 1).
(b) should be ~4x cheaper in FLOPs than (a) and land at ~0.16 / 0.28 ms (short sequences: a
shorter key loop per tile, so the per-tile start is a larger share). (c) the prefix blocks load
8 pages each through the single producer warp: if the producer keeps up (8 TMA issues + 8
scalar page loads a block vs ~1 us of MMA a block), the rate matches (a)'s; if the dependent
page-id loads stall it, the prefix blocks run ~10-20% slower. The key loop's paths (--compile,
gluon_attention_proto.py's analysis): 459 instructions on the unmasked path, 829 on the masked
one, against that prototype's 456 / 816 (ptxas branches to the unmasked arm with a
`@P1 BRA P2, target` the analysis first did not parse, reading 829 on both paths).
"""

from __future__ import annotations

import argparse
import json
import math
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

# (name, BLOCK_M, BLOCK_N, STAGES, WS). WS 1: a producer warp and one consumer partition of
# BLOCK_M // 16 warps; 2: a producer warp and two consumer partitions of 64 rows (4 warps) each.
VARIANTS = [
    ("ws2_m128_n128_s2", 128, 128, 2, 2),  # the single-sequence prototype's best
    ("ws_m128_n128_s2", 128, 128, 2, 1),
    ("ws2_m128_n64_s3", 128, 64, 3, 2),
]
LAYOUTS = {"qwen3-0.6b": (16, 8, 128), "qwen3-8b": (32, 8, 128)}
PAGE_SIZE = 16
TOLERANCE = 2e-2  # max abs error against the float32 reference (bf16 out)
MARKER = 7.0  # out's value before a launch: rows outside the requests must keep it
LOG2E = 1.4426950408889634
DRY = False  # --dry: CPU, tiny sizes, the float32 reference stands in for the kernels

# cases: (prefix lengths, new lengths, sentinel slots, token rows of the buffers or None)
CASES = {
    "a": ([0], [8192], 0, None),
    "b": ([0] * 4, [2048] * 4, 0, None),
    "c": ([4096], [4096], 0, None),
    "d": ([0, 16, 100, 1000, 3000], [1, 17, 300, 1024, 2000], 2, 8192 + 128),
}
DRY_CASES = {  # the same shapes of batch, small
    "a": ([0], [256], 0, None),
    "b": ([0] * 4, [64] * 4, 0, None),
    "c": ([128], [128], 0, None),
    "d": ([0, 16, 33, 100, 64], [1, 17, 30, 64, 100], 2, 256 + 128),
}


def _maxnreg(block_m: int) -> int:
    """The launch register cap (128 rows: 8 consumer warps + a producer warpgroup, 1 CTA an SM:
    65536 / 384 -> 168; setmaxnreg then gives the consumers 240, the producer 24)."""
    return 168 if block_m == 128 else 128


# ---------------------------------------------------------------------------------- the kernel
@gluon.jit
def _tma_load(desc, row, col, bar, buf):
    mbarrier.expect(bar, desc.block_type.nbytes)
    tma.async_copy_global_to_shared(desc, [row, col], bar, buf)


@gluon.jit
def _page_loads(cache_desc, page_row_ptr, block, last_page, col, bar, buf):
    """Prefix block ``block``: its BLOCK_N / PAGE rows, one TMA box a page, on one barrier.
    Pages past the prefix's last are not looked up: the last one is loaded again (masked)."""
    PAGE: gl.constexpr = cache_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = buf.shape[0]
    PAGES: gl.constexpr = BLOCK_N // PAGE
    mbarrier.expect(bar, PAGES * cache_desc.block_type.nbytes)
    for i in gl.static_range(PAGES):
        page = gl.load(page_row_ptr + gl.minimum(block * PAGES + i, last_page))
        tma.async_copy_global_to_shared(cache_desc, [page * PAGE, col], bar,
                                        buf.slice(i * PAGE, PAGE))  # fmt: skip


@gluon.jit
def _producer(q_desc, k_desc, v_desc, kc_desc, vc_desc, q_smem, k_bufs, v_bufs, bars, q_row,
              new_row0, q_col, kv_col, page_row_ptr, prefix_len, n_prefix, n_blocks):  # fmt: skip
    """The load partition (one warp): Q (rows from q_row), then block j's K and V as their ring
    slots free up, from the pages (j < n_prefix) or from the new rows (the request's first new
    token's row is new_row0)."""
    q_bar, k_ready, v_ready, k_empty, v_empty = bars
    STAGES: gl.constexpr = k_bufs.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.shape[1]
    PAGE: gl.constexpr = kc_desc.block_type.shape[0]
    SPLIT: gl.constexpr = q_smem.shape[0]
    ROWS: gl.constexpr = q_smem.shape[1]
    mbarrier.expect(q_bar, SPLIT * q_desc.block_type.nbytes)
    for i in gl.static_range(SPLIT):
        tma.async_copy_global_to_shared(q_desc, [q_row + i * ROWS, q_col], q_bar, q_smem.index(i))
    last_page = gl.cdiv(prefix_len, PAGE) - 1
    for j in range(n_blocks):
        slot = j % STAGES
        # a fresh mbarrier counts as having completed the phase before 0: the first lap of the
        # ring waits on parity 1 and passes at once
        free_phase = ((j // STAGES) & 1) ^ 1
        mbarrier.wait(k_empty.index(slot), free_phase)
        if j < n_prefix:
            _page_loads(kc_desc, page_row_ptr, j, last_page, kv_col, k_ready.index(slot),
                        k_bufs.index(slot))  # fmt: skip
        else:
            _tma_load(k_desc, new_row0 + (j - n_prefix) * BLOCK_N, kv_col, k_ready.index(slot),
                      k_bufs.index(slot))  # fmt: skip
        mbarrier.wait(v_empty.index(slot), free_phase)
        if j < n_prefix:
            _page_loads(vc_desc, page_row_ptr, j, last_page, kv_col, v_ready.index(slot),
                        v_bufs.index(slot))  # fmt: skip
        else:
            _tma_load(v_desc, new_row0 + (j - n_prefix) * BLOCK_N, kv_col, v_ready.index(slot),
                      v_bufs.index(slot))  # fmt: skip


@gluon.jit
def _mask(s, j, n_prefix, prefix_len, m0, s_layout: gl.constexpr):
    """Prefix block: keys >= prefix_len out (every row alike); new block: causal, counted from
    the request's first new token (row m0 + r sees keys <= m0 + r)."""
    ROWS: gl.constexpr = s.shape[0]
    BLOCK_N: gl.constexpr = s.shape[1]
    rows = m0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
    in_prefix = j < n_prefix
    key0 = gl.where(in_prefix, j, j - n_prefix) * BLOCK_N
    keys = key0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    # limit a row's keys stay under: prefix_len (prefix), its own index + 1 (new)
    slope = gl.where(in_prefix, 0, 1)
    offset = gl.where(in_prefix, prefix_len, 1)
    limit = rows * slope + offset
    return gl.where(gl.expand_dims(keys, 0) < gl.expand_dims(limit, 1), s, -float("inf"))


@gluon.jit
def _softmax(s, m_i, l_i, qk_scale):
    """Online softmax of one S block (raw scores; the scale is folded into exp2's FFMA)."""
    # block 0 holds key 0 (of the prefix, or the first new one), which every row sees: m_new is
    # finite from the first block on
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    m_scaled = m_new * qk_scale
    alpha = gl.exp2(m_i * qk_scale - m_scaled)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_scaled, 1))
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, m_new, l_i, alpha


@gluon.jit
def _consumer(o_desc, out_ptr, stride_o, q_smem, k_bufs, v_bufs, bars, q_start, m0, q_len,
              q_col, prefix_len, n_prefix, n_blocks, qk_scale):  # fmt: skip
    """Rows m0 .. m0 + ROWS of the request (this partition's) against the tile's key blocks."""
    q_bar, k_ready, v_ready, k_empty, v_empty = bars
    ROWS: gl.constexpr = q_smem.shape[0]
    HEAD_DIM: gl.constexpr = q_smem.shape[1]
    STAGES: gl.constexpr = k_bufs.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.shape[1]
    WARPS: gl.constexpr = gl.num_warps()
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                       instr_shape=[16, BLOCK_N, 16])  # fmt: skip
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])  # fmt: skip
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    # new blocks wholly below this partition's diagonal; the prefix's last block is partial
    # when the prefix does not end on a block boundary
    n_full = (m0 + 1) // BLOCK_N
    partial_last = n_prefix * BLOCK_N != prefix_len

    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_ready.index(0), 0)
    s_tok = warpgroup_mma(q_smem, k_bufs.index(0).permute((1, 0)), s_zero, use_acc=False,
                          is_async=True)  # fmt: skip
    s = warpgroup_mma_wait(0, deps=[s_tok])
    mbarrier.arrive(k_empty.index(0))
    m_i = gl.full([ROWS], -float("inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([ROWS], gl.float32, gl.SliceLayout(1, s_layout))
    if (n_prefix + n_full == 0) | (partial_last & (n_prefix == 1)):
        s = _mask(s, 0, n_prefix, prefix_len, m0, s_layout)
    p, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale)
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)

    # as in gluon_attention_proto.py: P crosses the loop edge in float32 and becomes P V's
    # operand at the top of the next iteration; the softmax inside both arms of the branch
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
        s = warpgroup_mma_wait(1, deps=[s_tok])
        mbarrier.arrive(k_empty.index(slot))
        if (j >= n_prefix + n_full) | (partial_last & (j == n_prefix - 1)):
            p, m_i, l_i, alpha = _softmax(_mask(s, j, n_prefix, prefix_len, m0, s_layout), m_i,
                                          l_i, qk_scale)  # fmt: skip
        else:
            p, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale)
        acc = warpgroup_mma_wait(0, deps=[o_tok, p_op])[0]
        mbarrier.arrive(v_empty.index(prev))

    last = n_blocks - 1
    p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
    mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
    o_tok = warpgroup_mma(p_op, v_bufs.index(last % STAGES), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=[o_tok, p_op])[0]
    # (the last V slot is not released: the producer issues nothing after it)

    out = (acc / gl.expand_dims(gl.convert_layout(l_i, o_rows), 1)).to(gl.bfloat16)
    if m0 + ROWS <= q_len:  # all rows the request's: one TMA box through the idle Q buffer
        q_smem.store(out)
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [q_start + m0, q_col], q_smem)
        tma.store_wait(0)
    else:  # the request's last rows: a box would write the next request's rows
        rows = m0 + gl.arange(0, ROWS, layout=o_rows)
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        offs = gl.expand_dims((q_start + rows).to(gl.int64) * stride_o, 1)
        offs = offs + gl.expand_dims(q_col + cols, 0)
        mask = (gl.expand_dims(rows, 1) < q_len) & (gl.expand_dims(cols, 0) < HEAD_DIM)
        gl.store(out_ptr + offs, out, mask=mask)


@gluon.jit(do_not_specialize=["num_seqs", "stride_pt"])
def _extend_fwd(q_desc, k_desc, v_desc, kc_desc, vc_desc, o_desc, out_ptr, page_table_ptr,
                seq_lens_ptr, query_lens_ptr, query_start_loc_ptr, num_seqs, stride_pt, stride_o,
                num_q_heads, group, qk_scale, STAGES: gl.constexpr, WS: gl.constexpr):  # fmt: skip
    SPLIT: gl.constexpr = 2 if WS == 2 else 1  # consumer partitions
    ROWS: gl.constexpr = q_desc.block_type.shape[0]  # query rows a consumer partition
    BLOCK_M: gl.constexpr = ROWS * SPLIT
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    pid = gl.program_id(0)
    head = pid % num_q_heads
    # reversed: a request's last tiles (the most keys) first; the heads of a tile side by side
    tile = gl.num_programs(0) // num_q_heads - 1 - pid // num_q_heads
    # the request: the last r with query_start_loc[r] // BLOCK_M + r <= tile (its tiles start
    # there: each request has at most one partial tile, hence the + r)
    lo = num_seqs * 0
    hi = num_seqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        start = gl.load(query_start_loc_ptr + mid) // BLOCK_M + mid
        lo = gl.where(start <= tile, mid, lo)
        hi = gl.where(start <= tile, hi, mid - 1)
    seq = lo
    q_start = gl.load(query_start_loc_ptr + seq)
    q_block = tile - (q_start // BLOCK_M + seq)
    q_len = gl.load(query_lens_ptr + seq)
    m0 = q_block * BLOCK_M
    if m0 >= q_len:
        return  # a sentinel slot, or a spare program of the static grid
    prefix_len = gl.load(seq_lens_ptr + seq) - q_len
    q_col = head * HEAD_DIM
    kv_col = (head // group) * HEAD_DIM
    n_prefix = gl.cdiv(prefix_len, BLOCK_N)
    n_blocks = n_prefix + gl.cdiv(gl.minimum(m0 + BLOCK_M, q_len), BLOCK_N)
    page_row_ptr = page_table_ptr + seq.to(gl.int64) * stride_pt

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
    loads = (q_desc, k_desc, v_desc, kc_desc, vc_desc, q_smem, k_bufs, v_bufs, bars,
             q_start + m0, q_start, q_col, kv_col, page_row_ptr, prefix_len, n_prefix,
             n_blocks)  # fmt: skip

    if WS == 2:  # FA3's layout: a producer warp, two consumer warpgroups of 64 rows each
        gl.warp_specialize([
            (_consumer, (o_desc, out_ptr, stride_o, q_smem.index(0), k_bufs, v_bufs, bars,
                         q_start, m0, q_len, q_col, prefix_len, n_prefix, n_blocks, qk_scale)),
            (_consumer, (o_desc, out_ptr, stride_o, q_smem.index(1), k_bufs, v_bufs, bars,
                         q_start, m0 + ROWS, q_len, q_col, prefix_len, n_prefix, n_blocks,
                         qk_scale)),
            (_producer, loads),
        ], [4, 1], [240, 24])  # fmt: skip
    else:
        gl.warp_specialize([
            (_consumer, (o_desc, out_ptr, stride_o, q_smem.index(0), k_bufs, v_bufs, bars,
                         q_start, m0, q_len, q_col, prefix_len, n_prefix, n_blocks, qk_scale)),
            (_producer, loads),
        ], [1], [24])  # fmt: skip


# ------------------------------------------------------------------------------------ host side
def _rows_desc(x: torch.Tensor, rows: int) -> TensorDescriptor:
    """Rows [N, H, D] as a 2-D TMA tensor [N, H * D] in [rows, D] boxes (past N: zero fill)."""
    n, _, d = x.shape
    layout = gl.NVMMASharedLayout.get_default_for([rows, d], gl.bfloat16)
    return TensorDescriptor.from_tensor(x.view(n, -1), [rows, d], layout)


def _descriptors(q, k_new, v_new, k_cache, v_cache, out, variant):
    _, block_m, block_n, _, ws = variant
    rows = block_m // (2 if ws == 2 else 1)
    return (_rows_desc(q, rows), _rows_desc(k_new, block_n), _rows_desc(v_new, block_n),
            _rows_desc(k_cache, PAGE_SIZE), _rows_desc(v_cache, PAGE_SIZE),
            _rows_desc(out, rows))  # fmt: skip


def _options(variant) -> dict:
    """num_warps: the default partition's (all consumer rows, or the first 64 with WS 2)."""
    _, block_m, _, _, ws = variant
    return {"num_warps": 4 if ws == 2 else block_m // 16, "maxnreg": _maxnreg(block_m)}


def gluon_extend(q, k_new, v_new, k_cache, v_cache, page_table, seq_lens, query_lens,
                 query_start_loc, out, variant) -> torch.Tensor:  # fmt: skip
    """The engine's extend with ``new_kv``: writes the requests' rows of ``out`` [T, Hq, D]
    (others untouched). The grid depends on T, R and Hq only (graph safe)."""
    _, block_m, _, stages, ws = variant
    n, hq, d = q.shape
    for x in (q, k_new, v_new, k_cache, v_cache, out):
        assert x.is_contiguous() and x.dtype == torch.bfloat16
    assert page_table.stride(-1) == 1 and d == 128
    num_seqs = seq_lens.shape[0]
    grid = ((n // block_m + num_seqs) * hq,)
    descs = _descriptors(q, k_new, v_new, k_cache, v_cache, out, variant)
    _extend_fwd[grid](
        *descs, out, page_table, seq_lens, query_lens, query_start_loc, num_seqs,
        page_table.stride(0), out.stride(0), hq, hq // k_new.shape[1], d**-0.5 * LOG2E,
        stages, ws, **_options(variant),
    )  # fmt: skip
    return out


# ------------------------------------------------------------------------- --compile (CPU, sm_90)
def _sass_loop(sass: str) -> dict:
    """gluon_attention_proto.py's analysis of the key loop (by path): instructions on the
    unmasked and the masked path, HGMMA and MUFU counts, P V's wait after the last exp2."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gluon_attention_proto.py")
    try:
        spec = importlib.util.spec_from_file_location("gluon_attention_proto", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module._sass_loop(sass)
    except Exception as exc:  # noqa: BLE001 - an analysis, not a check
        return {"loop": f"not analysed: {type(exc).__name__}: {str(exc)[:100]}"}


@gluon.jit
def _page_slice_probe(c_desc, o_desc, page_ptr):
    buf = gl.allocate_shared_memory(gl.bfloat16, [128, 128], o_desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    fence_async_shared()
    _page_loads(c_desc, page_ptr, 0, 7, 0, bar, buf)
    mbarrier.wait(bar, 0)
    tma.async_copy_shared_to_global(o_desc, [0, 0], buf)
    tma.store_wait(0)


def _check_page_slices() -> int:
    """The prefix path's addressing, in PTX: 8 page boxes [16, 128] into the row slices of a
    [128, 128] buffer (128-byte swizzle: two 64-column halves of 16 KB) must land at +2048 bytes
    a page. Returns 1 on a mismatch."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    layout = gl.NVMMASharedLayout.get_default_for([128, 128], gl.bfloat16)
    signature = {
        "c_desc": f"tensordesc<bf16[16, 128],{layout!r}>",
        "o_desc": f"tensordesc<bf16[128, 128],{layout!r}>",
        "page_ptr": "*i32",
    }
    source = GluonASTSource(_page_slice_probe, signature, {}, {})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    ptx = compiled.asm["ptx"]
    loads = re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\S* \[%r(\d+)\]", ptx)
    offsets = []
    for reg in loads[1:]:
        m = re.search(rf"add\.s32\s+%r{reg}, %r\d+, (\d+);", ptx)
        offsets.append(int(m.group(1)) if m else None)
    ok = len(loads) == 8 and offsets == [2048 * i for i in range(1, 8)]
    print(f"page slices: {len(loads)} TMA boxes, byte offsets {offsets}: "
          f"{'ok' if ok else 'UNEXPECTED'}", flush=True)  # fmt: skip
    return 0 if ok else 1


def compile_variants() -> int:
    """Compiles every variant for sm_90 (Triton's bundled ptxas) as a launch of 8192 + 128 token
    rows, 7 request slots, qwen3-0.6b heads would; registers, spills and the SASS size from
    Triton's bundled cuobjdump, shared memory from the metadata; the PTX of the page loads
    (destination offsets of the row slices) checked."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    failed = _check_page_slices()
    for variant in VARIANTS:
        name, block_m, block_n, stages, ws = variant
        q = torch.empty(8192 + 128, 16, 128, dtype=torch.bfloat16)
        cache = torch.empty(1024 * PAGE_SIZE, 8, 128, dtype=torch.bfloat16)
        descs = _descriptors(q, q[:, :8], q[:, :8], cache, cache, q, variant)
        signature = {f"{x}_desc": f"tensordesc<bf16{list(t.block_shape)},{t.layout!r}>"
                     for x, t in zip(("q", "k", "v", "kc", "vc", "o"), descs)}  # fmt: skip
        signature.update(out_ptr="*bf16", page_table_ptr="*i32", seq_lens_ptr="*i32",
                         query_lens_ptr="*i32", query_start_loc_ptr="*i32", num_seqs="i32",
                         stride_pt="i32", stride_o="i32", num_q_heads="i32", group="i32",
                         qk_scale="fp32", STAGES="constexpr", WS="constexpr")  # fmt: skip
        names = list(signature)
        aligned = ("out_ptr", "page_table_ptr", "seq_lens_ptr", "query_lens_ptr",
                   "query_start_loc_ptr", "stride_o", "num_q_heads")  # fmt: skip
        attrs = {(names.index(x),): [["tt.divisibility", 16]] for x in aligned}
        constexprs = {(names.index("STAGES"),): stages, (names.index("WS"),): ws}
        try:
            t0 = time.time()
            source = GluonASTSource(_extend_fwd, signature, constexprs, attrs)
            compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                      options=_options(variant))  # fmt: skip
            seconds = time.time() - t0
            path = f"/tmp/gluon_extend_{name}.cubin"
            with open(path, "wb") as f:
                f.write(compiled.asm["cubin"])
            usage, sass = (
                subprocess.run(
                    [tool, flag, path], capture_output=True, text=True, check=True
                ).stdout
                for flag in ("-res-usage", "-sass")
            )
            spills = int(re.search(r"LOCAL:(\d+)", usage).group(1))  # spill slots live there
            ptx = compiled.asm["ptx"]
            setmaxnreg = re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)
            row = {"regs": int(re.search(r"REG:(\d+)", usage).group(1)),
                   "highest_reg": max(int(r) for r in re.findall(r"\bR(\d+)\b", sass)),
                   "setmaxnreg": sorted(set(map(int, setmaxnreg))), "spill_bytes": spills,
                   "shared_bytes": compiled.metadata.shared, "compile_s": round(seconds, 1),
                   "sass_lines": sass.count("\n"),
                   "tma_loads_ptx": ptx.count("cp.async.bulk.tensor.2d.shared::cluster"),
                   "hgmma": sass.count("HGMMA"), "mufu_ex2": sass.count("MUFU.EX2"),
                   **_sass_loop(sass)}  # fmt: skip
            failed += spills > 0
        except Exception as exc:  # noqa: BLE001 - report every variant, then fail
            row = {"error": f"{type(exc).__name__}: {str(exc)[:1500]}"}
            failed += 1
        print(f"{name}: {row}", flush=True)
    print("compile: " + ("FAILED" if failed else "all variants compiled, 0 spills"), flush=True)
    return 1 if failed else 0


# ------------------------------------------------------------------------------- inputs, reference
def _cases() -> dict:
    return DRY_CASES if DRY else CASES


def _batch(case, heads, dev, tokens=None, slots=None, pages=None, max_pages=None) -> dict:
    """A batch in the engine's layout: q and the new k/v rows [T, H, D] (T: the case's buffer
    rows, padding rows random too), caches [pages * 16, Hkv, D] random (the prefixes), the new
    keys also stored at their slots (the engine's diagonal blocks read them there), pages
    assigned at random, sentinel slots (lengths 0, start parked at the real token count)."""
    prefixes, news, sentinels, rows = case
    hq, hkv, d = heads
    real = sum(news)
    tokens = tokens or rows or real
    slots = slots or len(news) + sentinels
    seq = [p + n for p, n in zip(prefixes, news)]
    need = _pages_needed(case)
    pages = pages or sum(need) + 1
    max_pages = max_pages or max(need)
    g = torch.Generator(device="cpu").manual_seed(sum(seq) + hq)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(dev, torch.bfloat16)

    b = {"q": rand(tokens, hq, d), "k_new": rand(tokens, hkv, d), "v_new": rand(tokens, hkv, d)}
    b.update(k_cache=rand(pages * PAGE_SIZE, hkv, d), v_cache=rand(pages * PAGE_SIZE, hkv, d))
    perm = torch.randperm(pages, generator=g).tolist()
    table = torch.zeros(slots, max_pages, dtype=torch.int32)
    at, start = 0, [0]
    for r, n in enumerate(need):
        table[r, :n] = torch.tensor(perm[at : at + n], dtype=torch.int32)
        at += n
        start.append(start[-1] + news[r])
    start += [real] * (slots - len(news))
    b.update(page_table=table.to(dev),
             seq_lens=torch.tensor(seq + [0] * (slots - len(news)), dtype=torch.int32).to(dev),
             query_lens=torch.tensor(news + [0] * (slots - len(news)), dtype=torch.int32).to(dev),
             query_start_loc=torch.tensor(start, dtype=torch.int32).to(dev))  # fmt: skip
    for r, (p, n) in enumerate(zip(prefixes, news)):
        slot = _slots(b["page_table"][r], p, p + n)
        b["k_cache"][slot] = b["k_new"][start[r] : start[r] + n]
        b["v_cache"][slot] = b["v_new"][start[r] : start[r] + n]
    b["requests"] = list(zip(prefixes, news, start))
    return b


def _pages_needed(case) -> list[int]:
    return [math.ceil((p + n) / PAGE_SIZE) for p, n in zip(case[0], case[1])]


def _slots(table_row, lo, hi):
    pos = torch.arange(lo, hi, device=table_row.device)
    return table_row[pos // PAGE_SIZE].long() * PAGE_SIZE + pos % PAGE_SIZE


def _reference(b) -> torch.Tensor:
    """float32, per request: the prefix keys gathered from the pages + the new keys from the
    rows; causal on the new part; GQA. Rows outside the requests: NaN (not compared)."""
    q, hq, hkv = b["q"], b["q"].shape[1], b["k_new"].shape[1]
    ref = torch.full(q.shape, float("nan"), dtype=torch.float32, device=q.device)
    scale = q.shape[2] ** -0.5
    for r, (p, n, s0) in enumerate(b["requests"]):
        slot = _slots(b["page_table"][r], 0, p)
        k = torch.cat([b["k_cache"][slot], b["k_new"][s0 : s0 + n]]).float()
        v = torch.cat([b["v_cache"][slot], b["v_new"][s0 : s0 + n]]).float()
        k = k.repeat_interleave(hq // hkv, 1).transpose(0, 1)  # [Hq, S, D]
        v = v.repeat_interleave(hq // hkv, 1).transpose(0, 1)
        chunk = max(1, (1 << 28) // (hq * (p + n)))  # ~1 GB of float32 scores a chunk
        for c0 in range(0, n, chunk):
            c1 = min(n, c0 + chunk)
            qc = q[s0 + c0 : s0 + c1].float().transpose(0, 1)  # [Hq, c, D]
            scores = qc @ k.transpose(1, 2) * scale
            pos = p + torch.arange(c0, c1, device=q.device)
            keys = torch.arange(p + n, device=q.device)
            scores.masked_fill_(keys[None, None, :] > pos[None, :, None], float("-inf"))
            ref[s0 + c0 : s0 + c1] = (scores.softmax(-1) @ v).transpose(0, 1)
    return ref


def _args(b):
    return (b["q"], b["k_new"], b["v_new"], b["k_cache"], b["v_cache"], b["page_table"],
            b["seq_lens"], b["query_lens"], b["query_start_loc"])  # fmt: skip


def _run(b, variant, out=None) -> torch.Tensor:
    if out is None:
        out = torch.full_like(b["q"], MARKER)
    if DRY:
        ref = _reference(b)
        out.copy_(torch.where(ref.isnan(), out.float(), ref).to(out.dtype))
        return out
    gluon_extend(*_args(b), out, variant)
    torch.cuda.synchronize()
    return out


def _engine(b, out=None) -> torch.Tensor:
    """nanograph's paged_attention with new_kv on the same batch."""
    if out is None:
        out = torch.full_like(b["q"], MARKER)
    if DRY:
        return _run(b, None, out)
    from nanograph.kernels.attention import paged_attention

    q, k_new, v_new, k_cache, v_cache, table, seq_lens, query_lens, qsl = _args(b)
    paged_attention(q, k_cache, v_cache, table, seq_lens, query_lens, qsl, PAGE_SIZE,
                    q.shape[2] ** -0.5, out=out, new_kv=(k_new, v_new))  # fmt: skip
    return out


def _errors(out, ref, b) -> dict:
    """Max abs error on the requests' rows; whether every other row kept the marker."""
    inside = ~ref[:, 0, 0].isnan()
    err = (out[inside].float() - ref[inside]).abs().max().item() if inside.any() else 0.0
    kept = bool((out[~inside] == MARKER).all().item()) if (~inside).any() else True
    return {"err": err, "marker_kept": kept}


def _ok(result) -> bool:
    return result["err"] <= TOLERANCE and result["marker_kept"]  # NaN fails


def _graph_check(variant, heads, dev, fn=None) -> dict:
    """(e): a CUDA graph captured on (d)'s buffers (static bounds: its token rows and slots),
    replayed with (b)'s lengths and data written into the same buffers."""
    cases = _cases()
    d_case, b_case = cases["d"], cases["b"]
    tokens, slots = d_case[3], len(d_case[1]) + d_case[2]
    # buffers for both: (b) may need more pages than (d), (d) the wider page table
    sizes = {"tokens": tokens, "slots": slots,
             "pages": max(sum(_pages_needed(c)) for c in (d_case, b_case)) + 1,
             "max_pages": max(max(_pages_needed(c)) for c in (d_case, b_case))}  # fmt: skip
    d = _batch(d_case, heads, dev, **sizes)
    other = _batch(b_case, heads, dev, **sizes)
    run = fn or (lambda b, out: _run(b, variant, out))
    out = torch.full_like(d["q"], MARKER)
    run(d, out)  # compiled, and (d) itself
    first = _errors(out, _reference(d), d)
    if DRY:
        for key in ("q", "k_new", "v_new", "k_cache", "v_cache", "page_table", "seq_lens",
                    "query_lens", "query_start_loc"):  # fmt: skip
            d[key].copy_(other[key])
        d["requests"] = other["requests"]
        out.fill_(MARKER)
        run(d, out)
        return {"capture_case_d": first, **_errors(out, _reference(d), d)}
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run(d, out)
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            if fn is None:
                gluon_extend(*_args(d), out, variant)
            else:
                fn(d, out)
    torch.cuda.current_stream().wait_stream(stream)
    for key in ("q", "k_new", "v_new", "k_cache", "v_cache", "page_table", "seq_lens",
                "query_lens", "query_start_loc"):  # fmt: skip
        d[key].copy_(other[key])
    d["requests"] = other["requests"]
    out.fill_(MARKER)
    graph.replay()
    torch.cuda.synchronize()
    return {"capture_case_d": first, **_errors(out, _reference(d), d)}


def _check_variant(variant, dev) -> dict:
    errors = {}
    for layout, heads in LAYOUTS.items():
        for name, case in _cases().items():
            b = _batch(case, heads, dev)
            errors[f"{layout} {name}"] = _errors(_run(b, variant), _reference(b), b)
            del b
        graph = _graph_check(variant, heads, dev)
        errors[f"{layout} e"] = graph
        if not DRY:
            torch.cuda.empty_cache()
    bad = [key for key, r in errors.items()
           if not _ok(r) or ("capture_case_d" in r and not _ok(r["capture_case_d"]))]  # fmt: skip
    return {"status": "failed" if bad else "passed", "failed": bad, "errors": errors}


# ------------------------------------------------------------------ GPU checks, in child processes
def _device() -> torch.device:
    if DRY:
        return torch.device("cpu")
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))  # fmt: skip
    torch.zeros(1, device="cuda")  # the context now: not inside a variant's check timeout
    return torch.device("cuda")


def child(names, hang) -> None:
    """Checks the named variants in turn: ``START name`` before each, ``RESULT {json}`` after;
    stops after a Python error (a CUDA fault poisons the context: the parent starts anew)."""
    dev = _device()
    print("READY", flush=True)
    for name in names:
        print(f"START {name}", flush=True)
        if name == hang:
            time.sleep(3600)  # --simulate-hang: what a barrier-phase bug looks like
        t0 = time.time()
        try:
            variant = next(v for v in VARIANTS if v[0] == name)
            result = _check_variant(variant, dev)
        except Exception as exc:  # noqa: BLE001 - a compile error, a fault
            result = {"status": "error", "error": f"{type(exc).__name__}: {str(exc)[:1500]}"}
        result.update(name=name, check_s=round(time.time() - t0, 1))
        print("RESULT " + json.dumps(result), flush=True)
        if result["status"] == "error":
            return


def check_in_children(names, args) -> dict:
    """Each variant's checks in a child process with a timeout (gluon_attention_proto.py's
    scheme): a hung, faulting or failing variant is recorded, the next child goes on."""
    results, pending = {}, list(names)
    deadline = time.time() + args.check_budget
    while pending:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", ",".join(pending)]
        cmd += ["--dry"] if DRY else []
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
                else:
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
    for _ in range(3):
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


def _graphed(fn):
    """fn captured in a CUDA graph, as the engine runs attention: a replay times the kernel
    alone. Stop 52 timed launches of ``_run``, which built six TMA descriptors on the host and
    synchronised inside the timed span: case b (4 x 2048) read 0.377 ms against the engine's
    0.205, a gap that host work and a sync could explain as well as the kernel."""
    if DRY:
        return fn
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph.replay


def _sdpa_cudnn(b):
    """SDPA cuDNN, dense per request (no prefix: cases a and b), [R, H, n, D], causal."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    n = b["requests"][0][1]
    r = len(b["requests"])
    hq, hkv = b["q"].shape[1], b["k_new"].shape[1]
    qh, kh, vh = (b[x][: r * n].view(r, n, -1, b["q"].shape[2]).transpose(1, 2).contiguous()
                  for x in ("q", "k_new", "v_new"))  # fmt: skip
    for gqa in (True, False):
        kk = kh if gqa else kh.repeat_interleave(hq // hkv, 1)
        vv = vh if gqa else vh.repeat_interleave(hq // hkv, 1)

        def fn(kk=kk, vv=vv, gqa=gqa):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                f = torch.nn.functional.scaled_dot_product_attention
                return f(qh, kk, vv, is_causal=True, enable_gqa=gqa)

        try:
            fn()
            return fn, {"gqa": "enable_gqa" if gqa else "repeat_interleave"}
        except RuntimeError as exc:
            err = str(exc).splitlines()[0][:160]
    return None, {"unsupported": err}


def measure(name, layout, heads, passing, args, dev) -> dict:
    b = _batch(_cases()[name], heads, dev)
    ref = _reference(b)
    flops = sum(4 * heads[0] * heads[2] * (n * p + n * n / 2) for p, n, _ in b["requests"])
    arms = {}

    def arm(label, fn, info):
        try:
            if fn is not None:  # ms: graph replays; launch_ms: launched from Python each time
                ms = _time_ms(_graphed(fn), args.rep_ms)
                launch_ms = _time_ms(fn, args.rep_ms)
                info = {"ms": round(ms, 4), "tflops": round(flops / ms / 1e9, 1),
                        "launch_ms": round(launch_ms, 4), **info}  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - an arm that cannot run is recorded
            info = {"error": f"{type(exc).__name__}: {str(exc)[:200]}", **info}
        arms[label] = info
        print(f"{name} {layout} {label}: {info}", flush=True)

    for variant in passing:
        out = torch.full_like(b["q"], MARKER)
        launch = (
            (lambda variant=variant, out=out: _run(b, variant, out))
            if DRY
            else (lambda variant=variant, out=out: gluon_extend(*_args(b), out, variant))
        )
        arm(variant[0], launch, {})
    try:
        out = torch.full_like(b["q"], MARKER)
        info = _errors(_engine(b, out), ref, b)
        arm("engine", lambda out=out: _engine(b, out), info)
    except Exception as exc:  # noqa: BLE001
        arm("engine", None, {"error": f"{type(exc).__name__}: {str(exc)[:200]}"})
    if name in ("a", "b") and not DRY:
        fn, info = _sdpa_cudnn(b)
        arm("sdpa_cudnn", fn, info)
    return {"case": name, "layout": layout, "requests": b["requests"], "arms": arms}


def main() -> int:
    global DRY
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compile", action="store_true", help="CPU: compile every variant, sm_90")
    ap.add_argument("--dry", action="store_true", help="CPU: the harness with the GPU stubbed")
    ap.add_argument("--out", help="JSON results")
    ap.add_argument("--variants", help="comma-separated subset of the variant names")
    ap.add_argument("--cases", default="a,b,c,d", help="timed cases")
    ap.add_argument("--rep-ms", type=int, default=100, help="timed launches' span (>= 20 runs)")
    ap.add_argument("--variant-timeout", type=float, default=40.0, help="s for one check")
    ap.add_argument("--start-timeout", type=float, default=60.0, help="s for a child's imports")
    ap.add_argument("--check-budget", type=float, default=110.0, help="s for all checks")
    ap.add_argument("--simulate-hang", help="with --dry: this variant's check hangs")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.compile:
        return compile_variants()
    DRY = args.dry
    if args.child:
        child(args.child.split(","), args.simulate_hang if DRY else None)
        return 0
    t0 = time.time()
    names = args.variants.split(",") if args.variants else [v[0] for v in VARIANTS]
    checks = check_in_children(names, args)
    passing = [v for v in VARIANTS if checks.get(v[0], {}).get("status") == "passed"]
    print(f"checks: {time.time() - t0:.0f} s, passing {[v[0] for v in passing]}", flush=True)
    dev = _device()
    env = {"device": "cpu (dry)" if DRY else torch.cuda.get_device_name(),
           "triton": triton.__version__, "torch": torch.__version__,
           "commit": os.environ.get("NANOGRAPH_COMMIT"), "tolerance": TOLERANCE}  # fmt: skip
    results = []
    try:  # the engine through a graph too: its replay with other lengths, as a harness check
        engine_graph = _graph_check(None, LAYOUTS["qwen3-0.6b"], dev,
                                    fn=lambda b, out: _engine(b, out))  # fmt: skip
    except Exception as exc:  # noqa: BLE001
        engine_graph = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    print(f"engine graph (e), qwen3-0.6b: {engine_graph}", flush=True)

    def save():  # after every row: a run cut short still leaves what it measured
        if args.out:
            with open(args.out, "w") as f:
                doc = {"env": env, "variants": VARIANTS, "checks": checks,
                       "engine_graph": engine_graph, "results": results}  # fmt: skip
                json.dump(doc, f, indent=1)

    save()
    for name in args.cases.split(","):
        for layout, heads in LAYOUTS.items():
            results.append(measure(name, layout, heads, passing, args, dev))
            save()
            if not DRY:
                torch.cuda.empty_cache()
    print(f"{'case':<4} {'layout':<11} {'arm':<20} {'ms':>8} {'TFLOP/s':>8} {'launch':>8} "
          f"{'err':>8}")  # fmt: skip
    for row in results:
        for label, arm in row["arms"].items():
            ms, tflops = arm.get("ms", "-"), arm.get("tflops", "-")
            err = f"{arm['err']:.4f}" if "err" in arm else "-"
            launch = arm.get("launch_ms", "-")
            print(f"{row['case']:<4} {row['layout']:<11} {label:<20} {ms:>8} {tflops:>8} "
                  f"{launch:>8} {err:>8}")  # fmt: skip
    print(f"total {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
