"""Runner logic on CPU: ladders, dispatch, padding and sentinels, fallback, flag validation.

The graph runner is exercised end to end with the ``eager`` graph backend (it replays by
calling the captured callable), so every padding/sentinel path runs through the real model.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanograph import LLM, SamplingParams
from nanograph.engine.config import EngineConfig
from nanograph.graph import GraphCaptureError, get_backend
from nanograph.runners.decode_runner import DecodeRunner
from nanograph.runners.forward_batch import ForwardBatch
from nanograph.runners.graph_runner import GraphRunner
from nanograph.runners.prefill_runner import PrefillRunner
from nanograph.runners.shapes import (
    ShapeKey,
    choose_shape,
    decode_batch_sizes,
    decode_shapes,
    prefill_shapes,
    prefill_token_buckets,
    verify_shapes,
)
from nanograph.runners.static_inputs import StaticInputs
from nanograph.runners.verify_runner import DraftExtendRunner

CPU = torch.device("cpu")


def test_ladders():
    assert decode_batch_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert decode_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    buckets = prefill_token_buckets(8192)
    assert 35 <= len(buckets) <= 45 and buckets[-1] == 8192 and buckets[0] == 16
    assert all(b % 16 == 0 for b in buckets) and buckets == sorted(set(buckets))
    assert prefill_token_buckets(100)[-1] == 100


def test_choose_shape():
    decode = decode_shapes([1, 2, 4, 8])
    assert choose_shape(decode, 3, 3) == ShapeKey(4, 4)
    assert choose_shape(decode, 8, 8) == ShapeKey(8, 8)
    assert choose_shape(decode, 9, 9) is None  # larger than the ladder: eager
    prefill = prefill_shapes([16, 32, 64, 128], slots=4)
    assert choose_shape(prefill, 20, 2, limit_padding=True) == ShapeKey(32, 4)
    assert choose_shape(prefill, 64, 4, limit_padding=True) == ShapeKey(64, 4)
    assert choose_shape(prefill, 64, 5, limit_padding=True) is None  # more requests than slots
    assert choose_shape(prefill, 129, 1, limit_padding=True) is None  # over the ceiling
    assert choose_shape(prefill, 7, 1, limit_padding=True) is None  # 16 > 2 x 7: eager
    assert choose_shape(prefill, 7, 1) == ShapeKey(16, 4)


def batch_of(lengths: list[tuple[int, int]], page_size: int = 4) -> ForwardBatch:
    """Requests given as (already cached, new tokens), pages numbered from 1."""
    next_page, ids, done, new, pages = 1, [], [], [], []
    for cached, n in lengths:
        count = -(-(cached + n) // page_size)
        pages.append(list(range(next_page, next_page + count)))
        next_page += count
        ids.append(list(range(100, 100 + cached + n)))
        done.append(cached)
        new.append(n)
    new_ids = [i[c : c + k] for i, c, k in zip(ids, done, new)]
    return ForwardBatch.build(new_ids, done, pages, page_size, [True] * len(lengths))


@pytest.mark.parametrize("long", [False, True])
def test_token_rows_of_short_and_long_requests(long):
    """Each new token's id, position and KV slot (its page's first slot plus its offset in the
    page), whether a request is short (lists) or long (numpy): requests starting mid-page,
    ending one token short of and at the numpy threshold, in shuffled pages. Short requests
    alone give lists; with a long one the rows are one int64 array each, and the static
    inputs hold the same rows either way."""
    from nanograph.runners.forward_batch import NUMPY_ROWS_FROM

    gen = torch.Generator().manual_seed(0)
    lengths = [(5, 1), (3, NUMPY_ROWS_FROM - 1), (13, 30)]
    lengths += [(0, NUMPY_ROWS_FROM), (13, 300), (0, 1000)] if long else []
    pages = [torch.randperm(400, generator=gen)[: -(-(c + n) // 4)].tolist() for c, n in lengths]
    ids = [torch.randint(0, 1000, (n,), generator=gen).tolist() for _, n in lengths]
    batch = ForwardBatch.build(ids, [c for c, _ in lengths], pages, 4, [True] * len(lengths))
    want_slots = [pg[p // 4] * 4 + p % 4 for (c, n), pg in zip(lengths, pages)
                  for p in range(c, c + n)]  # fmt: skip
    want_pos = [p for c, n in lengths for p in range(c, c + n)]
    want_ids = [t for r in ids for t in r]
    for rows, want in ((batch.input_ids, want_ids), (batch.positions, want_pos),
                       (batch.slot_mapping, want_slots)):  # fmt: skip
        assert isinstance(rows, np.ndarray if long else list)
        assert list(rows) == want
        if long:
            assert rows.dtype == np.int64
    assert batch.num_tokens == len(want_ids)
    assert batch.sample_rows == list(np.cumsum([n for _, n in lengths]) - 1)
    static = StaticInputs(max_tokens=2048, max_slots=8, max_pages=400, page_size=4, device=CPU)
    static.copy_from(batch, ShapeKey(2048, 8))
    n = batch.num_tokens
    assert static.input_ids[:n].tolist() == want_ids
    assert static.positions[:n].tolist() == want_pos
    assert static.slot_mapping[:n].tolist() == want_slots


def test_padding_and_sentinels():
    static = StaticInputs(max_tokens=32, max_slots=4, max_pages=8, page_size=4, device=CPU)
    batch = batch_of([(0, 5), (3, 2)])
    static.copy_from(batch, ShapeKey(16, 4))
    assert static.input_ids[:7].tolist() == batch.input_ids
    assert static.input_ids[7:16].tolist() == [0] * 9
    assert static.slot_mapping[:7].tolist() == batch.slot_mapping
    assert static.slot_mapping[7:16].tolist() == [-1] * 9  # padded rows write no KV
    assert static.seq_lens[:4].tolist() == [5, 5, 0, 0]  # two zero-length sentinels
    assert static.query_lens[:4].tolist() == [5, 2, 0, 0]
    assert static.query_start_loc[:5].tolist() == [0, 5, 7, 7, 7]  # parked after real tokens
    assert static.num_tokens.tolist() == [7]
    assert static.page_table[2:4].eq(0).all()  # sentinels point at the scratch page
    assert static.seq_lens_cpu == [5, 5, 0, 0] and static.query_lens_cpu == [5, 2, 0, 0]
    # a smaller batch afterwards leaves no stale state behind in the shape it uses
    static.copy_from(batch_of([(0, 3)]), ShapeKey(16, 4))
    assert static.seq_lens[:4].tolist() == [3, 0, 0, 0]
    assert static.query_start_loc[:5].tolist() == [0, 3, 3, 3, 3]
    assert static.slot_mapping[3:16].tolist() == [-1] * 13
    meta = static.metadata(ShapeKey(16, 4), max_query_len=16)
    assert meta.num_slots == 4 and meta.slot_mapping.shape == (16,)
    assert static.fits(batch) and not static.fits(batch_of([(0, 40)]))


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    # no prefix caching: these tests resend prompts and need them prefilled again
    return LLM(str(tiny_model_dir("qwen3")), page_size=4, kv_cache_bytes=4 * 2**20,
               disable_prefix_caching=True, progress=False)  # fmt: skip


def make_runner(llm, path: str, shapes: list[ShapeKey]) -> GraphRunner:
    e = llm.engine
    runner_type = DecodeRunner if path == "decode" else PrefillRunner
    runner = runner_type(
        e.model, e.attention, e.kv_cache.k, e.kv_cache.v, get_backend("eager"), shapes,
        e.kv_cache.pages_needed(e.max_model_len), e.kv_cache.page_size, CPU,
    )  # fmt: skip
    runner.capture(progress=False)
    return runner


GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


def test_runners_pad_and_fall_back_without_changing_tokens(llm):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (k,), generator=g).tolist() for k in (5, 17, 30, 9, 12)]
    reference = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    runners = {
        "decode": make_runner(llm, "decode", decode_shapes([1, 2, 4])),
        "prefill": make_runner(llm, "prefill", prefill_shapes([16, 32, 64], slots=2)),
    }
    llm.engine.runner.graph_runners = runners
    try:
        # fewer requests than slots, exactly the slot count, and one more (eager fallback)
        for count in (1, 2, 3, 5):
            outs = llm.generate(prompts[:count], GREEDY)
            assert [o.token_ids for o in outs] == reference[:count]
    finally:
        llm.engine.runner.graph_runners = {}
    assert runners["decode"].replays > 0 and runners["prefill"].replays > 0
    assert runners["decode"].fallbacks > 0  # 5 decoding requests > largest decode shape (4)
    assert runners["prefill"].fallbacks > 0  # 3+ prompts in one forward > 2 slots


def test_runners_serve_cached_prefixes(tiny_model_dir, llm):
    """Prompts whose heads are cached reach the prefill runner with seq_len > query_len (and
    sentinel slots): the same tokens as without caching, through replays."""
    g = torch.Generator().manual_seed(1)
    heads = [torch.randint(0, 256, (k,), generator=g).tolist() for k in (9, 21)]
    prompts = [h + torch.randint(0, 256, (6,), generator=g).tolist() for h in heads]
    reference = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    cached = LLM(str(tiny_model_dir("qwen3")), page_size=4, kv_cache_bytes=4 * 2**20,
                 progress=False)  # fmt: skip
    cached.generate(heads, GREEDY)
    runner = make_runner(cached, "prefill", prefill_shapes([16, 32, 64], slots=4))
    cached.engine.runner.graph_runners = {"prefill": runner}
    outs = cached.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == reference
    assert [o.num_cached_tokens for o in outs] == [8, 20]
    assert runner.replays > 0 and runner.fallbacks == 0


def test_largest_chunk_replays_a_graph(llm):
    runner = make_runner(llm, "prefill", prefill_shapes([16, 32, 64], slots=2))
    batch = batch_of([(0, 64)])
    assert runner.dispatch(batch) == ShapeKey(64, 2)
    assert runner.dispatch(batch_of([(0, 65)])) is None


def test_draft_extend_takes_one_and_two_token_shapes_for_short_catch_ups(llm):
    """A draft-extend runner holds k+1-token shapes and one- and two-token shapes: a catch-up
    of one token a request takes the smallest one-token shape, one of up to two the smallest
    two-token shape, one with a longer request the smallest k+1-token shape that holds it
    (even where a shorter shape has room for its tokens), one longer than k+1 none; each
    replay gives the eager forward's hidden states."""
    e = llm.engine
    shapes = verify_shapes([1, 4], 5) + verify_shapes([1, 4], 2) + decode_shapes([1, 4])
    runner = DraftExtendRunner(
        e.model, e.attention, e.kv_cache.k, e.kv_cache.v, get_backend("eager"), shapes,
        e.kv_cache.pages_needed(e.max_model_len), e.kv_cache.page_size, CPU, query_len=5,
    )  # fmt: skip
    runner.capture(progress=False)
    # 1x1 2x1 4x4 5x1 8x4 20x4
    assert [runner.max_query_len(s) for s in sorted(shapes)] == [1, 2, 1, 5, 2, 5]
    cases = {
        ((3, 1),): ShapeKey(1, 1),
        ((3, 1), (2, 1), (5, 1)): ShapeKey(4, 4),
        ((3, 2),): ShapeKey(2, 1),
        ((3, 2), (2, 1)): ShapeKey(8, 4),  # 4x4 has room for 3 tokens, but for one-token requests
        ((3, 3),): ShapeKey(5, 1),
        ((3, 3), (2, 1)): ShapeKey(20, 4),
        ((0, 6),): None,
    }
    for lengths, want in cases.items():
        batch = batch_of(list(lengths))
        assert runner.dispatch(batch) == want, lengths
        if want is not None:
            expected = e.runner.eager_forward(batch)
            got = runner.forward(batch)
            torch.testing.assert_close(got, expected[: batch.num_tokens], rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def draft_extend(llm):
    e = llm.engine
    runner = DraftExtendRunner(
        e.model, e.attention, e.kv_cache.k, e.kv_cache.v, get_backend("eager"),
        verify_shapes([1, 2, 4], 3) + verify_shapes([1, 2, 4], 2) + decode_shapes([1, 2, 4]),
        e.kv_cache.pages_needed(e.max_model_len), e.kv_cache.page_size, CPU, query_len=3,
    )  # fmt: skip
    runner.capture(progress=False)
    return runner


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=5))
def test_dispatch_takes_the_smallest_shape_that_holds_the_batch(draft_extend, new_tokens):
    # whatever the mix of one-token and longer requests: the first shape in (tokens, slots)
    # order with room for the tokens and the requests whose query bound holds the longest
    # request, or none (eager)
    batch = batch_of([(2, n) for n in new_tokens])
    holds = [
        s for s in sorted(draft_extend.graphs)
        if s.num_tokens >= batch.num_tokens and s.num_slots >= batch.num_requests
        and draft_extend.max_query_len(s) >= max(new_tokens)
    ]  # fmt: skip
    assert draft_extend.dispatch(batch) == (holds[0] if holds else None)


@pytest.mark.parametrize("flag", ["decode_cuda_graph", "prefill_cuda_graph"])
def test_graph_flags_need_cuda(flag):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="needs CUDA"):
        EngineConfig(**{flag: "full"})
    with pytest.raises(ValueError, match="must be one of"):
        EngineConfig(**{flag: "fast"})
    assert EngineConfig().graph_backend(flag.split("_")[0]) == "none"


def test_prefill_graph_tokens_validation():
    assert EngineConfig(prefill_graph_tokens=(64, 16, 64)).prefill_graph_tokens == (16, 64)
    with pytest.raises(ValueError, match="chunked_prefill_size"):
        EngineConfig(chunked_prefill_size=256, prefill_graph_tokens=(512,))


def test_cuda_graph_bs_validation():
    assert EngineConfig(max_num_seqs=8, cuda_graph_bs=(8, 1, 8)).cuda_graph_bs == (1, 8)
    with pytest.raises(ValueError, match="max_num_seqs"):
        EngineConfig(max_num_seqs=4, cuda_graph_bs=(8,))
    with pytest.raises(ValueError, match="positive"):
        EngineConfig(cuda_graph_bs=(0, 2))


class FailingBackend:
    """The eager backend, except that capturing a shape of ``fail_rows`` tokens fails."""

    name = "failing"

    def __init__(self, fail_rows: int) -> None:
        self.inner, self.fail_rows = get_backend("eager"), fail_rows

    def capture(self, fn, pool=None):
        if fn().shape[0] == self.fail_rows:
            raise GraphCaptureError("capture failed at model.py:1: `x.item()`")
        return self.inner.capture(fn, pool)


def test_a_shape_that_fails_to_capture_stays_eager_with_one_warning(llm, caplog):
    e = llm.engine
    runner = PrefillRunner(
        e.model, e.attention, e.kv_cache.k, e.kv_cache.v, FailingBackend(32),
        prefill_shapes([16, 32, 64], slots=2), e.kv_cache.pages_needed(e.max_model_len),
        e.kv_cache.page_size, CPU,
    )  # fmt: skip
    with caplog.at_level("WARNING", logger="nanograph"):
        runner.capture(progress=False)
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "1 of 3 shapes" in warnings[0].getMessage()
    assert set(runner.graphs) == {ShapeKey(16, 2), ShapeKey(64, 2)}
    assert list(runner.failed) == [ShapeKey(32, 2)]
    assert runner.dispatch(batch_of([(0, 40)])) == ShapeKey(64, 2)  # next captured shape
    assert runner.dispatch(batch_of([(0, 20)])) is None  # 64 > 2 x 20 tokens: eager


def test_model_traces_fullgraph_and_splits_at_attention(llm):
    """tc_piecewise's CPU half on the real model: dynamo traces the forward in one graph, it
    splits once per layer at the attention op, and the split program matches eager."""
    from nanograph.attention.op import ForwardContext, forward_context
    from nanograph.graph.piecewise_compiler import PiecewiseCompiler, trace_and_split

    e = llm.engine
    batch = batch_of([(0, 9), (4, 3)])
    static = StaticInputs(16, 2, 16, e.kv_cache.page_size, CPU)
    static.copy_from(batch, ShapeKey(16, 2))
    ctx = ForwardContext(e.attention, static.metadata(ShapeKey(16, 2), 16), e.kv_cache.k,
                         e.kv_cache.v)  # fmt: skip

    def forward():
        return e.model(static.input_ids, static.positions)

    compiler = PiecewiseCompiler("eager")
    with forward_context(ctx), torch.inference_mode():
        expected = forward()
        compiled = trace_and_split(forward, compiler)
        got = compiled()
    layers = e.model_config.num_hidden_layers
    assert compiler.splits == {"nanograph::attend": layers}
    assert len(compiler.pieces) == layers + 1
    # the attention op (it mutates q and k) runs as a direct call, not through the dispatcher
    direct = [v for v in vars(compiler.split_gm).values() if type(v).__name__ == "DirectSplit"]
    assert len(direct) == layers
    torch.testing.assert_close(got[: batch.num_tokens], expected[: batch.num_tokens])


def test_padded_rows_of_a_padded_forwards_attention_read_zero(llm):
    """A forward padded into a shape (12 tokens in 16 rows): the rope+store op zeroes the
    attention output's padded rows (no zero-fill kernel of its own), attention writes the
    others; a buffer holding NaN gives what a zeroed one gives."""
    from nanograph.attention.op import ForwardContext, forward_context

    e = llm.engine
    batch = batch_of([(0, 9), (4, 3)])
    shape = ShapeKey(16, 2)
    static = StaticInputs(16, 2, 16, e.kv_cache.page_size, CPU)
    static.copy_from(batch, shape)
    ctx = ForwardContext(e.attention, static.metadata(shape, 16), e.kv_cache.k, e.kv_cache.v)
    attn = e.model.model.layers[0].self_attn
    g = torch.Generator().manual_seed(5)
    qkv = torch.randn(16, attn.q_size + 2 * attn.kv_size, generator=g)
    outs = []
    with forward_context(ctx), torch.inference_mode():
        for fill in (0.0, float("nan")):
            out = torch.full((16, attn.num_heads, attn.head_dim), fill)
            attn.attend(static.positions[:16], qkv.clone(), e.model.cos_sin_cache, out)
            outs.append(out)
    assert torch.all(outs[1][batch.num_tokens :] == 0)
    torch.testing.assert_close(outs[1], outs[0])


@pytest.mark.parametrize("compile_backend", ["eager", "inductor"])
def test_one_compile_serves_every_shape_of_a_runner(llm, compile_backend):
    """The runner's pattern: a closure per shape over views of the static buffers, largest
    first. One PiecewiseCompiler compiles for symbolic token counts: twice in all, since the
    first shape spans the whole buffer and dynamo relates the view to its base; every later
    shape reuses the second compile. Every shape matches eager."""
    from nanograph.attention.op import ForwardContext, forward_context
    from nanograph.graph.piecewise_compiler import PiecewiseCompiler, trace_and_split

    torch._dynamo.reset()  # dynamo remembers sizes that changed in earlier tests
    e = llm.engine
    static = StaticInputs(48, 2, 16, e.kv_cache.page_size, CPU)
    compiler = PiecewiseCompiler(compile_backend)
    for tokens, batch in ((48, batch_of([(0, 30), (4, 10)])), (32, batch_of([(2, 20)])),
                          (16, batch_of([(0, 9), (4, 3)])), (24, batch_of([(3, 17)]))):  # fmt: skip
        shape = ShapeKey(tokens, 2)
        static.copy_from(batch, shape)
        ctx = ForwardContext(e.attention, static.metadata(shape, tokens), e.kv_cache.k,
                             e.kv_cache.v)  # fmt: skip
        ids, positions = static.input_ids[:tokens], static.positions[:tokens]

        def forward(ids=ids, positions=positions):
            return e.model(ids, positions)

        with forward_context(ctx), torch.inference_mode():
            expected = forward()
            got = trace_and_split(forward, compiler)()
        torch.testing.assert_close(got[: batch.num_tokens], expected[: batch.num_tokens])
    assert compiler.compiles == 2


def test_prefill_shapes_above_the_context_capture_over_several_slots(llm):
    """A token bucket larger than one request's context (chunked_prefill_size above
    max_model_len) is captured with its tokens spread over the request slots; a bucket that no
    batch can reach is refused (the engine leaves such buckets out of its ladder)."""
    context = llm.engine.max_model_len
    runner = make_runner(llm, "prefill", prefill_shapes([2 * context + 16], slots=3))
    assert not runner.failed and len(runner.graphs) == 1
    with pytest.raises(ValueError, match="more tokens than 3 requests"):
        make_runner(llm, "prefill", prefill_shapes([3 * context + 16], slots=3))


def imported_modules(package) -> set[str]:
    """Every module the package's files import (ast, no import run)."""
    import ast
    from pathlib import Path

    names = set()
    for path in Path(package.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
    return names


def test_engine_imports_nothing_from_graph():
    """DESIGN.md: the engine asks runners to run batches; backends are the runners' business."""
    import nanograph.engine

    assert not [m for m in imported_modules(nanograph.engine) if m.startswith("nanograph.graph")]


def test_layers_import_nothing_from_models():
    """Imports point downwards: models are built from layers, never the other way round."""
    import nanograph.layers

    assert not [m for m in imported_modules(nanograph.layers) if m.startswith("nanograph.models")]


def test_graph_callables_read_only_buffers_their_runner_keeps(llm):
    """A CUDA graph keeps no reference to the tensors it reads, and a runner drops a shape's
    callable once it is captured: every tensor a callable closes over must share storage with
    a buffer the runner (or its static inputs) keeps. The draft loop's own ``arange`` was freed
    after capture and reused, and the H200 replay indexed the page table with what landed there
    (the eager backend here keeps the callable, so end-to-end CPU tests cannot see it)."""
    from nanograph.runners.decode_runner import DraftRunner

    e, kv = llm.engine, llm.engine.kv_cache
    loop = DraftRunner(
        e.model, e.attention, kv.k, kv.v, get_backend("eager"), decode_shapes([1, 2, 4]),
        kv.pages_needed(e.max_model_len + 3), kv.page_size, CPU, loop_steps=2,
    )  # fmt: skip
    runners = [
        make_runner(llm, "decode", decode_shapes([1, 2])),
        make_runner(llm, "prefill", prefill_shapes([8, 16], 2)),
        loop,
    ]
    for runner in runners:
        kept = [*vars(runner).values(), *vars(runner.static).values()]
        owned = {t.untyped_storage().data_ptr() for t in kept if isinstance(t, torch.Tensor)}
        for shape in runner.shapes:
            fn = runner._graph_fn(shape)
            cells = [c.cell_contents for c in fn.__closure__ or ()]
            tensors = [t for t in cells if isinstance(t, torch.Tensor)]
            assert tensors, f"{type(runner).__name__} {shape}: the callable reads no buffer?"
            for t in tensors:
                assert t.untyped_storage().data_ptr() in owned, (
                    f"{type(runner).__name__} {shape}: a graph input the runner does not keep"
                )


def test_page_table_past_each_request_is_scratch_after_any_batch_sequence():
    """The draft loop reads page-table columns past a request's pages (steps beyond its drafts)
    and must find the scratch page 0 there, whatever larger batches came before: many long
    requests in a wide shape, then few short ones in a narrow shape, then many short ones in a
    wide shape again (each pinned mirror in turn; sentinel slots included)."""
    static = StaticInputs(max_tokens=8, max_slots=8, max_pages=16, page_size=4, device=CPU)
    g = torch.Generator().manual_seed(0)
    for requests, slots, pages in [(8, 8, 12), (8, 8, 12), (2, 2, 3), (2, 2, 3), (6, 8, 2),
                                   (6, 8, 2), (5, 8, 16), (1, 1, 1), (3, 4, 4), (7, 8, 1),
                                   (7, 8, 1)]:  # fmt: skip
        tables = [torch.randint(1, 100, (pages,), generator=g).tolist() for _ in range(requests)]
        batch = ForwardBatch.build([[1]] * requests, [pages * 4 - 1] * requests, tables, 4,
                                   [True] * requests)  # fmt: skip
        static.copy_from(batch, ShapeKey(8, slots))
        table = static.page_table[:slots]
        assert table[:requests, :pages].tolist() == tables
        assert table[:, pages:].eq(0).all() and table[requests:].eq(0).all()


@pytest.mark.parametrize(("tokens", "slots", "pages"), [(8, 8, 16), (7, 3, 5), (8192, 16, 513)])
def test_static_inputs_are_one_buffer_of_aligned_blocks(tokens, slots, pages):
    """Token rows, lengths and page table share one buffer (a step refills them with one copy)
    and every buffer a kernel takes starts 16-byte aligned, odd sizes included (Triton compiles
    a variant per pointer alignment)."""
    static = StaticInputs(max_tokens=tokens, max_slots=slots, max_pages=pages, page_size=4,
                          device=CPU)  # fmt: skip
    names = ("input_ids", "positions", "slot_mapping", "seq_lens", "query_lens",
             "query_start_loc", "num_tokens", "page_table")  # fmt: skip
    blocks = [getattr(static, name) for name in names]
    storage = static.input_ids.untyped_storage().data_ptr()
    assert all(b.untyped_storage().data_ptr() == storage for b in blocks)
    assert all(b.data_ptr() % 16 == 0 for b in blocks)
    assert static.page_table.shape == (slots, pages) and static.page_table.is_contiguous()


_BATCH = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 5)), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_BATCH, st.integers(0, 3)), min_size=1, max_size=6))
def test_static_inputs_hold_exactly_the_live_batch_after_any_sequence(batches):
    """Whatever came before, a graph's buffers after ``copy_from`` hold the live batch and the
    padding rules, and their metadata equals an eager forward's on the live part; every lengths
    segment starts 16-byte aligned in both (Triton compiles a variant per pointer alignment)."""
    from nanograph.runners.attention_inputs import eager_inputs

    static = StaticInputs(max_tokens=48, max_slots=12, max_pages=16, page_size=4, device=CPU)
    for lengths, spare_slots in batches:
        batch = batch_of(lengths)
        r, t = batch.num_requests, batch.num_tokens
        s = r + spare_slots
        static.copy_from(batch, ShapeKey(48, s))
        meta = static.metadata(ShapeKey(48, s), max_query_len=5)
        _, _, eager = eager_inputs(batch, CPU)
        for m in (meta, eager):
            for lens in (m.seq_lens, m.query_lens, m.query_start_loc, m.num_tokens):
                assert lens.data_ptr() % 16 == 0
        assert meta.seq_lens[:r].tolist() == eager.seq_lens.tolist() == batch.seq_lens
        assert meta.query_lens[:r].tolist() == eager.query_lens.tolist() == batch.query_lens
        assert meta.query_start_loc[: r + 1].tolist() == eager.query_start_loc.tolist()
        assert meta.seq_lens[r:].eq(0).all() and meta.query_lens[r:].eq(0).all()
        assert meta.query_start_loc[r + 1 :].eq(t).all()
        assert meta.num_tokens.tolist() == eager.num_tokens.tolist() == [t]
        width = batch.max_pages
        assert meta.page_table[:r, :width].tolist() == eager.page_table.tolist()
        for row, pages in enumerate(batch.page_tables):
            assert meta.page_table[row, len(pages) :].eq(0).all()
        assert meta.page_table[r:].eq(0).all()
        assert static.input_ids[:t].tolist() == batch.input_ids
        assert static.positions[:t].tolist() == batch.positions
        assert meta.slot_mapping[:t].tolist() == eager.slot_mapping.tolist()
        assert static.input_ids[t:].eq(0).all() and meta.slot_mapping[t:].eq(-1).all()
