"""Launch configurations of the paged attention kernel (``kernels.attention``), from static
sizes only: what a CUDA graph can hold, since a graph replays the grid and the tiles it was
captured with for every batch that fits its buffers.

Invariants:
- ``choose_tiles`` and ``launch_plan`` are pure functions of the device, the token and request
  counts, the head layout, the static ``max_query_len`` hint and the dtype class; no length is
  read on the host. Tests run them on CPU (small tiles there, so the interpreter covers several
  blocks a request).
- Two layouts of the first grid dim: *per request* (decode, verify: a request's query fits
  SMALL_QUERY_ROWS rows) and *flat* (extend: ``N // BLOCK_Q + S`` programs, each finding its
  request). An extend batch short on average but with room for a longer request launches once
  per length class (``launch_plan``), so a prefill graph of 16 slots runs one long prompt in
  long-prompt tiles.
- ``tile_variants`` lists every configuration ``choose_tiles`` can return for a head layout,
  so the start-up warm-up compiles each one a request can meet (``forced_tiles``).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import triton

# Largest split count. The last split of a tile merges the partials one split at a time, so
# more splits cost merge latency: on the H200, 1 x 32k decode (qwen3-8b heads) took 58 us at 32
# splits, 66 at 64 and 97 at 128 (``nanograph bench attention --sweep``).
MAX_SPLITS = 32
# A grid this many times the SM count keeps every SM busy through the tail of the launch.
PROGRAMS_PER_SM = 4
# The small-query (memory-bound) regime: query tokens x padded group rows per request up to this
# fit one tile, so the per-request layout wastes nothing and split-KV pays off.
SMALL_QUERY_ROWS = 64
# A one-row decode's key slices (the prefetching configuration): (at least this many key
# blocks a slice, but at least this many slices while the range has that many blocks). Up to
# 8 blocks (512 tokens) a slice is one block, as before; from 32 to 128 blocks the slices hold
# 4 instead of cdiv(blocks, 32) (1-3 below 97), so fewer programs meet in the merge. H100,
# stop 57, 36 qwen3-8b layers in a graph (docs/wip/qkv_o_graph_sweep.py --att-long): -3.7 to
# -4.5 us a layer at 2,047 and 4,095 tokens, -0.4 to -1.3 at 1,023, the same config at 511 and
# 8,191. In the engine (stop 58, alternating with the old slices) after a 2,048-token prompt:
# qwen3-8b +0.8% (batch 1) / +1.8% (batch 4), 30b-a3b +1.3%, 0.6b +3.1% / +7.4%; level after
# 4,096 and 8,192. Longer slices (4 blocks past 16 slices, 8 blocks) measured no better.
ONE_ROW_SLICES = (4, 8)
# Extend batches averaging at most this many tokens per request slot count as short requests.
SHORT_REQUEST_TOKENS = 512
# No request's query is longer (int32 lengths): the upper end of an unrestricted launch.
MAX_QUERY_LEN = 2**31 - 1


@dataclass(frozen=True)
class AttentionTiles:
    """Static launch configuration; chosen by ``choose_tiles`` or given by a benchmark."""

    block_q: int  # query tokens per program
    group_pad: int  # q heads per kv head, padded to a power of two (BLOCK_M = block_q * group_pad)
    block_n: int  # keys per inner iteration
    num_splits: int  # most key-range slices per tile (power of two)
    min_split_blocks: int  # a slice gets at least this many key blocks
    per_request: bool  # per-request grid (needs max_query_len) instead of the flat one
    num_warps: int
    num_stages: int
    # load the next key block's page ids one iteration ahead (split decode of few sequences)
    prefetch_pages: bool = False
    # a programmatic dependent launch (the one-row decode, behind the kernel that wrote q):
    # lengths, page table and an L2 prefetch of the first key blocks before the wait
    pdl_wait: bool = False
    # an extend's keys past the cached prefix, in the blocks a whole tile sees, read from this
    # forward's own k/v rows (given as ``new_kv``) through TMA descriptors instead of gathered
    # from the paged cache (flat tiles; a launch with a window reads the pages)
    new_keys: bool = False
    # a key range of fewer than min_slices x min_split_blocks blocks still takes min_slices
    # slices (as many as it has blocks): slices grow from one block toward min_split_blocks
    # as the range grows, instead of a short range taking one slice
    min_slices: int = 1
    # a slice's key blocks in one masked loop instead of three (window start, blocks every row
    # sees, the diagonal): each of the three is a pipelined loop whose prologue computes its
    # first blocks' page ids and addresses even when its range is empty. A one-row decode's
    # slices are a few blocks: in qwen3-0.6b's batch-1 variant ~1,233 of the 1,816 sm_90
    # instructions a working warp runs at 511 tokens were key-loop code (ncu execution counts,
    # stop 58); one loop cuts that code from 1,818 instructions to 636
    one_range: bool = False


@functools.lru_cache(maxsize=8)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _next_pow2(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


@functools.lru_cache(maxsize=512)  # called by every eager attention launch (each break)
def choose_tiles(
    device: torch.device,
    num_tokens: int,
    num_seqs: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    max_query_len: int | None,
    num_splits: int | None = None,
    exact: bool = False,
) -> AttentionTiles:
    """Launch configuration from static sizes only (graph-safe: the same for every replay).
    ``exact`` (float32 on a GPU: numerics checks, IEEE dots): one configuration for every
    batch, the flat layout with one key-range slice, so a float32 engine compiles one variant
    instead of one per launch class (each took tens of seconds to compile cold; its speed is
    not the point of float32)."""
    group_pad = _next_pow2(num_q_heads // num_kv_heads)
    on_gpu = device.type == "cuda"
    exact = exact and on_gpu
    prefetch_long = False
    small = (
        not exact and max_query_len is not None
        and _next_pow2(max_query_len) * group_pad <= SMALL_QUERY_ROWS
    )  # fmt: skip
    # An extend reads the blocks of its new keys that a whole tile sees from this forward's
    # k/v rows through TMA (sm_90+; the interpreter too, so the CPU tests take it), not by a
    # gather from the pages: H200, stop 38, 1 x 8192 against main's tiles: qwen3-0.6b heads
    # 0.610 ms against 0.630-0.637, qwen3-8b heads 1.212-1.221 against 1.237-1.247 in the
    # same tiles as 0.6b's (then 64-row tiles: below); 1 x 32k -4% to -6%.
    new_keys = not small and not exact and _has_tma(device)
    # GPU values from the H200 sweep of ``nanograph bench attention --sweep`` (qwen3-8b layout);
    # CPU values are small so the interpreter tests cover several blocks per request.
    if small:
        block_q = _next_pow2(max_query_len)
        block_n = 64 if on_gpu else 16
        num_warps, num_stages = 4, 2
    else:
        # Extend: a 128-row tile in 4 warps (64 for head_dim 256, to stay within registers).
        # Short requests on average (a static ratio of the padded batch) have few key blocks
        # per program, where the smaller key block wins (32 x 256: 0.130 vs 0.155 ms).
        target_rows = (128 if head_dim <= 128 else 64) if on_gpu else 16
        short = num_tokens <= SHORT_REQUEST_TOKENS * max(num_seqs, 1)
        block_n = (64 if head_dim <= 128 and not short else 32) if on_gpu else 16
        num_warps, num_stages = 4, (3 if head_dim <= 128 else 2)
        if on_gpu and not exact and not short and head_dim <= 128 and new_keys:
            # Long prompts reading their keys through TMA: 64-row tiles against 64-key blocks
            # in 4 warps. H200 sweeps at stop 38, 1 x 8192: qwen3-8b heads 1.108 ms against
            # 1.191 for 128 rows x 128 keys in 8 warps (1.212 with the page-id prefetch), and
            # on another machine 1.173 against 1.198; qwen3-0.6b heads 0.590 against 0.604
            # (0.611), and 0.6075 against 0.6058 (a tie).
            target_rows, block_n = 64, 64
        elif on_gpu and not exact and not short and head_dim <= 128:
            # Long prompts: 64 query tokens a tile (at least 128 rows, at most 256) against
            # 128-key blocks in 8 warps. H200 sweep at 7048f80, 1 x 8192: qwen3-8b heads
            # (group 4, 256 rows) 1.229 ms against 1.47 for 128 rows x 64 keys in 4 warps;
            # qwen3-0.6b heads (group 2, 128 rows) 0.746 against 0.882.
            target_rows = min(max(64 * group_pad, 128), 256)
            block_n, num_warps = 128, 8
            # 128-row tiles load the next key block's page ids one iteration ahead: qwen3-0.6b
            # heads 0.632 ms against 0.742-0.752 (H200 sweep at 7b767ad). 256-row tiles lose
            # with it (1.326 against 1.270 at 2 stages; at 3 stages it overflows shared memory)
            prefetch_long = target_rows <= 128
        if exact:
            # IEEE float32 dots lower to unrolled FMAs: their count per thread (tile rows x
            # key block x head_dim / threads) drives ptxas time. 32 x 16 tiles keep it at
            # 1/16 of the bf16 tile's, one pipeline stage
            target_rows, block_n, num_stages = 32, 16, 1
        block_q = max(1, target_rows // group_pad)
    # tl.dot needs at least 16 rows: pad the group further when the tile is too short.
    group_pad = max(group_pad, 16 // block_q)
    if small:
        programs = num_seqs * triton.cdiv(max_query_len, block_q) * num_kv_heads
    else:
        programs = (num_tokens // block_q + num_seqs) * num_kv_heads
    if num_splits is None:
        num_splits = 1
        if on_gpu and not exact:
            wanted = PROGRAMS_PER_SM * _sm_count(device.index or 0)
            num_splits = min(_next_pow2(triton.cdiv(wanted, max(programs, 1))), MAX_SPLITS)
    if num_splits & (num_splits - 1):
        raise ValueError(f"num_splits must be a power of two, got {num_splits}")
    # An extend tile's partial (128 rows x head_dim, fp32) costs as much memory traffic as a few
    # key blocks, so extend splits only ranges of at least 8 blocks (a 256-token prompt never
    # splits); a decode tile's partial is small. CPU: 1, so the tests exercise splitting.
    min_split_blocks = 8 if on_gpu and not small else 1
    # Decode of a few sequences (32 splits: batch <= 4 with 8 kv heads on the H200): each
    # program's key loop is latency-bound (ncu, 1 x 32k: 7.6 warps an SM), so more warps, a
    # deeper pipeline and page ids loaded one block ahead (H200, 95c599c: 44 vs 51 us at
    # 1 x 32k, 11.6 vs 12.4 us at 1 x 512). Larger batches keep the configuration measured
    # before (batch 8-32 not swept with this one yet).
    prefetch = on_gpu and small and max_query_len == 1 and num_splits >= MAX_SPLITS
    min_slices = 1
    if prefetch:
        num_warps, num_stages = 8, 3
        # slices of one key block up to 8 of them, then longer ones (ONE_ROW_SLICES)
        min_split_blocks, min_slices = ONE_ROW_SLICES
    one_range = on_gpu and small and max_query_len == 1 and not exact  # every one-row decode
    # The one-row decode follows a one-row launch that lets it start early (the q/k/v GEMV, or
    # rope + KV store once it has waited). H200 (a42ae37, behind rope + KV store): the decode
    # graph -2.2% on qwen3-0.6b and -2.1% on qwen3-30b-a3b; the same launch at batch 8 and 32
    # cost 3-9% (c588942), so only one row takes it (in the prefetching configuration a single
    # row always gets).
    pdl_wait = prefetch and num_tokens == 1
    prefetch = prefetch or prefetch_long
    return AttentionTiles(
        block_q, group_pad, block_n, num_splits, min_split_blocks, small, num_warps, num_stages,
        prefetch, pdl_wait, new_keys, min_slices, one_range,
    )  # fmt: skip


@functools.lru_cache(maxsize=8)
def _has_tma(device: torch.device) -> bool:
    """Whether the kernel can read TMA descriptors here: sm_90+, or the interpreter (CPU)."""
    return device.type != "cuda" or torch.cuda.get_device_capability(device) >= (9, 0)


def tile_variants(
    device: torch.device, num_q_heads: int, num_kv_heads: int, head_dim: int, exact: bool = False
) -> list[tuple[int, AttentionTiles]]:
    """Every launch configuration ``choose_tiles`` can return for these heads, each with a query
    length that launches it (per-request tiles hold exactly that many tokens; flat tiles take
    any). The set is what ``choose_tiles`` gives for each small-query class and for short and
    long extends, at every split count it can pick, so it covers every batch shape; tiles that
    differ only in their split count share a compiled kernel and appear once. ``exact``: the
    one configuration of float32 on a GPU."""
    if exact and device.type == "cuda":
        tiles = choose_tiles(device, 1, 1, num_q_heads, num_kv_heads, head_dim, 1, exact=True)
        return [(1, tiles)]
    group_pad = _next_pow2(num_q_heads // num_kv_heads)
    small_block_q = [1 << i for i in range((SMALL_QUERY_ROWS // group_pad).bit_length())]
    long_query = SMALL_QUERY_ROWS + 1  # not a small query; flat layout
    inputs = [(q, q, 1, q) for q in small_block_q]  # (tokens, max_query_len, seqs, launch q)
    inputs += [(2, 1, 2, 1)]  # decode of more than one row: no programmatic dependent launch
    inputs += [(long_query, long_query, 1, long_query)]  # short requests (block_n 32 on GPU)
    inputs += [(SHORT_REQUEST_TOKENS + 1,) * 2 + (1, long_query)]  # long requests
    variants: dict[AttentionTiles, tuple[int, AttentionTiles]] = {}
    for tokens, max_query_len, seqs, launch_q in inputs:
        for log_splits in range(MAX_SPLITS.bit_length()):
            tiles = choose_tiles(
                device, tokens, seqs, num_q_heads, num_kv_heads, head_dim, max_query_len,
                1 << log_splits,
            )  # fmt: skip
            variants.setdefault(compiled_variant(tiles), (launch_q, tiles))
    return list(variants.values())


def compiled_variant(tiles: AttentionTiles) -> AttentionTiles:
    """What a launch configuration compiles to: the split count is a runtime value, and only
    whether a launch may split at all (the merge code) is compiled in."""
    return dataclasses.replace(tiles, num_splits=min(tiles.num_splits, 2))


_FORCED_TILES: contextvars.ContextVar[AttentionTiles | None] = contextvars.ContextVar(
    "forced_attention_tiles", default=None
)


def current_forced_tiles() -> AttentionTiles | None:
    """The tiles a ``forced_tiles`` block around this call imposes, if any."""
    return _FORCED_TILES.get()


@contextlib.contextmanager
def forced_tiles(tiles: AttentionTiles) -> Iterator[None]:
    """Launches inside this block use ``tiles`` (start-up warm-up of every configuration
    through the model's own calls, so each compiled variant is the one a request will use)."""
    token = _FORCED_TILES.set(tiles)
    try:
        yield
    finally:
        _FORCED_TILES.reset(token)


@functools.lru_cache(maxsize=512)  # like choose_tiles: every eager attention call asks
def launch_plan(
    device: torch.device,
    num_tokens: int,
    num_seqs: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    max_query_len: int | None,
    num_splits: int | None = None,
    exact: bool = False,
) -> tuple[tuple[AttentionTiles, tuple[int, int]], ...]:
    """The launches of one attention call, each with the (inclusive) query_len range of the
    requests it computes: one launch in ``choose_tiles``' configuration, or, for an extend
    batch whose requests count as short on average but that has room for a longer one, the
    short requests in it and the long ones (over SHORT_REQUEST_TOKENS) in the tiles of one
    request holding every token, where those differ. Static sizes only (graph-safe)."""
    args = (device, num_tokens, num_seqs, num_q_heads, num_kv_heads, head_dim, max_query_len,
            num_splits, exact)  # fmt: skip
    tiles = choose_tiles(*args)
    if tiles.per_request or num_tokens <= SHORT_REQUEST_TOKENS:
        return ((tiles, (0, MAX_QUERY_LEN)),)
    long = choose_tiles(device, num_tokens, 1, *args[3:])
    if long == tiles:
        return ((tiles, (0, MAX_QUERY_LEN)),)
    return ((tiles, (0, SHORT_REQUEST_TOKENS)), (long, (SHORT_REQUEST_TOKENS + 1, MAX_QUERY_LEN)))
