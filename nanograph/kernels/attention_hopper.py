"""Hopper (sm_90) extend attention in Gluon: FA3's structure behind ``paged_attention``.

Why: a long prefill is attention-bound (qwen3-0.6b at 8192 tokens: ~half the forward), and the
Triton kernel of ``kernels.attention`` cannot express what FA3 does on Hopper. Here, per
program (one tile of 128 query rows of one request x one q head):
- a 1-warp producer partition issues every load by TMA into 2-stage K and V rings (ready /
  empty mbarriers): Q, then the key blocks of the cached prefix from the pages (one TMA box a
  16-slot page: Hopper has no TMA gather), then the blocks of this forward's new keys from
  their rows (``new_kv``), up to the tile's diagonal;
- two consumer warpgroups of 64 rows each run async wgmma, the softmax of one block under the
  previous block's P V, and store by TMA (by a masked store where a box would cross into the
  next request's rows).
At 1 x 8192 on an H100 (stop 52; the prototype is ``docs/wip/gluon_extend_proto.py`` at
4e41363) it ran 0.436 ms with qwen3-0.6b heads (630 TFLOP/s; the Triton kernel 0.601, cuDNN
0.487) and 0.90 ms with qwen3-8b heads (Triton 1.12, cuDNN 0.915).

Invariants:
- Graph safe: the grid is ``(N // 128 + S) * Hq`` programs, static sizes only; each program
  finds its (request, q block) by binary search over ``query_start_loc`` and exits when it
  has no tile, when its request is shorter than ``min_q_len`` (those are left to the Triton
  kernel's launch), or for a sentinel slot. Rows outside the computed requests are not
  written.
- A new-key box may run into the next request's rows (finite, masked by the causal mask) or
  past N (zero fill); prefix pages past the prefix's last are not looked up (the last is
  loaded again, masked). Masked values must be finite: the engine's KV pool is zero-filled.
- ``launch_descriptors`` is the only gate: bf16, head_dim 128, 16-slot pages, no window, sinks
  or softcap, rows TMA can read, sm_90, Triton with Gluon (3.6 was measured); it returns None
  otherwise, and the Triton kernel takes the extend. ``NANOGRAPH_HOPPER_ATTENTION=0`` turns
  it off (A/B runs).
"""

from __future__ import annotations

import functools

import torch

# Gluon is Triton's experimental layer (absent from older Triton): kernels.attention imports
# this module only for a CUDA extend, and takes an ImportError as "not supported"
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

from nanograph.kernels.launch import LaunchCache
from nanograph.kernels.tma import rows_descriptor

# TMA copies under Triton 3.7+'s names, or 3.6's (the same builtins, renamed)
_tma_copy_in = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_copy_out = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global

BLOCK_M = 128  # query rows a program: two consumer warpgroups of 64
BLOCK_N = 128  # keys a ring slot
STAGES = 2
HEAD_DIM = 128
PAGE_SIZE = 16
# the launch's register cap: 8 consumer warps + a producer warpgroup, one CTA an SM (65536 /
# 384 -> 168); setmaxnreg then gives the consumers 240 and the producer 24
_MAXNREG = 168
_LOG2E = 1.4426950408889634


@functools.lru_cache(maxsize=8)
def _hopper(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) == (9, 0)


def launch_descriptors(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    new_kv: tuple[torch.Tensor, torch.Tensor] | None, out: torch.Tensor, page_size: int,
    sliding_window: int, sinks: torch.Tensor | None, softcap: float,
) -> tuple[TensorDescriptor, ...] | None:  # fmt: skip
    """The TMA descriptors ``extend_attention`` launches with, where an extend with these
    inputs can run here (see the module's invariants), else None."""
    if new_kv is None or not q.is_cuda:
        return None
    if not (
        _hopper(q.device) and page_size == PAGE_SIZE and q.shape[2] == HEAD_DIM
        and sliding_window == 0 and sinks is None and softcap == 0.0
        and all(x.dtype == torch.bfloat16 for x in (q, out, k_cache, v_cache, *new_kv))
    ):  # fmt: skip
        return None
    descriptors = _descriptors(q, new_kv, k_cache, v_cache, out)
    return None if None in descriptors else descriptors


@gluon.jit
def _tma_load(desc, row, col, bar, buf):
    mbarrier.expect(bar, desc.block_type.nbytes)
    _tma_copy_in(desc, [row, col], bar, buf)


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
        _tma_copy_in(cache_desc, [page * PAGE, col], bar,
                                        buf.slice(i * PAGE, PAGE))  # fmt: skip


@gluon.jit
def _producer(q_desc, k_desc, v_desc, kc_desc, vc_desc, q_smem, k_bufs, v_bufs, bars, q_row,
              new_row0, q_len, q_col, kv_col, page_row_ptr, prefix_len, n_prefix,
              n_blocks):  # fmt: skip
    """The load partition (one warp): Q (rows from q_row), then block j's K and V as their ring
    slots free up, from the pages (j < n_prefix) or from the new rows (the request's first new
    token's row is new_row0). A new block that would run past the request's last row is loaded
    ending on that row instead (``_new_block_start``): rows after a request may be padding
    with any values, and a masked key's NaN value would still reach P V (0 x NaN)."""
    q_bar, k_ready, v_ready, k_empty, v_empty = bars
    STAGES: gl.constexpr = k_bufs.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.shape[1]
    PAGE: gl.constexpr = kc_desc.block_type.shape[0]
    SPLIT: gl.constexpr = q_smem.shape[0]
    ROWS: gl.constexpr = q_smem.shape[1]
    mbarrier.expect(q_bar, SPLIT * q_desc.block_type.nbytes)
    for i in gl.static_range(SPLIT):
        _tma_copy_in(q_desc, [q_row + i * ROWS, q_col], q_bar, q_smem.index(i))
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
            row = new_row0 + _new_block_start(j - n_prefix, q_len, BLOCK_N)
            _tma_load(k_desc, row, kv_col, k_ready.index(slot), k_bufs.index(slot))
        mbarrier.wait(v_empty.index(slot), free_phase)
        if j < n_prefix:
            _page_loads(vc_desc, page_row_ptr, j, last_page, kv_col, v_ready.index(slot),
                        v_bufs.index(slot))  # fmt: skip
        else:
            row = new_row0 + _new_block_start(j - n_prefix, q_len, BLOCK_N)
            _tma_load(v_desc, row, kv_col, v_ready.index(slot), v_bufs.index(slot))


@gluon.jit
def _new_block_start(block, q_len, BLOCK_N: gl.constexpr):
    """The first key (from the request's first new token) of the box new block ``block`` is
    loaded in: its own start, or, for a block that would run past the request's last key, the
    box ending on that key (starting before the request when it has fewer than BLOCK_N tokens:
    an earlier request's rows, or zeros before row 0, all masked)."""
    return gl.minimum(block * BLOCK_N, q_len - BLOCK_N)


@gluon.jit
def _mask(s, j, n_prefix, prefix_len, m0, q_len, s_layout: gl.constexpr):
    """Prefix block: keys >= prefix_len out (every row alike); new block: causal, counted from
    the request's first new token (row m0 + r sees keys <= m0 + r), and a block loaded ending
    on the request's last key (``_new_block_start``) keeps only the keys not seen before."""
    ROWS: gl.constexpr = s.shape[0]
    BLOCK_N: gl.constexpr = s.shape[1]
    rows = m0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
    in_prefix = j < n_prefix
    start = gl.where(in_prefix, j, j - n_prefix) * BLOCK_N
    key0 = gl.where(in_prefix, start, _new_block_start(j - n_prefix, q_len, BLOCK_N))
    keys = gl.expand_dims(key0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout)), 0)
    # limit a row's keys stay under: prefix_len (prefix), its own index + 1 (new)
    slope = gl.where(in_prefix, 0, 1)
    offset = gl.where(in_prefix, prefix_len, 1)
    limit = gl.expand_dims(rows * slope + offset, 1)
    return gl.where((keys < limit) & (keys >= start), s, -float("inf"))


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
        s = _mask(s, 0, n_prefix, prefix_len, m0, q_len, s_layout)
    p, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale)
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)

    # as in FA3: P crosses the loop edge in float32 and becomes P V's
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
            s = _mask(s, j, n_prefix, prefix_len, m0, q_len, s_layout)
            p, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale)
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
        _tma_copy_out(o_desc, [q_start + m0, q_col], q_smem)
        tma.store_wait(0)
    else:  # the request's last rows: a box would write the next request's rows
        rows = m0 + gl.arange(0, ROWS, layout=o_rows)
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        offs = gl.expand_dims((q_start + rows).to(gl.int64) * stride_o, 1)
        offs = offs + gl.expand_dims(q_col + cols, 0)
        mask = (gl.expand_dims(rows, 1) < q_len) & (gl.expand_dims(cols, 0) < HEAD_DIM)
        gl.store(out_ptr + offs, out, mask=mask)


@gluon.jit(do_not_specialize=["num_seqs", "min_q_len", "stride_pt"])
def _extend_fwd(out_ptr, page_table_ptr, seq_lens_ptr, query_lens_ptr, query_start_loc_ptr,
                q_desc, k_desc, v_desc, kc_desc, vc_desc, o_desc, num_seqs, min_q_len, stride_pt,
                stride_o, num_q_heads, group, qk_scale, STAGES: gl.constexpr):  # fmt: skip
    SPLIT: gl.constexpr = 2  # consumer partitions (warpgroups)
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
    if (m0 >= q_len) | (q_len < min_q_len):
        return  # a sentinel slot, a spare program of the static grid, or a short request
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
             q_start + m0, q_start, q_len, q_col, kv_col, page_row_ptr, prefix_len, n_prefix,
             n_blocks)  # fmt: skip

    # FA3's layout: a producer warp, two consumer warpgroups of 64 rows each
    gl.warp_specialize([
        (_consumer, (o_desc, out_ptr, stride_o, q_smem.index(0), k_bufs, v_bufs, bars, q_start,
                     m0, q_len, q_col, prefix_len, n_prefix, n_blocks, qk_scale)),
        (_consumer, (o_desc, out_ptr, stride_o, q_smem.index(1), k_bufs, v_bufs, bars, q_start,
                     m0 + ROWS, q_len, q_col, prefix_len, n_prefix, n_blocks, qk_scale)),
        (_producer, loads),
    ], [4, 1], [240, 24])  # fmt: skip


@functools.lru_cache(maxsize=8)
def _box_layout(rows: int, d: int) -> gl.NVMMASharedLayout:
    return gl.NVMMASharedLayout.get_default_for([rows, d], gl.bfloat16)


def _descriptors(
    q: torch.Tensor, new_kv: tuple[torch.Tensor, torch.Tensor], k_cache: torch.Tensor,
    v_cache: torch.Tensor, out: torch.Tensor,
) -> tuple[TensorDescriptor | None, ...]:  # fmt: skip
    """The launch's TMA descriptors, in its order: rows ``[N, H, D]`` as 2-D tensors
    ``[N, H * D]`` in boxes of a consumer's q rows, a ring slot's new keys, a page (past N:
    zero fill); None for a tensor TMA cannot read (``kernels.tma``). Cached there: graph
    replays of a breakable prefill make this launch eagerly every layer."""
    rows = BLOCK_M // 2
    return (
        rows_descriptor(q, rows, TensorDescriptor, _box_layout),
        *(rows_descriptor(x, BLOCK_N, TensorDescriptor, _box_layout) for x in new_kv),
        *(rows_descriptor(x, PAGE_SIZE, TensorDescriptor, _box_layout) for x in (k_cache, v_cache)),
        rows_descriptor(out, rows, TensorDescriptor, _box_layout),
    )  # fmt: skip


_launch = LaunchCache(_extend_fwd)


def extend_attention(
    q: torch.Tensor, new_kv: tuple[torch.Tensor, torch.Tensor], k_cache: torch.Tensor,
    v_cache: torch.Tensor, page_table: torch.Tensor, seq_lens: torch.Tensor,
    query_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float, out: torch.Tensor,
    min_q_len: int, descriptors: tuple[TensorDescriptor, ...],
) -> None:  # fmt: skip
    """Writes the rows of ``out [N, Hq, D]`` of the requests with at least ``min_q_len`` query
    tokens (``paged_attention`` passes ``kernels.attention.HOPPER_MIN_QUERY_LEN``): causal
    attention over each one's cached prefix (pages) and its new keys (``new_kv``, a row per row
    of q). Inputs as ``kernels.attention.paged_attention`` takes them; ``descriptors`` are
    what ``launch_descriptors`` returned for them (not None)."""
    num_tokens, num_q_heads, _ = q.shape
    num_seqs = seq_lens.shape[0]
    _launch(
        ((num_tokens // BLOCK_M + num_seqs) * num_q_heads,),
        (out, page_table, seq_lens, query_lens, query_start_loc),
        (
            num_seqs, min_q_len, page_table.stride(0), out.stride(0), num_q_heads,
            num_q_heads // new_kv[0].shape[1], scale * _LOG2E,
        ),
        {"STAGES": STAGES, "num_warps": 4, "maxnreg": _MAXNREG},
        descriptors,
    )  # fmt: skip
