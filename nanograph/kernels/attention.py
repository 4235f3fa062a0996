"""Graph-safe paged attention in Triton: extend/prefill, decode and target-verify through one
kernel (``kernels.attention_kernel``: its work split, split-KV merge and grid layouts), and
on sm_90 the long requests of an extend through ``kernels.attention_hopper``.

Layouts (fixed; the engine writes these):
- ``q [N, Hq, D]``; ``k_cache``/``v_cache [num_slots, Hkv, D]`` with
  ``slot = page_id * page_size + offset_in_page``.
- ``page_table [S, max_pages]``, ``seq_lens [S]`` (KV length after this forward),
  ``query_lens [S]``, ``query_start_loc [S + 1]``: int32 device tensors.
- Query token i of request r sits at position ``seq_lens[r] - query_lens[r] + i`` and sees keys
  at positions ``<=`` its own (and ``> pos - sliding_window`` when a window is set). Every key,
  including this forward's, is in the paged cache: the rope+store kernel wrote them, or, in a
  decode given ``rope`` (``RopeStore``), the program whose slice holds the request's new key
  stored it (rotated) just before its key loop. An extend given ``new_kv`` (this forward's
  rows) reads the blocks of new keys that every row of a tile sees from those rows by TMA.

Invariants:
- Grids depend only on static sizes (N, S, head counts, constexpr tiles and split count); no
  host reads of lengths, so a launch can be captured in a CUDA graph and replayed for any batch
  that fits the same buffers. Programs with nothing to do exit at once.
- A zero-length sentinel slot (seq_len = query_len = 0, start parked at the real token count)
  and padded rows (at or past ``query_start_loc[S]``) read nothing and write nothing; an ``out``
  allocated here is zero-filled, so those rows read as zeros.
- Launch configurations come from ``kernels.attention_tiles`` (static sizes only). An extend
  call is one launch or two there (``launch_plan``): each program leaves the requests outside
  its launch's query_len range alone.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from nanograph.kernels import pdl
from nanograph.kernels.attention_kernel import _paged_attention_kernel
from nanograph.kernels.attention_tiles import (
    MAX_QUERY_LEN,
    MAX_SPLITS,
    AttentionTiles,
    current_forced_tiles,
    launch_plan,
)
from nanograph.kernels.counters import split_counters
from nanograph.kernels.launch import LaunchCache
from nanograph.kernels.tma import rows_descriptor


@dataclass(frozen=True)
class RopeStore:
    """A decode's rotary and KV store, done by the attention kernel instead of
    ``fused.rope_store_kv`` (one kernel less a layer): q is then the projection as written,
    and ``k``/``v`` this forward's keys and values ``[N, Hkv, D]``, a row per request; each
    program rotates its request's q rows, and the one whose slice holds the new position
    norms, rotates and stores that key at the request's ``slot_mapping`` entry (-1: not
    stored) before reading it back. q and k are left as they are (nothing reads them later).
    With ``num_tokens`` the launch also zeroes the output rows past it (a graph's padding), as
    rope_store_kv does."""

    k: torch.Tensor
    v: torch.Tensor
    positions: torch.Tensor  # [>= 1]
    cos_sin_cache: torch.Tensor  # [max_position, D]: cos then sin halves
    slot_mapping: torch.Tensor  # int64 [>= 1]
    q_norm: torch.Tensor | None = None  # [D]
    k_norm: torch.Tensor | None = None
    eps: float = 1e-6
    # int32 [1], the true token count: padded rows (slot -1) are not stored, and their output
    # rows are zeroed
    num_tokens: torch.Tensor | None = None


# its variants compile ahead in parallel at start-up (launch.py: parallel_compiles)
_launch_attention = LaunchCache(_paged_attention_kernel, compile_ahead=True)


_PLACEHOLDERS: dict[torch.device, torch.Tensor] = {}


# An extend's requests of at least this many query tokens go to ``kernels.attention_hopper``
# where it supports the batch (sm_90): a 128-row tile of a shorter request computes rows for
# nothing, where this kernel's short tiles pack the GQA group.
HOPPER_MIN_QUERY_LEN = 128
HOPPER_SWITCH = "NANOGRAPH_HOPPER_ATTENTION"  # "0": never the Hopper extend (A/B runs)


def _float32_placeholder(device: torch.device) -> torch.Tensor:
    """A persistent fp32 tensor standing in for the split partials of a one-slice launch."""
    if device not in _PLACEHOLDERS:
        _PLACEHOLDERS[device] = torch.zeros(16, dtype=torch.float32, device=device)
    return _PLACEHOLDERS[device]


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    page_size: int,
    scale: float,
    *,
    sliding_window: int = 0,
    sinks: torch.Tensor | None = None,
    softcap: float = 0.0,
    max_query_len: int | None = None,
    num_splits: int | None = None,
    tiles: AttentionTiles | None = None,
    query_len_range: tuple[int, int] = (0, MAX_QUERY_LEN),
    out: torch.Tensor | None = None,
    rope: RopeStore | None = None,
    new_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Causal attention of ``q [N, Hq, D]`` over the paged cache; returns ``[N, Hq, D]``.

    ``max_query_len`` is a static upper bound on any request's query_len (1 for decode, k+1 for
    target-verify; None for extend); tokens past it are not computed. ``sinks`` is fp32 ``[Hq]``
    (one learned logit per head, in the denominator only); ``softcap > 0`` caps logits as
    ``softcap * tanh(s / softcap)``; ``sliding_window > 0`` keeps keys with
    ``pos - window < key_pos <= pos``. ``num_splits``/``tiles`` override the static launch
    configuration (benchmarks, tests); ``query_len_range`` (inclusive) restricts a launch to
    the requests whose query_len lies in it (rows of the others are left as ``out`` holds
    them), and a launch of a tile kind or kernel whose share of that range is empty is left
    out (once that kind has run in this process: ``_skippable``). An eager call passes its
    batch's live range there (``attention.triton_backend``): a prompt of 256 tokens then takes
    one launch a layer, not the Hopper kernel's and an empty one of Triton's for short
    requests.

    An extend batch that may mix short and long requests (more than SHORT_REQUEST_TOKENS
    tokens, but few enough a request on average to count as short) runs as two launches, each
    in its own tiles: requests of at most SHORT_REQUEST_TOKENS query tokens, then the longer
    ones. The split is by each request's length on the device, so it holds in a CUDA graph
    captured for request slots of any length (a prefill graph of 8192 tokens x 16 slots runs
    one 8192-token prompt in the long tiles).

    ``rope``: q is not yet rotated and this forward's keys and values are not in the cache;
    the kernel does what ``rope_store_kv`` would have in a decode launch (``max_query_len`` 1,
    per-request one-token tiles, any number of requests); any other launch (a verify or an
    extend, forced tiles of another kind) runs ``rope_store_kv`` first.

    ``new_kv``: this forward's keys (rotated) and values ``[N, Hkv, D]``, a row per row of q,
    as they were stored in the cache. An extend in tiles that take them
    (``AttentionTiles.new_keys``, no window) reads a request's keys past its cached prefix
    from these rows through TMA descriptors instead of gathering them from the pages (in the
    cache's dtype, laid out as TMA needs: contiguous heads, 16-byte aligned rows; else the
    cache is read). On Hopper, an extend with ``new_kv`` that ``kernels.attention_hopper``
    supports (bf16, head_dim 128, 16-slot pages, no window, sinks or softcap) runs its requests
    of at least ``HOPPER_MIN_QUERY_LEN`` (128) query tokens in that module's Gluon kernel
    (FA3's structure) and the shorter ones here.
    """
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    num_seqs = seq_lens.shape[0]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"{num_q_heads} q heads are not a multiple of {num_kv_heads} kv heads")
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two >= 16, got {head_dim}")
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("q and the KV cache must be contiguous in head_dim")
    if page_table.stride(-1) != 1:
        raise ValueError("page_table must be contiguous in its last dim")
    tiles = tiles or current_forced_tiles()
    lo, hi = query_len_range
    if tiles is not None:
        launches = [(tiles, (lo, hi))]
    else:
        plan = launch_plan(
            q.device, num_tokens, num_seqs, num_q_heads, num_kv_heads, head_dim, max_query_len,
            num_splits, q.dtype == torch.float32,
        )  # fmt: skip
        launches = [(t, (max(lo, a), min(hi, b))) for t, (a, b) in plan]
    if out is None:
        out = torch.zeros_like(q)
    if rope is not None:
        if rope.k.shape[0] != num_tokens or rope.v.shape[0] != num_tokens:
            raise ValueError(f"rope's k and v need a row per row of q ({num_tokens}), got "
                             f"{rope.k.shape[0]} and {rope.v.shape[0]}")  # fmt: skip
        if rope.k.stride(-1) != 1 or rope.v.stride(-1) != 1 or rope.cos_sin_cache.stride(-1) != 1:
            raise ValueError("rope's k, v and cos_sin_cache must be contiguous in their last dim")
        if rope.cos_sin_cache.shape[-1] != head_dim:
            raise ValueError(f"cos_sin_cache rows hold cos then sin halves of head_dim "
                             f"{head_dim}, got {rope.cos_sin_cache.shape[-1]} wide")  # fmt: skip
        tiles0 = launches[0][0]
        decode = max_query_len == 1 and tiles0.per_request and tiles0.block_q == 1
        if len(launches) > 1 or not decode:
            _rope_store_kv(q, k_cache, v_cache, rope, out)
            rope = None
    if new_kv is not None:
        for x in new_kv:
            if x.shape != (num_tokens, num_kv_heads, head_dim):
                raise ValueError(f"new_kv needs [{num_tokens}, {num_kv_heads}, {head_dim}] rows "
                                 f"(a row per row of q), got {list(x.shape)}")  # fmt: skip
    if num_tokens == 0 or num_seqs == 0:
        return out
    hopper = None
    # an extend (the static hint is N there, or None) with room for a request Hopper's takes
    if tiles is None and rope is None and (max_query_len or MAX_QUERY_LEN) >= HOPPER_MIN_QUERY_LEN:
        hopper = hopper_extend(q, k_cache, v_cache, new_kv, out, page_size, sliding_window,
                               sinks, softcap)  # fmt: skip
    # what the compiled kernel of a launch depends on besides its tiles (see _LAUNCHED)
    variant = (
        q.device, q.dtype, num_q_heads, num_kv_heads, head_dim, page_size, sliding_window > 0,
        sinks is not None, softcap > 0.0, new_kv is not None,
    )  # fmt: skip
    if hopper is not None:  # the long requests there, the short ones in Triton's launches
        short = HOPPER_MIN_QUERY_LEN - 1
        launches = [(t, (a, min(b, short))) for t, (a, b) in launches]
        kind = ("hopper", *variant)
        if not _skippable(kind, max(lo, HOPPER_MIN_QUERY_LEN), hi):
            hopper(
                q, new_kv, k_cache, v_cache, page_table, seq_lens, query_lens, query_start_loc,
                scale, out, min_q_len=max(lo, HOPPER_MIN_QUERY_LEN),
            )  # fmt: skip
            _LAUNCHED.add(kind)
    launched = True
    for launch_tiles, (min_q_len, max_q_len) in launches:
        # per-request tiles compile their q blocks a request (from the static hint) in
        kind = (launch_tiles, launch_tiles.per_request and max_query_len, rope is not None,
                *variant)  # fmt: skip
        if _skippable(kind, min_q_len, max_q_len):
            continue
        ran = _launch(
            q, k_cache, v_cache, page_table, seq_lens, query_lens, query_start_loc, page_size,
            scale, sliding_window, sinks, softcap, max_query_len, launch_tiles, min_q_len,
            max_q_len, out, rope, new_kv,
        )  # fmt: skip
        if ran:
            _LAUNCHED.add(kind)
        launched &= ran
    if not launched:  # compiled only (start-up): what follows reads defined values
        out.zero_()
    return out


# Launch kinds (a kernel and what its compiled variant depends on) launched at least once in
# this process, not only compiled. A launch whose query-length range holds no request is left
# out only once its kind has run: a kernel's first launch loads its module, which a stream
# capture forbids (cuModuleLoadData), and a capture is preceded by an eager run of its shape
# (the graph layer's warm-up, or a break's own eager call), which then launches every kind the
# capture will.
_LAUNCHED: set[tuple] = set()


def _skippable(kind: tuple, min_q_len: int, max_q_len: int) -> bool:
    """Whether a launch over the requests of ``min_q_len..max_q_len`` query tokens can be left
    out: the range is empty and its kind has run here before."""
    return min_q_len > max_q_len and kind in _LAUNCHED


def hopper_extend(q, k_cache, v_cache, new_kv, out, page_size, sliding_window, sinks,
                   softcap):  # fmt: skip
    """The Hopper extend's launch for these inputs (``kernels.attention_hopper.extend_attention``
    with its TMA descriptors bound: a call takes that function's other arguments) where that
    module supports them (its docstring says when), else None; ``NANOGRAPH_HOPPER_ATTENTION=0``
    makes it None. Imported here, on a CUDA extend only: it needs Triton's Gluon."""
    if new_kv is None or not q.is_cuda or os.environ.get(HOPPER_SWITCH) == "0":
        return None
    try:
        from nanograph.kernels import attention_hopper
    except ImportError:  # a Triton without Gluon's Hopper layer
        return None
    args = (q, k_cache, v_cache, new_kv, out, page_size, sliding_window, sinks, softcap)
    descriptors = attention_hopper.launch_descriptors(*args)
    if descriptors is None:
        return None
    return functools.partial(attention_hopper.extend_attention, descriptors=descriptors)


def _rope_store_kv(q, k_cache, v_cache, rope: RopeStore, out: torch.Tensor) -> None:
    from nanograph.kernels.fused import rope_store_kv

    rope_store_kv(
        q, rope.k, rope.v, rope.positions, rope.cos_sin_cache, k_cache, v_cache,
        rope.slot_mapping, q_norm_weight=rope.q_norm, k_norm_weight=rope.k_norm, eps=rope.eps,
        num_tokens=rope.num_tokens, zero_padding=out if rope.num_tokens is not None else None,
    )  # fmt: skip


def _launch(
    q, k_cache, v_cache, page_table, seq_lens, query_lens, query_start_loc, page_size, scale,
    sliding_window, sinks, softcap, max_query_len, tiles, min_q_len, max_q_len, out, rope,
    new_kv,
) -> bool:  # fmt: skip
    """One launch of the kernel in ``tiles`` over the requests whose query_len lies in
    [min_q_len, max_q_len]; False if it only compiled (start-up)."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    num_seqs = seq_lens.shape[0]
    if tiles.num_splits > 1:
        part_out = torch.empty(
            (num_tokens, num_q_heads, tiles.num_splits, head_dim),
            dtype=torch.float32,
            device=q.device,
        )
        part_ml = torch.empty(  # each partial's running max and sum
            (num_tokens, num_q_heads, tiles.num_splits, 2), dtype=torch.float32, device=q.device
        )
    else:
        # unused by a one-slice launch, but of the split launches' types, so that both take
        # the same compiled kernel (pointer dtypes are part of a variant)
        part_out = part_ml = _float32_placeholder(q.device)
    if tiles.per_request:
        assert max_query_len is not None
        q_blocks_per_request = triton.cdiv(max_query_len, tiles.block_q)
        grid0 = num_seqs * q_blocks_per_request
    else:
        q_blocks_per_request = 0
        grid0 = num_tokens // tiles.block_q + num_seqs
    use_softcap = softcap > 0.0
    # Without softcap, fold log2(e) into the scale so the loop uses exp2 directly.
    qk_scale = scale if use_softcap else scale * math.log2(math.e)
    counters = split_counters(q.device, grid0 * num_kv_heads)
    pdl_wait = tiles.pdl_wait and pdl.enabled(q)
    # without rope, its pointers are placeholders of fixed dtypes (one variant for all)
    r = rope or RopeStore(q, q, seq_lens, out, seq_lens)
    # a function of the tiles, not of the batch, so that the start-up warm-up compiles every
    # variant a request meets: one-row tiles (pdl_wait: chosen for one row only) have no padding
    zero_padding = rope is not None and rope.num_tokens is not None and not tiles.pdl_wait
    descriptors = (None, None)
    if tiles.new_keys and new_kv is not None and sliding_window == 0:
        descriptors = tuple(
            rows_descriptor(x, tiles.block_n, TensorDescriptor) if x.dtype == k_cache.dtype
            else None for x in new_kv
        )  # fmt: skip
    new_keys = None not in descriptors
    # without new keys, the descriptors' places take a placeholder pointer
    k_desc, v_desc = descriptors if new_keys else (q, q)
    launched = _launch_attention(
        (grid0, num_kv_heads, tiles.num_splits),
        (
            q, k_cache, v_cache, out, part_out, part_ml, counters,
            sinks if sinks is not None else out,
            page_table, seq_lens, query_lens, query_start_loc,
            r.k, r.v, r.positions, r.cos_sin_cache, r.slot_mapping,
            r.q_norm if r.q_norm is not None else q, r.k_norm if r.k_norm is not None else q,
            r.num_tokens if r.num_tokens is not None else seq_lens,
        ),
        (
            num_seqs, tiles.num_splits, min_q_len, max_q_len,
            num_tokens if zero_padding else 0,
            page_table.stride(0),
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
            v_cache.stride(0), v_cache.stride(1), out.stride(0), out.stride(1),
            qk_scale, float(softcap), int(sliding_window),
            r.k.stride(0), r.k.stride(1), r.v.stride(0), r.v.stride(1),
            r.cos_sin_cache.stride(0), float(r.eps),
        ),
        dict(
            NUM_Q_HEADS=num_q_heads,
            GROUP=num_q_heads // num_kv_heads,
            GROUP_PAD=tiles.group_pad,
            BLOCK_Q=tiles.block_q,
            BLOCK_M=tiles.block_q * tiles.group_pad,
            BLOCK_N=tiles.block_n,
            HEAD_DIM=head_dim,
            PAGE_SIZE=page_size,
            Q_BLOCKS_PER_REQUEST=q_blocks_per_request,
            SPLITS_CAP=max(MAX_SPLITS, tiles.num_splits),
            MAY_SPLIT=tiles.num_splits > 1,
            MIN_SPLIT_BLOCKS=tiles.min_split_blocks,
            MIN_SLICES=tiles.min_slices,
            PREFETCH_PAGES=tiles.prefetch_pages,
            # a one-row tile merges only its group's rows (the kernel's MERGE_END)
            MERGE_ROWS=(
                triton.next_power_of_2(num_q_heads // num_kv_heads) if tiles.block_q == 1
                else min(tiles.block_q * tiles.group_pad, 16)
            ),
            USE_WINDOW=sliding_window > 0,
            USE_SOFTCAP=use_softcap,
            HAS_SINKS=sinks is not None,
            # fp32 inputs: exact products (tests, references). tf32x3 compiles faster but its
            # tiles overflow shared memory on the H200 (262,400 of 232,448 bytes, e13b5e9)
            DOT_PRECISION="ieee" if q.dtype == torch.float32 else None,
            PDL=pdl.enabled(q),
            PDL_WAIT=pdl_wait,
            L2_LINES=max(head_dim * k_cache.element_size() // 128, 1),
            ROPE=rope is not None,
            HAS_Q_NORM=rope is not None and rope.q_norm is not None,
            HAS_K_NORM=rope is not None and rope.k_norm is not None,
            ZERO_PADDING=zero_padding,
            NEW_KEYS=new_keys,
            ONE_RANGE=tiles.one_range,
            num_warps=tiles.num_warps,
            num_stages=tiles.num_stages,
            launch_pdl=pdl_wait,
        ),
        descriptors=(k_desc, v_desc),
    )  # fmt: skip
    return launched
