"""The paged attention kernel (Triton): extend/prefill, decode and target-verify in one kernel.
``kernels.attention.paged_attention`` checks its inputs and launches it; the layouts, graph
safety and sentinel rules are in that module's docstring.

Invariants:
- Work split: a program owns BLOCK_Q query tokens x the whole GQA group of one kv head (the
  group, padded to a power of two, is packed into the M dim of the tile so K/V are loaded once
  per group) and one of ``num_splits`` slices of the key range (flash-decoding: how one long
  sequence still fills the GPU). ``num_splits`` is a runtime value (the grid's third dim: one
  kernel serves every split count > 1, and one-slice launches compile without the merge); a
  tile uses only as many slices as its key range fills with MIN_SPLIT_BLOCKS key blocks each,
  so a short range takes one slice and writes its output directly; with MIN_SLICES > 1 a range
  of fewer than MIN_SLICES x MIN_SPLIT_BLOCKS blocks keeps MIN_SLICES slices (shorter ones).
  A split tile writes its partial output unnormalized with its running max and sum; the last
  of its slices to finish (an atomic counter per tile) merges them (a one-row tile only its
  group's rows), then resets the counter to zero for the next launch (kernels/counters.py:
  the persistent buffers and their lanes). A one-row decode walks its slice in one masked
  key loop (AttentionTiles.one_range); other tiles cut it into the masked window start, the
  blocks every row sees (unmasked) and the masked diagonal.
- The one-row decode (``AttentionTiles.pdl_wait``, sm_90+) is a programmatic dependent launch
  behind the kernel that wrote q (the q/k/v GEMV when this kernel rotates q itself, given
  ``rope``; else rope + KV store): it reads the lengths and the page table and prefetches its
  first key blocks into the L2, then waits for that kernel before it reads q or any of this
  forward's keys.
- Two static layouts of the first grid dim: "flat" (extend: ``N // BLOCK_Q + S`` programs, each
  finds its request by binary search over ``query_start_loc``) and "per request" (decode and
  verify: ``S * cdiv(max_query_len, BLOCK_Q)`` programs); ``max_query_len`` is a static hint.
- Each program leaves the requests outside its launch's query_len range
  ``[min_q_len, max_q_len]`` alone (an extend may be two launches in different tiles).
"""

from __future__ import annotations

import triton
import triton.language as tl

from nanograph.kernels import pdl


@triton.jit
def _find_request(query_start_loc_ptr, pid, num_seqs, BLOCK_Q: tl.constexpr):
    # Request r's blocks start at query_start_loc[r] // BLOCK_Q + r (each request gets at most
    # one partial block, hence the + r); find the last request whose start is <= pid.
    # int32 tensors from the start: loop-carried values must keep one type (num_seqs == 1 is
    # specialized to a constant by the compiler).
    lo = tl.full([], 0, tl.int32)
    hi = lo + num_seqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        start = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        lo = tl.where(start <= pid, mid, lo)
        hi = tl.where(start <= pid, hi, mid - 1)
    return lo


@triton.jit
def _attend_key_range(
    acc,
    m_i,
    l_i,
    q,
    q_pos,
    kv_start,
    kv_end,
    k_base,
    v_base,
    page_row_ptr,
    stride_k_slot,
    stride_v_slot,
    seq_len,
    sliding_window,
    qk_scale,
    softcap,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    MASKED: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PREFETCH_PAGES: tl.constexpr,
):
    """Online-softmax over keys [kv_start, kv_end); MASKED=False only for blocks every row sees."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    if PREFETCH_PAGES:
        # the first block's page ids; each iteration then loads the next block's (masked at
        # the sequence end, so the last, unused prefetch reads nothing)
        next_pos = kv_start + offs_n
        page = tl.load(page_row_ptr + next_pos // PAGE_SIZE, mask=next_pos < seq_len, other=0)
    for start in range(kv_start, kv_end, BLOCK_N):
        kv_pos = start + offs_n
        in_seq = kv_pos < seq_len
        if PREFETCH_PAGES:
            slot = page.to(tl.int64) * PAGE_SIZE + kv_pos % PAGE_SIZE
            next_pos = kv_pos + BLOCK_N
            page = tl.load(page_row_ptr + next_pos // PAGE_SIZE, mask=next_pos < seq_len,
                           other=0)  # fmt: skip
        else:
            if MASKED:
                page = tl.load(page_row_ptr + kv_pos // PAGE_SIZE, mask=in_seq, other=0)
            else:
                page = tl.load(page_row_ptr + kv_pos // PAGE_SIZE)
            slot = page.to(tl.int64) * PAGE_SIZE + kv_pos % PAGE_SIZE
        k_ptrs = k_base + slot[:, None] * stride_k_slot + offs_d[None, :]
        v_ptrs = v_base + slot[:, None] * stride_v_slot + offs_d[None, :]
        if MASKED:
            k = tl.load(k_ptrs, mask=in_seq[:, None], other=0.0)
        else:
            k = tl.load(k_ptrs)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if USE_SOFTCAP:
            # softcap * tanh(s / softcap), with tanh(x) = 2 sigmoid(2x) - 1; then to log2 units
            s = s * qk_scale
            s = softcap * (2.0 * tl.sigmoid(2.0 * s / softcap) - 1.0) * 1.4426950408889634
        else:
            s = s * qk_scale  # qk_scale already carries log2(e): exp2 below
        if MASKED:
            visible = (kv_pos[None, :] <= q_pos[:, None]) & in_seq[None, :]
            if USE_WINDOW:
                visible = visible & (kv_pos[None, :] > q_pos[:, None] - sliding_window)
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen no visible key keeps m = -inf; subtract 0 instead so exp2 gives 0
        # rather than NaN (-inf - -inf).
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASKED:
            v = tl.load(v_ptrs, mask=in_seq[:, None], other=0.0)
        else:
            v = tl.load(v_ptrs)
        # Not the FMA form exp2(s * qk_scale - m) with the max on raw scores: on the H200 at
        # 1 x 8192 with qwen3-8b heads (256-row tiles, 8 warps) it took 1.88 ms against 1.24,
        # with or without P V accumulated into the rescaled acc (qwen3-0.6b heads: -1.7%).
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _attend_new_keys(
    acc,
    m_i,
    l_i,
    q,
    lo,
    hi,
    k_desc,
    v_desc,
    row0,
    kv_head,
    qk_scale,
    softcap,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Online softmax over this forward's keys [lo, hi) of a request (counted from its first
    new token), blocks every row sees, read from its k/v rows (the request's row 0 is row
    ``row0``) by TMA: the arithmetic of ``_attend_key_range``'s unmasked blocks. The diagonal
    blocks are not read here: their keys past the request's (the next request's rows, or
    padding) may hold anything, and a masked key's value still meets its zero weight in the
    sum (0 x NaN); the cache's masked loads read them as zeros."""
    for start in range(lo, hi, BLOCK_N):
        k = k_desc.load([row0 + start, kv_head * HEAD_DIM])
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if USE_SOFTCAP:
            s = s * qk_scale
            s = softcap * (2.0 * tl.sigmoid(2.0 * s / softcap) - 1.0) * 1.4426950408889634
        else:
            s = s * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = v_desc.load([row0 + start, kv_head * HEAD_DIM])
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


# Batch-dependent integers are not specialized: Triton would otherwise compile a new variant
# whenever the request count or the page-table width changes between 1, a multiple of 16 and
# anything else, i.e. on a request's path.
@triton.jit(
    do_not_specialize=[
        "num_seqs",
        "num_splits",
        "stride_page_table",
        "min_q_len",
        "max_q_len",
        "num_rows",
    ]
)
def _paged_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    part_out_ptr,  # fp32 [N, Hq, num_splits, HEAD_DIM], used when num_splits > 1
    part_ml_ptr,  # fp32 [N, Hq, num_splits, 2]: each partial's running max (log2) and sum
    counters_ptr,  # int32 [grid0 * num_kv_heads], zero between launches
    sinks_ptr,
    page_table_ptr,
    seq_lens_ptr,
    query_lens_ptr,
    query_start_loc_ptr,
    k_new_ptr,  # ROPE: this forward's key and value rows [N, Hkv, D], not yet rotated
    v_new_ptr,
    positions_ptr,
    cos_sin_ptr,
    slot_mapping_ptr,
    q_norm_ptr,
    k_norm_ptr,
    num_tokens_ptr,  # ROPE: int32 [1], the live rows (the rows past it are a graph's padding)
    k_desc,  # NEW_KEYS: TMA descriptors of this forward's k/v rows as [N, Hkv * D]
    v_desc,
    num_seqs,
    num_splits,  # slices of the key range, the grid's third dim: a value, not a variant
    min_q_len,  # requests with query_len outside [min_q_len, max_q_len] are another launch's
    max_q_len,
    num_rows,  # ZERO_PADDING: the rows of q, whose rows past num_tokens this launch zeroes
    stride_page_table,
    stride_q_tok,
    stride_q_head,
    stride_k_slot,
    stride_k_head,
    stride_v_slot,
    stride_v_head,
    stride_o_tok,
    stride_o_head,
    qk_scale,
    softcap,
    sliding_window,
    stride_kn_tok,
    stride_kn_head,
    stride_vn_tok,
    stride_vn_head,
    stride_cos_sin,
    eps,
    NUM_Q_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    Q_BLOCKS_PER_REQUEST: tl.constexpr,  # 0: flat layout
    SPLITS_CAP: tl.constexpr,  # a power of two >= num_splits (the merge's lse vector)
    MAY_SPLIT: tl.constexpr,  # num_splits > 1: only then is the merge compiled in
    MIN_SPLIT_BLOCKS: tl.constexpr,
    MIN_SLICES: tl.constexpr,  # a long range keeps this many slices as they grow (AttentionTiles)
    PREFETCH_PAGES: tl.constexpr,
    MERGE_ROWS: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
    PDL_WAIT: tl.constexpr,
    L2_LINES: tl.constexpr,  # 128-byte lines in one head row of the cache
    ROPE: tl.constexpr,  # decode: q/k-norm, rotary and the KV store done here
    HAS_Q_NORM: tl.constexpr,
    HAS_K_NORM: tl.constexpr,
    # ROPE over a q that may have padded rows: compiled out of one-row launches (the branch
    # alone made qwen3-0.6b's batch-1 decode graph ~1% slower)
    ZERO_PADDING: tl.constexpr,
    NEW_KEYS: tl.constexpr,  # keys past the cached prefix from k_desc/v_desc (AttentionTiles)
    ONE_RANGE: tl.constexpr,  # a slice's keys in one masked loop (AttentionTiles.one_range)
):
    if PDL:
        # the next kernel (the batch-1 o projection's GEMV) may launch now: it prefetches
        # weights, then waits for this whole grid before reading the output
        tl.extra.cuda.gdc_launch_dependents()
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    if ZERO_PADDING:  # what rope_store_kv does when it runs: no program owns these rows
        if tl.program_id(0) == 0:
            if split == 0:
                _zero_padded_rows(out_ptr, num_tokens_ptr, num_rows, kv_head, stride_o_tok,
                                  stride_o_head, GROUP, GROUP_PAD, HEAD_DIM)  # fmt: skip
    if Q_BLOCKS_PER_REQUEST > 0:
        pid = tl.program_id(0)
        seq = pid // Q_BLOCKS_PER_REQUEST
        q_block = pid % Q_BLOCKS_PER_REQUEST
    else:
        # Reversed: the last blocks of a request see the most keys; launching them first keeps
        # the long programs off the tail of the grid.
        pid = tl.num_programs(0) - 1 - tl.program_id(0)
        seq = _find_request(query_start_loc_ptr, pid, num_seqs, BLOCK_Q)
        q_block = pid - (tl.load(query_start_loc_ptr + seq) // BLOCK_Q + seq)
    q_len = tl.load(query_lens_ptr + seq)
    if q_block * BLOCK_Q >= q_len or q_len < min_q_len or q_len > max_q_len:
        return  # sentinel slot, a spare program of the static grid, or another launch's
    seq_len = tl.load(seq_lens_ptr + seq)
    q_start = tl.load(query_start_loc_ptr + seq)
    context_len = seq_len - q_len

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q_local = q_block * BLOCK_Q + offs_m // GROUP_PAD
    head_in_group = offs_m % GROUP_PAD
    q_head = kv_head * GROUP + head_in_group
    head_valid = head_in_group < GROUP
    row_valid = (q_local < q_len) & head_valid
    q_pos = context_len + q_local
    token = (q_start + q_local).to(tl.int64)
    q_ptrs = q_ptr + token[:, None] * stride_q_tok + q_head[:, None] * stride_q_head
    if ROPE:
        # what rotation and norms read besides this forward's q/k/v: positions and the slot
        # mapping, which no kernel of a forward writes (like the lengths and the page table: a
        # draft loop advances them before its next step's embedding lookup, a plain launch that
        # waits for them), the cos/sin table and the norm weights (constants); read before the
        # wait, so only q, k and v are left after it
        one = tl.arange(0, 1)
        slot = tl.load(slot_mapping_ptr + q_start + one).to(tl.int64)  # [1]
        rope = _rope_inputs(positions_ptr, cos_sin_ptr, q_norm_ptr, k_norm_ptr, q_start,
                            stride_cos_sin, HAS_Q_NORM, HAS_K_NORM, HEAD_DIM)  # fmt: skip
    else:
        rope = None
    if not PDL_WAIT:
        q = _load_q(q_ptrs, row_valid, rope, eps, ROPE, HAS_Q_NORM, HEAD_DIM)

    # Key range of this query block, cut into num_splits BLOCK_N-aligned slices; inside a
    # slice only blocks that some row cannot fully see pay for the mask. [full_lo, full_hi)
    # holds the blocks every row of the block sees (causal and window).
    first_pos = context_len + q_block * BLOCK_Q
    last_pos = tl.minimum(first_pos + BLOCK_Q, seq_len) - 1
    kv_lo = 0
    full_lo = 0
    if USE_WINDOW:
        kv_lo = (tl.maximum(first_pos - sliding_window + 1, 0) // BLOCK_N) * BLOCK_N
        full_lo = tl.cdiv(tl.maximum(last_pos - sliding_window + 1, 0), BLOCK_N) * BLOCK_N
    kv_hi = last_pos + 1
    full_hi = tl.maximum(((first_pos + 1) // BLOCK_N) * BLOCK_N, full_lo)
    num_blocks = tl.cdiv(kv_hi - kv_lo, BLOCK_N)
    if NEW_KEYS:  # the cached prefix's blocks, then this forward's from its first new token
        prefix_blocks = tl.cdiv(context_len, BLOCK_N)
        num_blocks = prefix_blocks + tl.cdiv(kv_hi - context_len, BLOCK_N)
    least_blocks = MIN_SPLIT_BLOCKS
    if MIN_SLICES > 1:  # (at least one: a zero-length slot has no blocks)
        least_blocks = tl.maximum(tl.minimum(MIN_SPLIT_BLOCKS, tl.cdiv(num_blocks, MIN_SLICES)), 1)
    blocks_per_split = tl.maximum(tl.cdiv(num_blocks, num_splits), least_blocks)
    active_splits = tl.cdiv(num_blocks, blocks_per_split)
    if split >= active_splits:
        return  # the key range is too short to use this slice
    split_lo = kv_lo + split * blocks_per_split * BLOCK_N
    split_hi = tl.minimum(split_lo + blocks_per_split * BLOCK_N, kv_hi)

    k_base = k_cache_ptr + kv_head * stride_k_head
    v_base = v_cache_ptr + kv_head * stride_v_head
    page_row_ptr = page_table_ptr + seq.to(tl.int64) * stride_page_table
    if PDL_WAIT:
        # Until the wait only the lengths and the page table are read (no kernel of a forward
        # writes them). The L2 is coherent, so a prefetched line of this forward's key (being
        # written by rope_store_kv before the wait, or by this kernel after it) is not left
        # stale; only an L1 would be.
        _prefetch_l2(k_base, v_base, page_row_ptr, split_lo, split_hi, stride_k_slot,
                     stride_v_slot, BLOCK_N, HEAD_DIM, PAGE_SIZE, L2_LINES)  # fmt: skip
        tl.extra.cuda.gdc_wait()  # q and this forward's key are written
        q = _load_q(q_ptrs, row_valid, rope, eps, ROPE, HAS_Q_NORM, HEAD_DIM)
    if ROPE:
        if split == active_splits - 1:  # the slice that holds the request's new key
            _rope_store_new_kv(
                k_new_ptr + q_start.to(tl.int64) * stride_kn_tok + kv_head * stride_kn_head + one,
                v_new_ptr + q_start.to(tl.int64) * stride_vn_tok + kv_head * stride_vn_head + one,
                k_base, v_base, slot, rope, stride_k_slot, stride_v_slot, eps, HAS_K_NORM,
                HEAD_DIM,
            )  # fmt: skip
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if NEW_KEYS:
        # No window. This slice's blocks [b0, b1) of the cached prefix (every row sees all
        # of it; its last block masked at its end), then of this forward's keys, in blocks
        # counted from the request's first new token: those every row sees from its rows
        # (TMA), the diagonal ones, masked, from the cache (rope_store_kv stored them).
        b0 = split * blocks_per_split
        b1 = tl.minimum(b0 + blocks_per_split, num_blocks)
        p_lo = b0 * BLOCK_N
        p_hi = tl.minimum(tl.minimum(b1, prefix_blocks) * BLOCK_N, context_len)
        p_full = (context_len // BLOCK_N) * BLOCK_N
        acc, m_i, l_i = _attend_key_range(
            acc, m_i, l_i, q, q_pos, p_lo, tl.minimum(p_hi, p_full),
            k_base, v_base, page_row_ptr, stride_k_slot, stride_v_slot, context_len,
            sliding_window, qk_scale, softcap,
            BLOCK_N, HEAD_DIM, PAGE_SIZE, False, False, USE_SOFTCAP, DOT_PRECISION,
            PREFETCH_PAGES,
        )  # fmt: skip
        acc, m_i, l_i = _attend_key_range(
            acc, m_i, l_i, q, q_pos, tl.maximum(p_lo, p_full), p_hi,
            k_base, v_base, page_row_ptr, stride_k_slot, stride_v_slot, context_len,
            sliding_window, qk_scale, softcap,
            BLOCK_N, HEAD_DIM, PAGE_SIZE, True, False, USE_SOFTCAP, DOT_PRECISION,
            PREFETCH_PAGES,
        )  # fmt: skip
        n_lo = (tl.maximum(b0, prefix_blocks) - prefix_blocks) * BLOCK_N
        n_hi = tl.minimum((b1 - prefix_blocks) * BLOCK_N, kv_hi - context_len)
        n_full = ((q_block * BLOCK_Q + 1) // BLOCK_N) * BLOCK_N
        acc, m_i, l_i = _attend_new_keys(
            acc, m_i, l_i, q, n_lo, tl.minimum(n_hi, n_full), k_desc, v_desc, q_start, kv_head,
            qk_scale, softcap, BLOCK_N, HEAD_DIM, USE_SOFTCAP, DOT_PRECISION,
        )  # fmt: skip
        acc, m_i, l_i = _attend_key_range(
            acc, m_i, l_i, q, q_pos, context_len + tl.maximum(n_lo, n_full), context_len + n_hi,
            k_base, v_base, page_row_ptr, stride_k_slot, stride_v_slot, seq_len,
            sliding_window, qk_scale, softcap,
            BLOCK_N, HEAD_DIM, PAGE_SIZE, True, False, USE_SOFTCAP, DOT_PRECISION,
            PREFETCH_PAGES,
        )  # fmt: skip
    elif ONE_RANGE:  # the whole slice in one masked loop (AttentionTiles.one_range)
        acc, m_i, l_i = _attend_key_range(
            acc, m_i, l_i, q, q_pos, split_lo, split_hi,
            k_base, v_base, page_row_ptr, stride_k_slot, stride_v_slot, seq_len,
            sliding_window, qk_scale, softcap,
            BLOCK_N, HEAD_DIM, PAGE_SIZE, True, USE_WINDOW, USE_SOFTCAP, DOT_PRECISION,
            PREFETCH_PAGES,
        )  # fmt: skip
    else:
        acc, m_i, l_i = _attend_key_range(
            acc, m_i, l_i, q, q_pos, split_lo, tl.minimum(split_hi, full_lo),
            k_base, v_base, page_row_ptr, stride_k_slot, stride_v_slot, seq_len,
            sliding_window, qk_scale, softcap,
            BLOCK_N, HEAD_DIM, PAGE_SIZE, True, USE_WINDOW, USE_SOFTCAP, DOT_PRECISION,
            PREFETCH_PAGES,
        )  # fmt: skip
        acc, m_i, l_i = _attend_key_range(
            acc, m_i, l_i, q, q_pos, tl.maximum(split_lo, full_lo), tl.minimum(split_hi, full_hi),
            k_base, v_base, page_row_ptr, stride_k_slot, stride_v_slot, seq_len,
            sliding_window, qk_scale, softcap,
            BLOCK_N, HEAD_DIM, PAGE_SIZE, False, USE_WINDOW, USE_SOFTCAP, DOT_PRECISION,
            PREFETCH_PAGES,
        )  # fmt: skip
        acc, m_i, l_i = _attend_key_range(
            acc, m_i, l_i, q, q_pos, tl.maximum(split_lo, full_hi), split_hi,
            k_base, v_base, page_row_ptr, stride_k_slot, stride_v_slot, seq_len,
            sliding_window, qk_scale, softcap,
            BLOCK_N, HEAD_DIM, PAGE_SIZE, True, USE_WINDOW, USE_SOFTCAP, DOT_PRECISION,
            PREFETCH_PAGES,
        )  # fmt: skip

    # One-slice launches (every extend tile) leave the merge out: unrolled over BLOCK_M rows it
    # multiplied their compile time (minutes for the GPU tests' extend shapes) for nothing.
    if MAY_SPLIT and active_splits > 1:
        # Write this slice's partial as it stands, unnormalized, with its max and sum (an
        # empty slice: 0, -inf, 0; normalizing here cost a division an element and a precise
        # log2 a row on every slice's path), then count it in; the barrier orders every
        # thread's stores before the atomic.
        row = (token * NUM_Q_HEADS + q_head) * num_splits + split
        tl.store(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], acc,
                 mask=row_valid[:, None])  # fmt: skip
        tl.store(part_ml_ptr + 2 * row, m_i, mask=row_valid)
        tl.store(part_ml_ptr + 2 * row + 1, l_i, mask=row_valid)
        tl.debug_barrier()
        counter = counters_ptr + tl.program_id(0) * tl.num_programs(1) + kv_head
        if tl.atomic_add(counter, 1, sem="acq_rel") != active_splits - 1:
            return  # another slice is still running; the last one merges
        # a one-row tile's rows past its group are the dot's padding: merged, they cost the
        # last slice instructions (qwen3-0.6b: ~350 of them, 16 rows for 2) and store nothing
        MERGE_END: tl.constexpr = MERGE_ROWS if BLOCK_Q == 1 else BLOCK_M
        for r0 in tl.static_range(0, MERGE_END, MERGE_ROWS):
            _merge_rows(
                out_ptr, part_out_ptr, part_ml_ptr, sinks_ptr, r0, q_start, q_block, q_len,
                kv_head, active_splits, num_splits, stride_o_tok, stride_o_head,
                NUM_Q_HEADS, GROUP, GROUP_PAD, BLOCK_Q, MERGE_ROWS, HEAD_DIM, SPLITS_CAP,
                HAS_SINKS,
            )  # fmt: skip
        tl.store(counter, 0)  # every slice has counted in: ready for the next launch
        return
    _store_rows(acc, m_i, l_i, out_ptr, sinks_ptr, token, q_head, head_valid, row_valid,
                stride_o_tok, stride_o_head, HEAD_DIM, HAS_SINKS)  # fmt: skip


@triton.jit
def _rope_inputs(positions_ptr, cos_sin_ptr, q_norm_ptr, k_norm_ptr, token, stride_cos_sin,
                 HAS_Q_NORM: tl.constexpr, HAS_K_NORM: tl.constexpr,
                 HEAD_DIM: tl.constexpr):  # fmt: skip
    """The token's rotation as two [HEAD_DIM] fp32 vectors, cos and the sign-carrying sin
    (element d meets its partner (d + HEAD_DIM/2) % HEAD_DIM: -sin in the first half, +sin in
    the second), and the q and k norm weights at d and at the partner (ones without a norm).
    Vectors, not [1, HEAD_DIM] tiles: they broadcast over a tile's rows in the tile's own
    layout (a [1, HEAD_DIM] tile measured ~1% slower in the batch-1 decode)."""
    HALF: tl.constexpr = HEAD_DIM // 2
    offs_d = tl.arange(0, HEAD_DIM)
    partner = (offs_d + HALF) % HEAD_DIM
    cos, sin = _cos_sin(positions_ptr, cos_sin_ptr, token, stride_cos_sin, HEAD_DIM)
    ones = tl.full([HEAD_DIM], 1.0, tl.float32)
    q_w, q_wp, k_w, k_wp = ones, ones, ones, ones
    if HAS_Q_NORM:
        q_w = tl.load(q_norm_ptr + offs_d).to(tl.float32)
        q_wp = tl.load(q_norm_ptr + partner).to(tl.float32)
    if HAS_K_NORM:
        k_w = tl.load(k_norm_ptr + offs_d).to(tl.float32)
        k_wp = tl.load(k_norm_ptr + partner).to(tl.float32)
    return cos, sin, q_w, q_wp, k_w, k_wp


@triton.jit
def _cos_sin(positions_ptr, cos_sin_ptr, token, stride_cos_sin, HEAD_DIM: tl.constexpr):
    # a function of its own: inlined here, the same arithmetic compiled to other SASS than the
    # tree measured on the H200 (instruction order); keep it as it is
    HALF: tl.constexpr = HEAD_DIM // 2
    offs_d = tl.arange(0, HEAD_DIM)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    cols = cos_sin_ptr + pos * stride_cos_sin + offs_d % HALF
    cos = tl.load(cols).to(tl.float32)
    sin = tl.load(cols + HALF).to(tl.float32)
    return cos, tl.where(offs_d < HALF, -1.0, 1.0) * sin  # exact: a sign


@triton.jit
def _zero_padded_rows(out_ptr, num_tokens_ptr, num_rows, kv_head, stride_o_tok, stride_o_head,
                      GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                      HEAD_DIM: tl.constexpr):  # fmt: skip
    """Zeros into this kv head's query heads of the output rows past the live ones."""
    heads = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    ptrs = out_ptr + (kv_head * GROUP + heads)[:, None] * stride_o_head + offs_d[None, :]
    zeros = tl.zeros([GROUP_PAD, HEAD_DIM], out_ptr.dtype.element_ty)
    for row in range(tl.load(num_tokens_ptr), num_rows):
        tl.store(ptrs + row * stride_o_tok, zeros, mask=(heads < GROUP)[:, None])


@triton.jit
def _norm_rope_rows(row_ptrs, row_valid, cos, sin, w, wp, eps, HAS_NORM: tl.constexpr,
                    HEAD_DIM: tl.constexpr):  # fmt: skip
    """Rows [R, HEAD_DIM] of one token, RMS-normed (HAS_NORM: weights ``w`` at d, ``wp`` at
    the partner) and rotated (``_rope_inputs``), in fp32, not yet rounded. The same arithmetic
    as rope_store_kv (its halves x1, x2 become x1 cos - x2 sin and x2 cos + x1 sin; here each
    element meets its partner in the other half) with the same rounding once the caller casts,
    but the fp32 sum of squares runs in another order (one sum over HEAD_DIM here, two half
    sums there): last-bit differences."""
    HALF: tl.constexpr = HEAD_DIM // 2
    offs_d = tl.arange(0, HEAD_DIM)
    partner = (offs_d + HALF) % HEAD_DIM
    x = tl.load(row_ptrs + offs_d[None, :], mask=row_valid[:, None], other=0.0).to(tl.float32)
    xp = tl.load(row_ptrs + partner[None, :], mask=row_valid[:, None], other=0.0)
    xp = xp.to(tl.float32)
    if HAS_NORM:
        inv_rms = tl.rsqrt(tl.sum(x * x, 1) / HEAD_DIM + eps)
        x = x * inv_rms[:, None] * w[None, :]
        xp = xp * inv_rms[:, None] * wp[None, :]
    return x * cos + xp * sin  # cos, sin: [HEAD_DIM], broadcast over the rows


@triton.jit
def _load_q(q_ptrs, row_valid, rope, eps, ROPE: tl.constexpr, HAS_Q_NORM: tl.constexpr,
            HEAD_DIM: tl.constexpr):  # fmt: skip
    """The query rows of a tile; with ROPE q is this forward's projection, normed and rotated
    here (``rope``: ``_rope_inputs``) and rounded to its dtype where rope_store_kv rounds it."""
    if ROPE:
        cos, sin, q_w, q_wp, _, _ = rope
        q = _norm_rope_rows(q_ptrs, row_valid, cos, sin, q_w, q_wp, eps, HAS_Q_NORM, HEAD_DIM)
        return q.to(q_ptrs.dtype.element_ty)
    offs_d = tl.arange(0, HEAD_DIM)
    return tl.load(q_ptrs + offs_d[None, :], mask=row_valid[:, None], other=0.0)


@triton.jit
def _rope_store_new_kv(k_row, v_row, k_base, v_base, slot, rope, stride_k_slot, stride_v_slot,
                       eps, HAS_K_NORM: tl.constexpr, HEAD_DIM: tl.constexpr):  # fmt: skip
    """This kv head's new key (normed, rotated) and value (at ``k_row``/``v_row``, [1]
    pointers) into the cache at ``slot`` ([1]; -1: a padded token, not stored), by the one
    program whose key range holds it; it reads that slot back in its key loop, after the
    barrier."""
    offs_d = tl.arange(0, HEAD_DIM)
    write = slot >= 0
    cos, sin, _, _, k_w, k_wp = rope
    k = _norm_rope_rows(k_row[:, None], write, cos, sin, k_w, k_wp, eps, HAS_K_NORM, HEAD_DIM)
    v = tl.load(v_row[:, None] + offs_d[None, :], mask=write[:, None], other=0.0)
    tl.store(k_base + slot[:, None] * stride_k_slot + offs_d[None, :],
             k.to(k_base.dtype.element_ty), mask=write[:, None])  # fmt: skip
    tl.store(v_base + slot[:, None] * stride_v_slot + offs_d[None, :],
             v.to(v_base.dtype.element_ty), mask=write[:, None])  # fmt: skip
    tl.debug_barrier()  # every thread's stores before any thread's loads of that slot


@triton.jit
def _prefetch_l2(k_base, v_base, page_row_ptr, lo, hi, stride_k_slot, stride_v_slot,
                 BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
                 LINES: tl.constexpr, BLOCKS: tl.constexpr = 2):  # fmt: skip
    """An L2 prefetch of the keys and values at [lo, min(hi, lo + BLOCKS * BLOCK_N)), one per
    128-byte line (LINES to a head row); positions past hi take page 0's lines, which nothing
    reads."""
    pos = lo + tl.arange(0, BLOCKS * BLOCK_N)
    page = tl.load(page_row_ptr + pos // PAGE_SIZE, mask=pos < hi, other=0)
    slot = page.to(tl.int64) * PAGE_SIZE + pos % PAGE_SIZE
    line = tl.arange(0, LINES) * (HEAD_DIM // LINES)
    pdl.prefetch_l2(k_base + slot[:, None] * stride_k_slot + line[None, :])
    pdl.prefetch_l2(v_base + slot[:, None] * stride_v_slot + line[None, :])


@triton.jit
def _store_rows(
    acc,
    m_i,
    l_i,
    out_ptr,
    sinks_ptr,
    token,
    q_head,
    head_valid,
    row_valid,
    stride_o_tok,
    stride_o_head,
    HEAD_DIM: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    """Normalize and store finished rows; a sink logit joins the denominator only."""
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + q_head, mask=head_valid, other=float("-inf"))
        sink = sink.to(tl.float32) * 1.4426950408889634
        m_fin = tl.maximum(m_i, sink)
        m_sub = tl.where(m_fin == float("-inf"), 0.0, m_fin)
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.math.exp2(sink - m_sub)
        acc = acc * alpha[:, None]
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    offs_d = tl.arange(0, HEAD_DIM)
    o_ptrs = out_ptr + token[:, None] * stride_o_tok + q_head[:, None] * stride_o_head
    tl.store(o_ptrs + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])


@triton.jit
def _merge_rows(out_ptr, part_out_ptr, part_ml_ptr, sinks_ptr, r0, q_start, q_block, q_len,
                kv_head, active_splits, num_splits, stride_o_tok, stride_o_head,
                NUM_Q_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                BLOCK_Q: tl.constexpr, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr,
                SPLITS_CAP: tl.constexpr, HAS_SINKS: tl.constexpr,
                MERGE_UNROLL: tl.constexpr = 8):  # fmt: skip
    """Combine every slice's partial for rows [r0, r0 + ROWS) of a tile. A few rows at a time
    keep the merge's registers small (it is compiled into the attention kernel). Loads go past
    L1: other SMs wrote the partials."""
    offs_m = r0 + tl.arange(0, ROWS)
    offs_d = tl.arange(0, HEAD_DIM)
    q_local = q_block * BLOCK_Q + offs_m // GROUP_PAD
    head_in_group = offs_m % GROUP_PAD
    q_head = kv_head * GROUP + head_in_group
    head_valid = head_in_group < GROUP
    row_valid = (q_local < q_len) & head_valid
    token = (q_start + q_local).to(tl.int64)
    row = (token * NUM_Q_HEADS + q_head) * num_splits
    # Every slice's max and sum in one load give the final max and denominator up front, so
    # the partials then only accumulate: their loads do not wait on one another, and a chunk
    # of MERGE_UNROLL of them is in flight at once (a serial online merge paid one L2 round
    # trip per slice).
    offs_s = tl.arange(0, SPLITS_CAP)
    at = part_ml_ptr + 2 * (row[:, None] + offs_s[None, :])
    live = row_valid[:, None] & (offs_s[None, :] < active_splits)
    m_s = tl.load(at, mask=live, other=float("-inf"), cache_modifier=".cg")
    l_s = tl.load(at + 1, mask=live, other=0.0, cache_modifier=".cg")
    m_i = tl.max(m_s, 1)
    m_sub = tl.where(m_i == float("-inf"), 0.0, m_i)
    l_i = tl.sum(l_s * tl.math.exp2(m_s - m_sub[:, None]), 1)
    acc = tl.zeros([ROWS, HEAD_DIM], tl.float32)
    for first in range(0, active_splits, MERGE_UNROLL):
        for j in tl.static_range(MERGE_UNROLL):
            s = first + j
            use = row_valid & ((offs_m * 0 + s) < active_splits)  # a [ROWS] mask
            m_j = tl.load(part_ml_ptr + 2 * (row + s), mask=use, other=float("-inf"),
                          cache_modifier=".cg")  # fmt: skip
            part_s = tl.load(part_out_ptr + (row + s)[:, None] * HEAD_DIM + offs_d[None, :],
                             mask=use[:, None], other=0.0, cache_modifier=".cg")  # fmt: skip
            acc += part_s * tl.math.exp2(m_j - m_sub)[:, None]
    _store_rows(acc, m_i, l_i, out_ptr, sinks_ptr, token, q_head, head_valid, row_valid,
                stride_o_tok, stride_o_head, HEAD_DIM, HAS_SINKS)  # fmt: skip
