"""Compiled Triton paged attention on the GPU at realistic sizes, against the torch reference.

Also checks graph safety the way the engine relies on it: a launch captured in a CUDA graph
with one batch's metadata replays correctly after the static buffers are rewritten with another
batch of different lengths (same N and S).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

if torch.cuda.is_available():
    from nanograph.kernels import reference
    from nanograph.kernels.attention import HOPPER_SWITCH, paged_attention
    from nanograph.kernels.testing import PagedBatch, make_paged_batch

QWEN3_8B = {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128}
QWEN3_06B = {"num_q_heads": 16, "num_kv_heads": 8, "head_dim": 128}  # 128-row long tiles
# long prompts take 256-row tiles with qwen3-8b's heads and 128-row ones with qwen3-0.6b's
LONG_LAYOUTS = pytest.mark.parametrize("layout", [QWEN3_8B, QWEN3_06B], ids=["8b", "06b"])
GPT_OSS = {"num_q_heads": 64, "num_kv_heads": 8, "head_dim": 64}
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-4}


def _batch(contexts, queries, *, layout=QWEN3_8B, dtype=torch.bfloat16, page_size=16,
           sentinels=0, pad=0, seed=0) -> PagedBatch:  # fmt: skip
    return make_paged_batch(
        contexts, queries, **layout, page_size=page_size, dtype=dtype, device="cuda",
        num_sentinels=sentinels, padded_tokens=sum(queries) + pad,
        generator=torch.Generator().manual_seed(seed),
    )  # fmt: skip


def _check(batch: PagedBatch, dtype=torch.bfloat16, **kwargs) -> None:
    scale = batch.q.shape[-1] ** -0.5
    args = (batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), batch.page_size, scale)
    got = paged_attention(*args, **kwargs)
    torch.cuda.synchronize()
    ref_kwargs = {k: v.float() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    want = reference.paged_attention(
        batch.q.float(), batch.k_cache.float(), batch.v_cache.float(), *args[3:], **ref_kwargs
    )
    real = int(batch.num_tokens[0])
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got[:real].float(), want[:real], atol=tol, rtol=tol)
    assert torch.all(got[real:] == 0)


@LONG_LAYOUTS
def test_extend_one_long_prompt(layout):
    _check(_batch([0], [8192], layout=layout))


def test_extend_many_requests_with_prefixes_and_sentinels():
    gen = torch.Generator().manual_seed(1)
    contexts = torch.randint(0, 2048, (32,), generator=gen).tolist()
    _check(_batch(contexts, [256] * 32, sentinels=4, pad=100, seed=1))


@LONG_LAYOUTS
def test_extend_chunked_prefill_mix(layout):
    # a long prefix continuing by a chunk, fresh prompts, single-token extends
    _check(_batch([6000, 0, 0, 31, 4095, 1], [1024, 700, 3, 1, 517, 2000], layout=layout,
                  sentinels=2, pad=7))  # fmt: skip


@LONG_LAYOUTS
def test_extend_short_and_long_requests_in_their_own_launches(layout):
    # 16 slots and ~4k tokens: short on average, so the short requests (up to 512 tokens, the
    # border included) take the short tiles and the longer ones (513 up) a second launch
    from nanograph.kernels.attention_tiles import launch_plan

    queries = [3000, 100, 1, 513, 512, 40]
    batch = _batch([0, 0, 9, 700, 0, 33], queries, layout=layout, sentinels=10, pad=5, seed=3)
    heads = (layout["num_q_heads"], layout["num_kv_heads"], layout["head_dim"])
    assert len(launch_plan(batch.q.device, batch.q.shape[0], 16, *heads, None)) == 2
    _check(batch)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_extend_other_dtypes(dtype):
    _check(_batch([100, 0], [300, 257], dtype=dtype, seed=2), dtype=dtype)


def _new_rows(batch: PagedBatch, row_stride: int | None = None):
    """This forward's k/v as the engine gives them (``new_kv``): rows of a wider projection
    output (``row_stride`` elements apart, like q/k/v sliced out of one GEMM's output), the
    padded rows NaN; the cache keeps its copies (the diagonal key blocks read them)."""
    live = batch.slot_mapping >= 0
    n, hkv, d = len(live), batch.k_cache.shape[1], batch.k_cache.shape[2]
    stride = row_stride or hkv * d
    wide = torch.full((n, 2 * stride), float("nan"), dtype=batch.k_cache.dtype, device="cuda")
    k = wide[:, : hkv * d].view(n, hkv, d)
    v = wide[:, stride : stride + hkv * d].view(n, hkv, d)
    slots = batch.slot_mapping[live]
    k[live], v[live] = batch.k_cache[slots], batch.v_cache[slots]
    want = reference.paged_attention(
        batch.q.float(), batch.k_cache.float(), batch.v_cache.float(), *batch.metadata(),
        batch.page_size, batch.q.shape[-1] ** -0.5,
    )  # fmt: skip
    return (k, v), want


@pytest.mark.parametrize(
    ("contexts", "queries", "layout", "sentinels", "pad", "dtype"),
    [
        ([0], [8192], QWEN3_8B, 0, 0, torch.bfloat16),
        ([0], [8192], QWEN3_06B, 0, 0, torch.bfloat16),
        ([6000, 0, 0, 31, 4095, 1], [1024, 700, 3, 1, 517, 2000], QWEN3_8B, 2, 7, torch.bfloat16),
        ([6000, 0, 0, 31, 4095, 1], [1024, 700, 3, 1, 517, 2000], QWEN3_06B, 2, 7, torch.bfloat16),
        ([0, 0, 9, 700, 0, 33], [3000, 100, 1, 513, 512, 40], QWEN3_8B, 10, 5, torch.bfloat16),
        ([100, 0], [300, 257], QWEN3_8B, 0, 0, torch.float16),
    ],
    ids=["8b-8k", "06b-8k", "8b-chunked", "06b-chunked", "8b-short-and-long", "fp16"],
)  # fmt: skip
def test_extend_reads_new_keys_from_their_rows(contexts, queries, layout, sentinels, pad, dtype):
    """Extends given ``new_kv`` (rows strided like q/k/v slices of one projection output,
    the padded ones NaN) read the blocks of each request's new keys that every row of a tile
    sees from the rows through TMA, the rest from the pages."""
    batch = _batch(contexts, queries, layout=layout, dtype=dtype, sentinels=sentinels, pad=pad,
                   seed=len(contexts))  # fmt: skip
    hq, hkv, d = layout["num_q_heads"], layout["num_kv_heads"], layout["head_dim"]
    new_kv, want = _new_rows(batch, row_stride=(hq + 2 * hkv) * d)
    got = paged_attention(batch.q, batch.k_cache, batch.v_cache, *batch.metadata(),
                          batch.page_size, d**-0.5, new_kv=new_kv)  # fmt: skip
    torch.cuda.synchronize()
    real, tol = int(batch.num_tokens[0]), TOLERANCE[dtype]
    torch.testing.assert_close(got[:real].float(), want[:real], atol=tol, rtol=tol)
    assert torch.all(got[real:] == 0)


def test_new_keys_replay_in_a_cuda_graph_and_take_the_direct_path():
    """A launch reading new keys through TMA descriptors: the second one skips the JIT on this
    Triton (its launcher takes the descriptors), and one captured in a CUDA graph replays right
    once q, the rows and the lengths are rewritten for another split of the same requests
    (a longer cached prefix, the rows past the live ones NaN padding)."""
    from nanograph.kernels.attention import _launch_attention

    batch = _batch([0, 500], [3000, 1000], layout=QWEN3_06B, seed=7)
    full_k, full_v = batch.k_cache, batch.v_cache
    rows, want = _new_rows(batch)

    def run():
        return paged_attention(batch.q, batch.k_cache, batch.v_cache, *batch.metadata(),
                               batch.page_size, 128**-0.5, new_kv=rows)  # fmt: skip

    run()
    before = _launch_attention.direct_launches
    out = run()
    torch.cuda.synchronize()
    assert _launch_attention.enabled and _launch_attention.direct_launches == before + 1
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    # the same requests with 1000 more tokens of the first one cached: 3000 live rows of 4000
    positions = [torch.arange(1000, 3000), torch.arange(500, 1500)]
    slots = torch.cat([batch.page_table[r, (p // 16).cuda()].long() * 16 + (p % 16).cuda()
                       for r, p in enumerate(positions)])  # fmt: skip
    batch.query_lens.copy_(torch.tensor([2000, 1000]))
    batch.query_start_loc.copy_(torch.tensor([0, 2000, 3000]))
    batch.q.copy_(torch.randn(batch.q.shape, generator=torch.Generator().manual_seed(9)))
    for row, full in zip(rows, (full_k, full_v), strict=True):
        row.fill_(float("nan"))
        row[:3000] = full[slots]
    want = reference.paged_attention(
        batch.q.float(), full_k.float(), full_v.float(), *batch.metadata(), 16, 128**-0.5
    )
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out[:3000].float(), want[:3000], atol=2e-2, rtol=2e-2)
    assert torch.all(out[3000:] == 0)


def _hopper_module():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        return None
    try:
        from nanograph.kernels import attention_hopper
    except ImportError:
        return None
    return attention_hopper


def _count_hopper_launches(monkeypatch) -> list[int]:
    """A list that gets a 1 for each call of the Hopper extend (which still runs)."""
    hopper = _hopper_module()
    calls: list[int] = []
    real_extend = hopper.extend_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return real_extend(*args, **kwargs)

    monkeypatch.setattr(hopper, "extend_attention", counted)
    return calls


@pytest.mark.skipif(_hopper_module() is None, reason="needs sm_90 and Triton's Gluon")
@pytest.mark.parametrize(
    ("contexts", "queries", "layout", "sentinels", "pad"),
    [
        ([0], [8192], QWEN3_06B, 0, 0),
        ([0, 0, 0, 0], [2048] * 4, QWEN3_8B, 0, 0),
        ([4096], [4096], QWEN3_06B, 0, 0),
        # box edges: requests of 128 +- 1 tokens, unaligned prefixes, short ones for Triton's
        # launch, the last request's box ending on its last row before NaN padding rows
        ([0, 100, 7, 0, 3000, 16, 0], [129, 128, 130, 127, 1000, 300, 1], QWEN3_06B, 2, 77),
        ([0, 16, 100, 1000, 3000], [1, 17, 300, 1024, 2000], QWEN3_8B, 2, 128),
        ([5], [200], QWEN3_8B, 0, 300),
    ],
    ids=["06b-8k", "8b-4x2k", "06b-prefix4k", "06b-edges", "8b-mixed", "8b-one-short-padded"],
)  # fmt: skip
def test_hopper_extend_takes_the_long_requests(contexts, queries, layout, sentinels, pad,
                                               monkeypatch):  # fmt: skip
    """On sm_90, an extend given ``new_kv`` (bf16, head_dim 128) runs its requests of at least
    HOPPER_MIN_QUERY_LEN tokens in the Gluon kernel and the rest in Triton's; together they
    match the reference, with padding rows NaN in the new rows and nothing written outside
    the requests."""
    calls = _count_hopper_launches(monkeypatch)
    batch = _batch(contexts, queries, layout=layout, sentinels=sentinels, pad=pad,
                   seed=len(contexts) + pad)  # fmt: skip
    hq, hkv, d = layout["num_q_heads"], layout["num_kv_heads"], layout["head_dim"]
    new_kv, want = _new_rows(batch, row_stride=(hq + 2 * hkv) * d)
    real = int(batch.num_tokens[0])
    # no hint, and the engine's extend hint (max_query_len = N, the runners' static buffers)
    for hint in (None, batch.q.shape[0]):
        got = paged_attention(batch.q, batch.k_cache, batch.v_cache, *batch.metadata(),
                              batch.page_size, d**-0.5, new_kv=new_kv,
                              max_query_len=hint)  # fmt: skip
        torch.cuda.synchronize()
        torch.testing.assert_close(got[:real].float(), want[:real], atol=2e-2, rtol=2e-2)
        assert torch.all(got[real:] == 0)
    assert calls == [1, 1]


@pytest.mark.skipif(_hopper_module() is None, reason="needs sm_90 and Triton's Gluon")
def test_an_eager_live_range_leaves_out_the_empty_launch_and_a_later_capture_holds_all(
    monkeypatch,
):
    """An eager extend given its live batch's range (one long prompt) runs Triton's launches
    for short requests (one a length class of the plan, each with no request in its range)
    once, for their kinds, then only the Hopper kernel; a CUDA graph captured after that
    (every length) replays right for a batch of a long and a short request."""
    from conftest import record_attention_launch_ranges

    hopper_calls = _count_hopper_launches(monkeypatch)
    triton_ranges = record_attention_launch_ranges(monkeypatch)
    batch = _batch([0, 100], [600, 40], layout=QWEN3_06B, seed=3)
    new_kv, want = _new_rows(batch)
    n = batch.q.shape[0]
    args = (batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), 16, 128**-0.5)
    first = []
    for _ in range(2):
        got = paged_attention(*args, new_kv=new_kv, max_query_len=n, query_len_range=(600, 600))
        torch.cuda.synchronize()
        torch.testing.assert_close(got[:600].float(), want[:600], atol=2e-2, rtol=2e-2)
        first = first or list(triton_ranges)
    assert len(hopper_calls) == 2, "the Hopper kernel runs the prompt each time"
    assert first and all(lo > hi for lo, hi in first), "the first call ran empty launches only"
    assert triton_ranges == first, "the second call left them out"
    out = torch.zeros_like(batch.q)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_attention(*args, new_kv=new_kv, max_query_len=n, out=out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    real = int(batch.num_tokens[0])
    torch.testing.assert_close(out[:real].float(), want[:real], atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(_hopper_module() is None, reason="needs sm_90 and Triton's Gluon")
def test_triton_36_direct_launches_call_the_c_launcher():
    """Under Triton 3.6 a launch's later calls go to its C launcher itself
    (``kernels.launch._lean_launch``; the Hopper extend's six TMA descriptors encoded once), and
    give what the first call, through Triton's JIT, gave."""
    import triton

    if not triton.__version__.startswith("3.6."):
        pytest.skip("the lean launch is Triton 3.6's")
    hopper = _hopper_module()
    batch = _batch([16], [300], layout=QWEN3_06B, seed=5)
    new_kv, want = _new_rows(batch)
    args = (batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), 16, 128**-0.5)
    direct = hopper._launch.direct_launches
    outs = [paged_attention(*args, new_kv=new_kv).clone() for _ in range(3)]
    torch.cuda.synchronize()
    for got in outs:
        torch.testing.assert_close(got[:300].float(), want[:300], atol=2e-2, rtol=2e-2)
    assert torch.equal(outs[0], outs[2]), "a direct launch computes what the JIT's did"
    assert hopper._launch.direct_launches >= direct + 2
    assert all(fn.__name__ == "launch" for fn, _ in hopper._launch.runners.values())


@pytest.mark.skipif(_hopper_module() is None, reason="needs sm_90 and Triton's Gluon")
def test_hopper_extend_can_be_turned_off(monkeypatch):
    batch = _batch([0], [512], layout=QWEN3_06B)
    new_kv, _ = _new_rows(batch)
    args = (batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), 16, 128**-0.5)
    calls = _count_hopper_launches(monkeypatch)
    on = paged_attention(*args, new_kv=new_kv)
    monkeypatch.setenv(HOPPER_SWITCH, "0")
    off = paged_attention(*args, new_kv=new_kv)
    torch.cuda.synchronize()
    assert calls == [1]
    torch.testing.assert_close(on.float(), off.float(), atol=2e-2, rtol=2e-2)


def test_float32_decode_takes_the_one_exact_variant():
    """float32 launches one configuration for every batch (flat, one slice: numerics checks
    compile one variant); decode of requests up to 5k tokens through it matches the
    reference."""
    gen = torch.Generator().manual_seed(4)
    contexts = torch.randint(0, 5000, (14,), generator=gen).tolist() + [0, 4999]
    batch = _batch(contexts, [1] * 16, sentinels=2, pad=2, dtype=torch.float32, seed=4)
    _check(batch, dtype=torch.float32, max_query_len=1)


def test_decode_128_requests():
    gen = torch.Generator().manual_seed(3)
    contexts = torch.randint(0, 2048, (120,), generator=gen).tolist() + [0, 2047]
    _check(_batch(contexts, [1] * 122, sentinels=6, pad=6, seed=3), max_query_len=1)


@pytest.mark.parametrize("prefetch_pages", [False, True])
def test_decode_one_32k_sequence(prefetch_pages):
    from nanograph.kernels.attention_tiles import choose_tiles

    batch = _batch([32767], [1], seed=4)
    tiles = choose_tiles(batch.q.device, 1, 1, 32, 8, 128, 1)
    _check(batch, max_query_len=1, tiles=dataclasses.replace(tiles, prefetch_pages=prefetch_pages))


@pytest.mark.parametrize("context", [100, 1023, 2047, 4095, 9000])
@pytest.mark.parametrize("least", [(4, 8), (2, 16), (8, 1)], ids=["4x8", "2x16", "8x1"])
def test_one_row_slices_of_several_blocks(context, least):
    """Slices of at least ``min_split_blocks`` key blocks, but ``min_slices`` of them while
    the range is shorter (AttentionTiles.min_slices): every split layout agrees, and the
    zero-length sentinel slots (no key blocks) are left alone."""
    from nanograph.kernels.attention_tiles import choose_tiles

    batch = _batch([context], [1], sentinels=3, seed=context)
    tiles = choose_tiles(batch.q.device, 1, 1, 32, 8, 128, 1)
    m, s = least
    _check(batch, max_query_len=1,
           tiles=dataclasses.replace(tiles, min_split_blocks=m, min_slices=s))  # fmt: skip


@LONG_LAYOUTS
@pytest.mark.parametrize("context", [0, 511, 4095, 32767])
def test_one_row_decode_with_rope_in_the_kernel(layout, context):
    """paged_attention(rope=...) against rope_store_kv + attention in float32: the program
    whose slice holds the new key stores it, then reads it back (its slot starts as NaN, so a
    read before the store shows), launched 20 times (the one-row launch is a programmatic
    dependent on sm_90: each launch follows a fill kernel, as it follows the q/k/v GEMV)."""
    from nanograph.kernels.attention import RopeStore

    gen = torch.Generator().manual_seed(context)
    batch = _batch([context], [1], layout=layout, seed=context)
    hkv, d = layout["num_kv_heads"], layout["head_dim"]
    k, v = (torch.randn(1, hkv, d, generator=gen).bfloat16().cuda() for _ in range(2))
    norms = [(1 + 0.3 * torch.randn(d, generator=gen)).bfloat16().cuda() for _ in range(2)]
    inv_freq = 1e6 ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)
    freqs = torch.outer(torch.arange(context + 1, dtype=torch.float64), inv_freq)
    table = torch.cat([freqs.cos(), freqs.sin()], -1).float().cuda()
    rope = RopeStore(k, v, batch.positions, table, batch.slot_mapping, *norms, eps=1e-6)
    slot = int(batch.slot_mapping[0])
    q_ref, k_ref = batch.q.float(), k.float()
    caches_ref = [batch.k_cache.float(), batch.v_cache.float()]
    reference.rope_store_kv(q_ref, k_ref, v.float(), batch.positions, table, *caches_ref,
                            batch.slot_mapping, q_norm_weight=norms[0].float(),
                            k_norm_weight=norms[1].float(), eps=1e-6)  # fmt: skip
    scale = d**-0.5
    want = reference.paged_attention(q_ref, *caches_ref, *batch.metadata(), batch.page_size,
                                     scale, max_query_len=1)  # fmt: skip
    for _ in range(20):
        batch.k_cache[slot] = float("nan")
        batch.v_cache[slot] = float("nan")
        got = paged_attention(batch.q, batch.k_cache, batch.v_cache, *batch.metadata(),
                              batch.page_size, scale, max_query_len=1, rope=rope)  # fmt: skip
        torch.cuda.synchronize()
        tol = TOLERANCE[torch.bfloat16]
        torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)
        torch.testing.assert_close(batch.k_cache[slot].float(), caches_ref[0][slot], atol=tol,
                                   rtol=tol)  # fmt: skip
        assert torch.equal(batch.v_cache[slot], v[0])


@LONG_LAYOUTS
@pytest.mark.parametrize(
    "queries", [[1] * 8, [1] * 3, [5, 5, 3]], ids=["decode8", "decode3", "verify3"]
)
def test_decode_rows_with_rope_in_the_kernel(layout, queries):
    """paged_attention(rope=...) over graph-shaped batches (sentinel slots, padded rows holding
    NaN) against rope_store_kv + attention in float32: in a decode every new key is stored by
    the attention kernel before any slice reads it (their slots start as NaN); a verify takes
    rope_store_kv first; the padded rows are zeroed either way."""
    from nanograph.kernels.attention import RopeStore

    gen = torch.Generator().manual_seed(len(queries))
    contexts = [511, 60, 4093, 17, 0, 2048, 300, 129][: len(queries)]
    batch = _batch(contexts, queries, layout=layout, sentinels=2, pad=3, seed=len(queries))
    n, hkv, d = batch.q.shape[0], layout["num_kv_heads"], layout["head_dim"]
    k, v = (torch.randn(n, hkv, d, generator=gen).bfloat16().cuda() for _ in range(2))
    norms = [(1 + 0.3 * torch.randn(d, generator=gen)).bfloat16().cuda() for _ in range(2)]
    inv_freq = 1e6 ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)
    freqs = torch.outer(torch.arange(max(contexts) + 8, dtype=torch.float64), inv_freq)
    table = torch.cat([freqs.cos(), freqs.sin()], -1).float().cuda()
    rope = RopeStore(k, v, batch.positions, table, batch.slot_mapping, *norms, eps=1e-6,
                     num_tokens=batch.num_tokens)  # fmt: skip
    slots = batch.slot_mapping[batch.slot_mapping >= 0]
    q_ref, k_ref = batch.q.float(), k.float()
    caches_ref = [batch.k_cache.float(), batch.v_cache.float()]
    reference.rope_store_kv(q_ref, k_ref, v.float(), batch.positions, table, *caches_ref,
                            batch.slot_mapping, q_norm_weight=norms[0].float(),
                            k_norm_weight=norms[1].float(), eps=1e-6,
                            num_tokens=batch.num_tokens)  # fmt: skip
    scale = d**-0.5
    want = reference.paged_attention(q_ref, *caches_ref, *batch.metadata(), batch.page_size,
                                     scale, max_query_len=max(queries))  # fmt: skip
    live, tol = int(batch.num_tokens), TOLERANCE[torch.bfloat16]
    for _ in range(5):
        batch.k_cache[slots] = float("nan")
        batch.v_cache[slots] = float("nan")
        out = torch.full_like(batch.q, float("nan"))
        # a verify's rope_store_kv rotates q and k in place: each launch gets them as written
        q = batch.q.clone()
        got = paged_attention(q, batch.k_cache, batch.v_cache, *batch.metadata(),
                              batch.page_size, scale, max_query_len=max(queries),
                              rope=dataclasses.replace(rope, k=k.clone()), out=out)  # fmt: skip
        torch.cuda.synchronize()
        torch.testing.assert_close(got[:live].float(), want[:live], atol=tol, rtol=tol)
        assert not got[live:].any()
        torch.testing.assert_close(batch.k_cache[slots].float(), caches_ref[0][slots],
                                   atol=tol, rtol=tol)  # fmt: skip
        assert torch.equal(batch.v_cache[slots], v[:live])


def test_target_verify():
    gen = torch.Generator().manual_seed(5)
    contexts = torch.randint(1, 3000, (64,), generator=gen).tolist()
    _check(_batch(contexts, [4] * 64, sentinels=4, seed=5), max_query_len=4)


@pytest.mark.parametrize("max_query_len", [None, 1])
def test_gpt_oss_window_sinks_softcap(max_query_len):
    queries = [1] * 16 if max_query_len == 1 else [900, 1, 2000, 33]
    contexts = [4000 + 97 * i for i in range(len(queries))]
    batch = _batch(contexts, queries, layout=GPT_OSS, sentinels=2, seed=6)
    sinks = torch.randn(64, device="cuda") * 2
    for features in ({"sliding_window": 128, "sinks": sinks}, {"softcap": 30.0}):
        _check(batch, max_query_len=max_query_len, **features)


_STATIC_NAMES = ("q", "seq_lens", "query_lens", "query_start_loc")


def _graph_case(max_query_len: int | str | None) -> tuple[PagedBatch, PagedBatch]:
    if max_query_len == 1:
        first = _batch([5, 3000, 17, 0], [1, 1, 1, 1], seed=7)
        second = _batch([2047, 1], [1, 1], sentinels=2, pad=2, seed=8)  # fewer live requests
    elif max_query_len == "mixed":  # two launches (launch_plan) in one graph
        first = _batch([0] * 16, [256] * 16, seed=7)
        second = _batch([0], [4000], sentinels=15, pad=96, seed=8)
    else:
        first = _batch([0, 300], [200, 56], seed=7)
        second = _batch([1000], [250], sentinels=1, pad=6, seed=8)
    return first, second


@pytest.mark.parametrize("max_query_len", [None, 1, "mixed"])
def test_replays_in_a_cuda_graph_with_new_lengths(max_query_len):
    first, second = _graph_case(max_query_len)
    if max_query_len == "mixed":  # 16 short prompts captured, one long one replayed
        max_query_len = None
    # Static buffers sized by the first batch; the second batch's caches are copied into the
    # same cache tensor (it is big enough) and its metadata into the same buffers.
    static = dataclasses.replace(
        first, **{name: getattr(first, name).clone() for name in _STATIC_NAMES}
    )
    cache_slots = max(first.k_cache.shape[0], second.k_cache.shape[0])
    k_cache = torch.zeros(cache_slots, 8, 128, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    max_pages = max(first.page_table.shape[1], second.page_table.shape[1])
    page_table = torch.zeros(first.page_table.shape[0], max_pages, dtype=torch.int32,
                             device="cuda")  # fmt: skip

    def load(batch: PagedBatch) -> None:
        k_cache[: batch.k_cache.shape[0]] = batch.k_cache
        v_cache[: batch.v_cache.shape[0]] = batch.v_cache
        page_table.zero_()
        page_table[:, : batch.page_table.shape[1]] = batch.page_table
        for name in _STATIC_NAMES:
            getattr(static, name).copy_(getattr(batch, name))

    def run() -> torch.Tensor:
        return paged_attention(
            static.q, k_cache, v_cache, page_table, static.seq_lens, static.query_lens,
            static.query_start_loc, 16, 128**-0.5, max_query_len=max_query_len,
        )  # fmt: skip

    load(first)
    run()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for batch in (second, first):
        load(batch)
        graph.replay()
        torch.cuda.synchronize()
        want = reference.paged_attention(
            static.q.float(), k_cache.float(), v_cache.float(), page_table, static.seq_lens,
            static.query_lens, static.query_start_loc, 16, 128**-0.5,
        )  # fmt: skip
        real = int(static.query_start_loc[-1])
        torch.testing.assert_close(out[:real].float(), want[:real], atol=2e-2, rtol=2e-2)
    # the split counters are back to zero after every replay (the next launch relies on it)
    from nanograph.kernels.counters import _COUNTERS

    assert all(int(buf.abs().sum()) == 0 for bufs in _COUNTERS.values() for buf in bufs)


def test_repeated_launches_take_the_direct_path_and_agree():
    """The second identical launch skips the JIT (LaunchCache) on this Triton, and computes the
    same result as the first; a different batch still matches the reference."""
    from nanograph.kernels.attention import _launch_attention

    batch = _batch([300, 0, 37], [1, 1, 1])
    args = (batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), batch.page_size, 0.1)
    first = paged_attention(*args, max_query_len=1)
    before = _launch_attention.direct_launches
    second = paged_attention(*args, max_query_len=1)
    assert _launch_attention.enabled, "this Triton's compiled-kernel interface was not usable"
    assert _launch_attention.direct_launches == before + 1
    assert torch.equal(first, second)
    _check(_batch([12, 900, 5], [1, 1, 1], seed=3), max_query_len=1)
