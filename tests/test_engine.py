"""Engine behaviour on a tiny random Qwen3: batching, chunking, preemption, sampling, errors."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_pages_back, make_llm

from nanograph import LLM, SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 40, (n,), generator=g).tolist()
    return [torch.randint(0, 256, (k,), generator=g).tolist() for k in lengths]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return tiny_model_dir("qwen3")


def test_mixed_batch_equals_each_alone(tiny):
    llm = make_llm(tiny)
    batch = prompts(6)
    together = [o.token_ids for o in llm.generate(batch, GREEDY)]
    alone = [llm.generate([p], GREEDY)[0].token_ids for p in batch]
    assert together == alone
    assert all(len(t) == 12 for t in together)


def test_tiny_chunks_match_unchunked(tiny):
    batch = prompts(4, seed=1)
    ref = [o.token_ids for o in make_llm(tiny).generate(batch, GREEDY)]
    chunked = make_llm(tiny, chunked_prefill_size=7).generate(batch, GREEDY)
    assert [o.token_ids for o in chunked] == ref


def test_preemption_when_pool_runs_out(tiny):
    batch = prompts(8, seed=2)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    ref = [o.token_ids for o in make_llm(tiny).generate(batch, params)]
    # 16 pages of 4 tokens (minus the scratch page): far less than 8 requests need together
    per_token = 2 * 2 * 2 * 16 * 4  # k+v, layers, kv heads, head_dim, float32
    small = make_llm(tiny, kv_cache_bytes=16 * 4 * per_token)
    outs = small.generate(batch, params)
    assert [o.token_ids for o in outs] == ref
    assert sum(o.num_preemptions for o in outs) > 0
    assert_pages_back(small)


def test_finish_reasons_and_stop_tokens(tiny):
    llm = make_llm(tiny)
    p = prompts(1, seed=3)[0]
    free = llm.generate([p], GREEDY)[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 12
    assert free.stop_reason is None
    stop_at = free.token_ids[4]
    first = free.token_ids.index(stop_at)
    stopped = llm.generate(
        [p], SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=(stop_at,))
    )[0]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop_at
    assert stopped.token_ids == free.token_ids[:first]
    assert stopped.ttft_s is not None and stopped.ttft_s >= 0


def test_sampling_settings(tiny):
    llm = make_llm(tiny)
    batch = prompts(3, seed=4)
    greedy = [o.token_ids for o in llm.generate(batch, GREEDY)]
    for params in (
        SamplingParams(max_tokens=12, temperature=0.8, top_k=1, ignore_eos=True),
        SamplingParams(max_tokens=12, temperature=0.8, top_p=1e-6, ignore_eos=True),
        SamplingParams(max_tokens=12, temperature=0.8, min_p=1.0, ignore_eos=True),
    ):
        assert [o.token_ids for o in llm.generate(batch, params)] == greedy
    seeded = SamplingParams(max_tokens=12, temperature=1.0, seed=7, ignore_eos=True)
    alone = llm.generate([batch[0]], seeded)[0].token_ids
    others = SamplingParams(max_tokens=12, temperature=1.0, ignore_eos=True)
    mixed = llm.generate(batch, [seeded, others, others])[0].token_ids
    assert alone == mixed  # a seeded request does not depend on its batch
    unseeded = llm.generate([batch[0]] * 4, others)
    assert len({tuple(o.token_ids) for o in unseeded}) > 1  # sampling really samples


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_tokens=0), "max_tokens"),
        (dict(temperature=-0.1), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-2), "top_k"),
        (dict(min_p=2.0), "min_p"),
    ],
)
def test_bad_sampling_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_bad_requests_fail_alone_and_engine_keeps_serving(tiny):
    llm = make_llm(tiny, max_model_len=64)
    good = prompts(2, seed=5)
    ref = [o.token_ids for o in llm.generate(good, GREEDY)]
    bad_and_good = [good[0], [], list(range(100)), [5, 999], good[1], "text needs a tokenizer"]
    outs = llm.generate(bad_and_good, GREEDY)
    assert [o.finish_reason for o in outs] == [
        "length",
        "error",
        "error",
        "error",
        "length",
        "error",
    ]
    assert "empty" in outs[1].error
    assert "context length is 64" in outs[2].error
    assert "outside the vocabulary" in outs[3].error
    assert "token ids" in outs[5].error
    assert [outs[0].token_ids, outs[4].token_ids] == ref
    assert llm.generate(good, GREEDY)[0].token_ids == ref[0]


def test_sampling_params_of_the_wrong_kind_are_refused_before_any_request(tiny):
    llm = make_llm(tiny)
    good = prompts(2, seed=5)
    with pytest.raises(TypeError, match=r"got dict: build SamplingParams\(\*\*params\)"):
        llm.generate(good, {"max_tokens": 4, "temperature": 0.0})  # not its keys as a list
    with pytest.raises(TypeError, match="or a list of them"):
        llm.generate(good, 4)
    outs = llm.generate(good, [GREEDY, {"max_tokens": 4}])
    assert outs[0].ok and outs[1].error == "sampling params must be a SamplingParams, got dict"
    assert_pages_back(llm)


def test_a_chat_template_given_replaces_the_models(tiny_with_tokenizer, tiny, tmp_path):
    """``chat_template`` (vLLM's and SGLang's --chat-template): a file or the template's text;
    what does not parse, a path that is no file, or a model without a tokenizer: refused."""
    from nanograph.loader.errors import ModelLoadError

    # loop controls and {% generation %}: transformers' own template tags parse too
    template = (
        "{% for m in messages %}<{{ m['role'] }}>{% generation %}{{ m['content'] }}"
        "{% endgeneration %}{{ '\\n' }}{% if loop.last %}{% break %}{% endif %}{% endfor %}"
    )
    path = tmp_path / "chat.jinja"
    path.write_text(template)
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    for given in (str(path), template):
        llm = make_llm(tiny_with_tokenizer, chat_template=given)
        out = llm.chat(conversation, SamplingParams(max_tokens=1))[0]
        expected = llm.engine.tokenizer.encode("<user>hi\n<assistant>yo\n", False)
        assert out.prompt_token_ids == expected
    for given, message in ((str(tmp_path / "none.jinja"), "no such file"),
                           ("{% for m in messages %}", "does not parse")):  # fmt: skip
        with pytest.raises(ModelLoadError, match=message):
            make_llm(tiny_with_tokenizer, chat_template=given)
    with pytest.raises(ModelLoadError, match="needs the model's tokenizer"):
        make_llm(tiny, chat_template=str(path))


def test_unknown_engine_argument(tiny):
    with pytest.raises(TypeError, match="unknown engine argument"):
        LLM(str(tiny), not_a_flag=1)


def test_vllm_enable_prefix_caching_is_ours_negated(tiny):
    assert LLM(str(tiny), enable_prefix_caching=False).engine.config.disable_prefix_caching
    assert not LLM(str(tiny), enable_prefix_caching=True).engine.config.disable_prefix_caching
    with pytest.raises(ValueError, match="disagree"):
        LLM(str(tiny), enable_prefix_caching=True, disable_prefix_caching=True)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_workloads_match_a_big_pool(tiny, seed):
    """Random prompt lengths, max_tokens, chunk sizes, seat limits and tight pools: every
    request finishes with the tokens it gets alone in a roomy engine, and no page leaks."""
    g = torch.Generator().manual_seed(100 + seed)
    n = int(torch.randint(4, 10, (1,), generator=g))
    batch = [torch.randint(0, 256, (int(k),), generator=g).tolist()
             for k in torch.randint(1, 60, (n,), generator=g)]  # fmt: skip
    params = [SamplingParams(max_tokens=int(m), temperature=0.0, ignore_eos=True)
              for m in torch.randint(1, 20, (n,), generator=g)]  # fmt: skip
    reference = [o.token_ids for o in make_llm(tiny).generate(batch, params)]
    per_page = 4 * 2 * 2 * 2 * 16 * 4  # page_size x k/v x layers x kv heads x head_dim x fp32
    tight = make_llm(
        tiny,
        kv_cache_bytes=int(torch.randint(22, 40, (1,), generator=g)) * per_page,
        chunked_prefill_size=int(torch.randint(3, 40, (1,), generator=g)),
        max_num_seqs=int(torch.randint(1, 6, (1,), generator=g)),
    )
    outs = tight.generate(batch, params)
    assert [o.token_ids for o in outs] == reference
    assert_pages_back(tight)
    assert not tight.engine.has_work()


def test_max_tokens_past_the_context_stops_at_the_context(tiny):
    """A pool that holds exactly one full context serves a request whose max_tokens would run
    past the context: it stops with "length" at max_model_len instead of failing."""
    per_page = 4 * 2 * 2 * 2 * 16 * 4  # page_size x k/v x layers x kv heads x head_dim x fp32
    llm = make_llm(tiny, max_model_len=32, kv_cache_bytes=(32 // 4 + 1) * per_page)
    out = llm.generate([list(range(1, 11))], SamplingParams(max_tokens=100, temperature=0,
                                                            ignore_eos=True))[0]  # fmt: skip
    assert out.finish_reason == "length", out.error
    assert len(out.token_ids) == 32 - 10


def test_generate_shows_a_bar_of_finished_prompts_on_a_terminal(tiny, monkeypatch, capsys):
    """vLLM's use_tqdm: a bar on a terminal, finished prompts of the batch (a bad prompt
    counts as finished), and none with use_tqdm=False, progress=False or off a terminal."""
    import sys

    llm = make_llm(tiny, progress=True)
    batch = prompts(3) + [[10**9]]  # the last is outside the vocabulary: an error output
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    outs = llm.generate(batch, GREEDY)
    err = capsys.readouterr().err
    assert "Processed prompts" in err and "4/4" in err and "tok/s" in err
    assert [o.ok for o in outs] == [True, True, True, False]
    assert [o.token_ids for o in outs[:3]] == [
        o.token_ids for o in llm.generate(batch[:3], GREEDY, use_tqdm=False)
    ]
    assert "Processed prompts" not in capsys.readouterr().err
    quiet = make_llm(tiny)  # progress=False
    quiet.generate(batch[:1], GREEDY)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    llm.generate(batch[:1], GREEDY)
    assert "Processed prompts" not in capsys.readouterr().err


def test_pending_tokens_equal_the_joined_slice():
    from nanograph.engine.request import Request

    r = Request(0, [1, 2, 3, 4], SamplingParams(), output_ids=[5, 6, 7])
    for start in range(8):
        for n in range(8 - start):
            r.num_computed = start
            assert r.pending_tokens(n) == r.token_ids[start : start + n]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_overlap_schedule_matches_serial_steps(tiny, seed):
    """The overlap schedule (step t+1 launched before step t's tokens are read) gives the same
    tokens and finish reasons as serial steps: with stop tokens that end requests while their
    next step is already in flight, seeded sampling, chunking and preemption in a tight pool."""
    g = torch.Generator().manual_seed(200 + seed)
    n = int(torch.randint(4, 10, (1,), generator=g))
    batch = [torch.randint(0, 256, (int(k),), generator=g).tolist()
             for k in torch.randint(1, 50, (n,), generator=g)]  # fmt: skip
    free = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    runs = [o.token_ids for o in make_llm(tiny).generate(batch, free)]
    params = []
    for i, tokens in enumerate(runs):
        kind = i % 3
        if kind == 0:  # stops on a token it would produce mid-way
            stop = tokens[int(torch.randint(1, len(tokens), (1,), generator=g))]
            params.append(SamplingParams(max_tokens=16, temperature=0.0, stop_token_ids=(stop,)))
        elif kind == 1:
            params.append(SamplingParams(max_tokens=int(torch.randint(1, 16, (1,), generator=g)),
                                         temperature=0.8, top_k=20, seed=i))  # fmt: skip
        else:
            params.append(SamplingParams(max_tokens=int(torch.randint(1, 16, (1,), generator=g)),
                                         temperature=0.0, ignore_eos=True))  # fmt: skip
    per_page = 4 * 2 * 2 * 2 * 16 * 4  # page_size x k/v x layers x kv heads x head_dim x fp32
    config = dict(
        kv_cache_bytes=int(torch.randint(20, 40, (1,), generator=g)) * per_page,
        chunked_prefill_size=int(torch.randint(3, 40, (1,), generator=g)),
        max_num_seqs=int(torch.randint(1, 6, (1,), generator=g)),
    )
    outs = {}
    for overlap in (False, True):
        llm = make_llm(tiny, disable_overlap_schedule=not overlap, **config)
        outs[overlap] = [(o.token_ids, o.finish_reason) for o in llm.generate(batch, params)]
        assert_pages_back(llm)
        assert not llm.engine.has_work()
    assert outs[True] == outs[False]
    assert any(reason == "stop" for _, reason in outs[True])
    assert all(t >= 0 for tokens, _ in outs[True] for t in tokens)  # nothing left unresolved


def test_a_stop_token_leaves_the_engine_idle(tiny):
    """Under the overlap schedule the step after a stop token is already in flight when the
    host reads it; generate still returns with the engine idle and every page back."""
    llm = make_llm(tiny)
    free = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=8, temperature=0,
                                                    ignore_eos=True))[0].token_ids  # fmt: skip
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=8, temperature=0,
                                                   stop_token_ids=(free[2],)))[0]  # fmt: skip
    assert out.finish_reason == "stop"
    assert out.token_ids == free[: free.index(free[2])]
    assert not llm.engine.has_work()
    assert_pages_back(llm)


@pytest.mark.parametrize("overlap", [True, False])
def test_overlap_schedule_launches_before_it_reads(tiny, monkeypatch, overlap):
    """Under the overlap schedule the host launches step t+1 before it reads step t's tokens
    (the point of it); with it disabled each step is read before the next is launched."""
    from nanograph.engine import engine as engine_module

    llm = make_llm(tiny, disable_overlap_schedule=not overlap)
    events: list[str] = []
    forward, read = llm.engine.runner.forward, engine_module._InFlight.read

    def logged_forward(*a, **kw):
        events.append("launch")
        return forward(*a, **kw)

    def logged_read(self):
        events.append("read")
        return read(self)

    monkeypatch.setattr(llm.engine.runner, "forward", logged_forward)
    monkeypatch.setattr(engine_module._InFlight, "read", logged_read)
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    expected = ["launch"] + ["launch", "read"] * 3 + ["read"]
    assert events == (expected if overlap else ["launch", "read"] * 4)
