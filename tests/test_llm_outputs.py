"""vLLM's output shape and ``n``: ``LLM.generate`` returns one ``RequestOutput`` per prompt with
its ``SamplingParams.n`` completions in ``outputs``, each an engine request of its own."""

from __future__ import annotations

import math

import pytest
from conftest import requires_smollm2

from nanograph import LLM, SamplingParams
from nanograph.engine.sampling_params import MAX_CHOICES, SEED_RANGE

GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return LLM(str(tiny_model_dir("qwen3")), page_size=4, kv_cache_bytes=2**20, progress=False)


def test_one_prompt_n_greedy_completions_are_the_single_answer(tiny):
    alone = tiny.generate([[1, 2, 3]], GREEDY)[0]
    [out] = tiny.generate([[1, 2, 3]], SamplingParams(max_tokens=5, temperature=0.0,
                                                      ignore_eos=True, n=3))  # fmt: skip
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert [c.token_ids for c in out.outputs] == [alone.token_ids] * 3
    assert all(c.finish_reason == "length" and c.ok for c in out.outputs)
    assert out.prompt_token_ids == [1, 2, 3] and out.prompt is None and out.finished
    # the shortcuts are the first completion's
    assert (out.token_ids, out.finish_reason, out.ok) == (alone.token_ids, "length", True)
    assert not tiny.engine.has_work()


def test_seeded_completions_sample_with_consecutive_seeds(tiny):
    """Completion i of a seeded request is the request with seed + i run alone: they differ,
    and each is reproducible (the server's n does the same)."""
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=SEED_RANGE[1] - 1, n=3,
                            ignore_eos=True)  # fmt: skip
    [out] = tiny.generate([[4, 5, 6]], params)
    seeds = [SEED_RANGE[1] - 1, SEED_RANGE[1], SEED_RANGE[0]]  # wraps into the seed range
    alone = [
        tiny.generate([[4, 5, 6]], SamplingParams(max_tokens=8, temperature=1.0, seed=s,
                                                  ignore_eos=True))[0].token_ids
        for s in seeds
    ]  # fmt: skip
    assert [c.token_ids for c in out.outputs] == alone
    assert len({tuple(ids) for ids in alone}) > 1


def test_batches_with_n_keep_prompt_order_and_a_bad_prompt_fails_alone(tiny):
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, n=2)
    outs = tiny.generate([[1, 2], [], [3, 4, 5]], params)
    assert [len(o.outputs) for o in outs] == [2, 2, 2]
    assert [c.finish_reason for c in outs[1].outputs] == ["error", "error"]
    assert "the prompt is empty" in outs[1].outputs[1].error
    singles = tiny.generate([[1, 2], [3, 4, 5]], SamplingParams(max_tokens=4, temperature=0.0,
                                                                ignore_eos=True))  # fmt: skip
    assert [outs[0].outputs[1].token_ids, outs[2].outputs[1].token_ids] == [
        s.token_ids for s in singles
    ]
    assert tiny.engine.scheduler.num_available_pages == tiny.engine.kv_cache.allocator.num_usable


def test_cumulative_logprob_is_the_sum_of_the_token_logprobs(tiny):
    [out] = tiny.generate([[7, 8]], SamplingParams(max_tokens=4, temperature=0.0, logprobs=0))
    c = out.outputs[0]
    assert len(c.logprobs) == len(c.token_ids)
    assert math.isclose(c.cumulative_logprob, sum(t.logprob for t in c.logprobs))
    assert tiny.generate([[7, 8]], GREEDY)[0].outputs[0].cumulative_logprob is None


@pytest.mark.parametrize("n", [0, -1, MAX_CHOICES + 1, 1.5, True, "2"])
def test_n_outside_its_range_is_refused_naming_it(n):
    with pytest.raises(ValueError, match=rf"n must be an integer in \[1, {MAX_CHOICES}\]"):
        SamplingParams(n=n)


def test_the_engine_refuses_a_request_of_several_completions(tiny):
    request = tiny.engine.add_request([1, 2, 3], SamplingParams(n=2))
    assert request.finish_reason == "error"
    assert "an engine request is one completion" in request.error
    assert not tiny.engine.has_work()


@requires_smollm2
def test_text_prompts_are_echoed_in_prompt():
    llm = LLM("smollm2-135m", max_model_len=64, progress=False)
    text, chat = "Name a colour.", [{"role": "user", "content": "Hi"}]
    outs = llm.generate([text, {"prompt": text}, {"prompt_token_ids": [1, 2]}, chat], GREEDY)
    assert [o.prompt for o in outs] == [text, text, None, None]
    assert outs[0].token_ids == outs[1].token_ids
    assert outs[0].outputs[0].text == outs[0].text and outs[0].text


def test_offline_chat_renders_the_tools(tiny_model_dir, tmp_path):
    """``LLM.chat(tools=...)`` (vLLM's): the tools reach the chat template; bad ones fail the
    conversation with the server's message."""
    import json
    import shutil

    from serving import byte_tokenizer

    path = tmp_path / "model"
    shutil.copytree(tiny_model_dir("qwen3"), path)
    byte_tokenizer().hf.save_pretrained(path)
    llm = LLM(str(path), progress=False)
    tool = {"type": "function", "function": {"name": "weather", "parameters": {}}}
    chat = [{"role": "user", "content": "Rain?"}]
    params = SamplingParams(max_tokens=1, temperature=0.0)
    out, plain = llm.chat([chat, chat], params, tools=[tool])[0], llm.chat(chat, params)[0]
    assert llm.tokenizer.decode(out.prompt_token_ids) == (
        f"[tools {json.dumps([tool])}]" + llm.tokenizer.decode(plain.prompt_token_ids)
    )
    bad = llm.chat(chat, params, tools=[{"type": "function"}])[0]
    assert bad.finish_reason == "error" and bad.error.startswith("tools[0] must be")
    assert not llm.engine.has_work()


def test_truncate_prompt_tokens_keeps_the_prompts_end(tiny_model_dir):
    """vLLM's ``truncate_prompt_tokens``: the last k tokens run, as if given alone; -1 keeps
    what the context holds with room for one answer token; bad values name the field."""
    llm = LLM(str(tiny_model_dir("qwen3")), page_size=4, max_model_len=32, progress=False)
    prompt = list(range(10, 50))  # 40 tokens: longer than the context
    cut = llm.generate([prompt], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True,
                                                truncate_prompt_tokens=10))[0]  # fmt: skip
    alone = llm.generate([prompt[-10:]], GREEDY)[0]
    assert cut.prompt_token_ids == prompt[-10:] and cut.token_ids == alone.token_ids[:3]
    whole = llm.generate([prompt], SamplingParams(max_tokens=3, truncate_prompt_tokens=-1))[0]
    assert whole.prompt_token_ids == prompt[-31:] and whole.finish_reason == "length"
    too_long = llm.generate([prompt], SamplingParams(max_tokens=3))[0]
    assert too_long.finish_reason == "error" and "context length is 32" in too_long.error
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="truncate_prompt_tokens must be"):
            SamplingParams(truncate_prompt_tokens=bad)
    assert not llm.engine.has_work()
