"""Start-up kernel warm-up: the attention variants it compiles cover every launch configuration
a batch can reach, so no kernel compiles on a request's path."""

from __future__ import annotations

import os

import pytest
import torch

# like test_kernels_triton: the kernels are decorated once per process, and those tests need the
# interpreter (tile_variants itself launches nothing)
os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from nanograph.kernels import attention_tiles  # noqa: E402


def _like_an_h200(monkeypatch) -> None:
    """choose_tiles as on an H200 (132 SMs, TMA), on a machine without CUDA."""
    monkeypatch.setattr(attention_tiles, "_sm_count", lambda index: 132)
    monkeypatch.setattr(attention_tiles, "_has_tma", lambda device: True)


@pytest.mark.parametrize(
    "heads", [(32, 8, 128), (16, 8, 128), (64, 8, 64), (9, 3, 64), (4, 4, 256)]
)
@pytest.mark.parametrize("on_gpu", [True, False])
def test_tile_variants_cover_every_batch_shape(heads, on_gpu, monkeypatch):
    """Brute force over request counts, token counts and query lengths (the H200's SM count
    and TMA stand in for a GPU): every configuration ``choose_tiles`` picks is among the
    variants."""
    _like_an_h200(monkeypatch)
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    hq, hkv, d = heads
    variants = {
        attention_tiles.compiled_variant(tiles)
        for _, tiles in attention_tiles.tile_variants(device, hq, hkv, d)
    }
    for seqs in (*range(1, 40), 63, 64, 65, 127, 128, 129, 200, 256, 512):
        for tokens in sorted({seqs, seqs + 1, 2 * seqs, 3 * seqs + 5, 64, 100, 513 * seqs,
                              512 * seqs, 1000, 2048, 4096, 8192} - set(range(seqs))):  # fmt: skip
            lo, hi = -(-tokens // seqs), tokens - seqs + 1  # feasible longest query
            for max_query_len in sorted({lo, hi, min(hi, 2 * lo), min(hi, 17), min(hi, 1)}):
                if lo <= max_query_len <= hi:
                    tiles = attention_tiles.choose_tiles.__wrapped__(
                        device, tokens, seqs, hq, hkv, d, max_query_len
                    )
                    assert attention_tiles.compiled_variant(tiles) in variants, (
                        seqs,
                        tokens,
                        tiles,
                    )
    if on_gpu:  # per small-query class a one-slice and a split variant (and the prefetching
        # decode, and its one-row programmatic dependent launch), two extends
        assert len(variants) <= 2 * attention_tiles.SMALL_QUERY_ROWS.bit_length() + 4


@pytest.mark.parametrize("heads", [(32, 8, 128), (16, 8, 128), (4, 4, 256)])
def test_float32_on_a_gpu_compiles_one_variant(heads, monkeypatch):
    """float32 (numerics checks) takes one configuration for every batch shape on a GPU: the
    flat layout, one key-range slice, no prefetch; tile_variants lists exactly it."""
    _like_an_h200(monkeypatch)
    device = torch.device("cuda", 0)
    hq, hkv, d = heads
    variants = attention_tiles.tile_variants(device, hq, hkv, d, exact=True)
    assert len(variants) == 1
    only = variants[0][1]
    assert not only.per_request and only.num_splits == 1 and not only.prefetch_pages
    for seqs, tokens, max_query_len in [(1, 1, 1), (64, 64, 1), (4, 20, 5), (1, 8192, 8192),
                                        (256, 256, 1), (3, 700, None)]:  # fmt: skip
        tiles = attention_tiles.choose_tiles.__wrapped__(
            device, tokens, seqs, hq, hkv, d, max_query_len, exact=True
        )
        assert tiles == only
    # bf16 keeps its launch classes; on CPU exact changes nothing
    assert len(attention_tiles.tile_variants(device, hq, hkv, d)) > 1
    cpu = torch.device("cpu")
    assert attention_tiles.tile_variants(
        cpu, hq, hkv, d, exact=True
    ) == attention_tiles.tile_variants(cpu, hq, hkv, d)


def test_per_request_variants_launch_exactly_their_query_length():
    """A per-request tile is compiled with Q_BLOCKS_PER_REQUEST = 1, as choose_tiles' own."""
    for tokens, tiles in attention_tiles.tile_variants(torch.device("cpu"), 32, 8, 128):
        if tiles.per_request:
            assert tiles.block_q == tokens


@pytest.mark.parametrize("heads", [(32, 8, 128), (16, 8, 128), (64, 8, 64)])
def test_launch_plan_gives_long_requests_of_a_mixed_extend_their_own_launch(heads, monkeypatch):
    """A prefill graph of 8192 tokens x 16 slots may hold sixteen 512-token prompts or one of
    8192: the short requests take the short tiles, longer ones a second launch in the tiles of
    one long request; each is a variant start-up compiles. Decode, one request, batches of at
    most SHORT_REQUEST_TOKENS tokens and float32 keep one launch over every request."""
    _like_an_h200(monkeypatch)
    gpu = torch.device("cuda", 0)
    hq, hkv, d = heads
    variants = {
        attention_tiles.compiled_variant(t)
        for _, t in attention_tiles.tile_variants(gpu, hq, hkv, d)
    }
    short_limit, everything = (
        attention_tiles.SHORT_REQUEST_TOKENS,
        (0, attention_tiles.MAX_QUERY_LEN),
    )
    plan = attention_tiles.launch_plan(gpu, 8192, 16, hq, hkv, d, None)
    assert [r for _, r in plan] == [
        (0, short_limit),
        (short_limit + 1, attention_tiles.MAX_QUERY_LEN),
    ]
    short, long = (t for t, _ in plan)
    assert short == attention_tiles.choose_tiles(gpu, 8192, 16, hq, hkv, d, None)
    assert long == attention_tiles.choose_tiles(gpu, 8192, 1, hq, hkv, d, None) != short
    assert long.block_n > short.block_n
    # new keys through TMA in 64-row tiles, without the page-id prefetch (stop 38's sweep)
    assert long.new_keys and long.block_q * long.group_pad == 64 and not long.prefetch_pages
    assert not short.prefetch_pages
    assert {
        attention_tiles.compiled_variant(short),
        attention_tiles.compiled_variant(long),
    } <= variants
    for tokens, seqs, max_query_len in [(8192, 1, None), (512, 16, None), (64, 64, 1),
                                        (20, 4, 5), (20000, 16, None)]:  # fmt: skip
        plan = attention_tiles.launch_plan(gpu, tokens, seqs, hq, hkv, d, max_query_len)
        assert [r for _, r in plan] == [everything], (tokens, seqs)
    assert len(attention_tiles.launch_plan(gpu, 8192, 16, hq, hkv, d, None, exact=True)) == 1
    assert len(attention_tiles.launch_plan(torch.device("cpu"), 8192, 16, hq, hkv, d, None)) == 1
    # without TMA (before sm_90) keys are gathered from the pages: 128-row long tiles load page
    # ids a block ahead (measured faster), 256-row ones do not
    monkeypatch.setattr(attention_tiles, "_has_tma", lambda device: False)
    paged = attention_tiles.choose_tiles.__wrapped__(gpu, 8192, 1, hq, hkv, d, None)
    assert not paged.new_keys and paged.prefetch_pages == (paged.block_q * paged.group_pad <= 128)


def test_only_the_one_row_decode_is_a_dependent_launch(monkeypatch):
    """The attention launch waits on rope + KV store (PDL) for one row only: at batch 8 and
    32 the same launch measured 3-9% slower on the H200; never on CPU or in float32."""
    _like_an_h200(monkeypatch)
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    choose = attention_tiles.choose_tiles.__wrapped__
    one = choose(gpu, 1, 1, 32, 8, 128, 1)
    assert one.pdl_wait and one.prefetch_pages
    for tokens, seqs, max_query_len in [(2, 2, 1), (8, 8, 1), (32, 32, 1), (5, 1, 5),
                                        (512, 1, None), (4, 4, 1)]:  # fmt: skip
        assert not choose(gpu, tokens, seqs, 32, 8, 128, max_query_len).pdl_wait
    assert not choose(cpu, 1, 1, 32, 8, 128, 1).pdl_wait
    assert not choose(gpu, 1, 1, 32, 8, 128, 1, exact=True).pdl_wait


def test_warm_up_launches_every_forced_variant_unfused(monkeypatch):
    """A forced one-token launch stands for a decode of many rows, which never takes the fused
    layer (whose attention launch also rotates and stores: another variant); only the plain
    batch-1 decode warms the fused path (the plain 2-token forward, for the few-row products,
    has no one-row layer to fuse). Even with the fused path forced on, each forced variant's
    forward is unfused, and only in the thread that runs it."""
    import contextlib
    import threading
    from types import SimpleNamespace

    from nanograph.layers import ops
    from nanograph.runners import warmup

    forced = [(1, contextlib.nullcontext()), (65, contextlib.nullcontext())]
    backend = SimpleNamespace(launch_variants=lambda *args: forced)
    config = SimpleNamespace(num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    embed = SimpleNamespace(weight=torch.zeros(1))
    runner = SimpleNamespace(
        attention=backend, device=torch.device("cpu"),
        model=SimpleNamespace(config=config, model=SimpleNamespace(embed_tokens=embed),
                              warmup_token_counts=lambda largest: [
                                  t for t in (1, 9, 40, 400) if t <= largest]),
    )  # fmt: skip
    row = torch.zeros(1, 8)
    monkeypatch.setattr(ops, "_FUSED_DECODE", "always")
    fused = []
    for tokens, selected in warmup._variants(runner, warmup.ForwardLimits(16, 256, 256)):
        with selected:
            fused.append((tokens, ops.fused_decode_applies(row)))
            other: list[bool] = []
            thread = threading.Thread(
                target=lambda out=other: out.append(ops.fused_decode_applies(row))
            )
            thread.start()
            thread.join()
            assert other == [True]
    # the model's own counts (its MoE tile regimes) as plain forwards, past the 1 and 2 above
    assert fused == [(1, True), (2, True), (9, True), (40, True), (1, False), (65, False)]
    # a 65-token query cannot come from a 64-token context: that variant is never launched
    short = warmup._variants(runner, warmup.ForwardLimits(16, 256, 64))
    assert [t for t, _ in short] == [1, 2, 9, 40, 1]


def test_scratch_batches_sample_every_row_of_a_few_row_forward():
    """A verify's logits are a few-row product (the LM head over every row): the warm-up's
    forwards of up to FEW_ROWS tokens sample every row so that variant compiles there; longer
    ones sample their last row only."""
    from nanograph.layers import ops
    from nanograph.runners.warmup import ForwardLimits, scratch_batch

    limits = ForwardLimits(page_size=4, max_tokens=64, max_query=64)
    assert scratch_batch(2, limits).sample_rows == [0, 1]
    assert scratch_batch(ops.FEW_ROWS, limits).sample_rows == list(range(ops.FEW_ROWS))
    assert scratch_batch(ops.FEW_ROWS + 1, limits).sample_rows == [ops.FEW_ROWS]
    assert scratch_batch(1, limits).sample_rows == [0]


def test_a_scratch_forward_longer_than_the_context_holds_several_requests():
    """With a context shorter than the chunk, a forward of a whole chunk holds several
    requests (the scheduler fills a chunk from any number of them): the scratch forwards of
    the warm-up and of the memory plan's activation peak take that shape, each request as
    long as the context allows, positions within it, and each request's last row sampled."""
    from nanograph.runners.warmup import ForwardLimits, scratch_batch

    limits = ForwardLimits(page_size=4, max_tokens=25, max_query=10)
    batch = scratch_batch(25, limits)
    assert batch.query_lens == batch.seq_lens == [10, 10, 5]
    assert batch.positions == [*range(10), *range(10), *range(5)]
    assert batch.sample_rows == [9, 19, 24]
    assert [len(t) for t in batch.page_tables] == [3, 3, 2]
    assert batch.slot_mapping == [-1] * 25  # no KV written
    one = scratch_batch(10, limits)
    assert one.query_lens == [10] and one.sample_rows == [9]


def test_the_activation_peak_is_measured_on_a_chunk_of_context_long_requests(monkeypatch):
    """Start-up's memory plan (CUDA only, its allocator calls stubbed here) runs one forward of
    a whole chunk through the model: with a 128-token context and a 300-token chunk, requests
    of 127, 127 and 46 tokens, not one request of the context's length."""
    from types import SimpleNamespace

    from nanograph.engine import startup
    from nanograph.runners.warmup import ForwardLimits

    forwards = []

    class Runner:
        def __init__(self, *args) -> None:
            pass

        def forward(self, batch):
            forwards.append(batch)

    monkeypatch.setattr(startup, "ModelRunner", Runner)
    for name in ("synchronize", "reset_peak_memory_stats"):
        monkeypatch.setattr(startup.torch.cuda, name, lambda *args: None)
    monkeypatch.setattr(startup.torch.cuda, "memory_allocated", lambda *args: 1000)
    monkeypatch.setattr(startup.torch.cuda, "max_memory_allocated", lambda *args: 1500)
    parts = SimpleNamespace(
        config=SimpleNamespace(chunked_prefill_size=300, page_size=16), max_model_len=128,
        model=None, attention=None, device=torch.device("cpu"),
    )  # fmt: skip
    parts._forward_limits = lambda: startup.Startup._forward_limits(parts)
    assert parts._forward_limits() == ForwardLimits(page_size=16, max_tokens=300, max_query=127)
    scratch = SimpleNamespace(k=[], v=[])
    assert startup.Startup._measure_activation_peak(parts, scratch) == 500
    (batch,) = forwards
    assert batch.query_lens == [127, 127, 46] and batch.sample_rows == [126, 253, 299]
