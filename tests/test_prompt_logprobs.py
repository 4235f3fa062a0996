"""vLLM's ``prompt_logprobs`` on a tiny random Qwen3: each prompt token's log-probability and
top alternatives equal the log-softmax of transformers' logits at the position before it, in a
mixed batch, however the prompt is computed: in chunks (and in chunks capped for scoring), under
the overlap schedule or not, past a cached prefix (which a scoring request does not take),
through preemption (scored once), with n completions."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_pages_back, make_llm

from nanograph import SamplingParams
from nanograph.engine import scheduler

PROMPTS = [list(range(3, 40)), [7, 8, 9, 7, 8], [11], list(range(100, 121))]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return tiny_model_dir("qwen3")


def log_softmax(path, prompts: list[list[int]]) -> list[torch.Tensor]:
    """Per prompt: transformers' log-softmax at every position (float64)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path).eval().double()
    with torch.no_grad():
        return [torch.log_softmax(model(torch.tensor([p])).logits[0], -1) for p in prompts]


@pytest.fixture(scope="module")
def expected(tiny):
    return log_softmax(tiny, PROMPTS)


def assert_scores(out, prompt, logits, k):
    assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == len(prompt)
    assert out.prompt_logprobs[0] is None
    for i, score in enumerate(out.prompt_logprobs[1:], start=1):
        row = logits[i - 1]
        assert score.logprob == pytest.approx(row[prompt[i]].item(), abs=1e-4), i
        assert score.rank == 1 + int((row > row[prompt[i]] + 1e-6).sum())
        top = row.topk(k)
        assert [t for t, _ in score.top] == top.indices.tolist()
        assert [v for _, v in score.top] == pytest.approx(top.values.tolist(), abs=1e-4)


@pytest.mark.parametrize("overlap", [True, False])
def test_prompt_logprobs_equal_transformers_in_a_chunked_mixed_batch(tiny, expected, overlap,
                                                                     monkeypatch):  # fmt: skip
    monkeypatch.setattr(scheduler, "SCORED_CHUNK", 6)  # a 37-token prompt scores in 7 steps
    llm = make_llm(tiny, chunked_prefill_size=16, disable_overlap_schedule=not overlap)
    greedy = dict(max_tokens=4, temperature=0.0, ignore_eos=True)
    params = [
        SamplingParams(prompt_logprobs=3, **greedy),
        SamplingParams(prompt_logprobs=0, logprobs=2, **greedy),
        SamplingParams(prompt_logprobs=5, **greedy),  # one token: nothing to score
        SamplingParams(**greedy),  # not asked: None
    ]
    outs = llm.generate(PROMPTS, params)
    assert_scores(outs[0], PROMPTS[0], expected[0], 3)
    assert_scores(outs[1], PROMPTS[1], expected[1], 0)
    assert outs[2].prompt_logprobs == [None] and outs[3].prompt_logprobs is None
    # scoring changes nothing else: the tokens are those of the requests without it
    plain = llm.generate(PROMPTS, SamplingParams(**greedy))
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert len(outs[1].logprobs) == 4
    assert not llm.engine._scoring  # finished requests are forgotten
    assert_pages_back(llm)


def test_a_cached_prefix_is_computed_again_to_be_scored(tiny, expected):
    llm = make_llm(tiny)
    greedy = dict(max_tokens=2, temperature=0.0, ignore_eos=True)
    llm.generate([PROMPTS[0]], SamplingParams(**greedy))  # its pages are cached now
    out = llm.generate([PROMPTS[0]], SamplingParams(prompt_logprobs=1, **greedy))[0]
    assert out.num_cached_tokens == 0
    assert_scores(out, PROMPTS[0], expected[0], 1)
    again = llm.generate([PROMPTS[0]], SamplingParams(**greedy))[0]
    assert again.num_cached_tokens > 0  # a request that does not score still takes the prefix
    assert_pages_back(llm)


def test_preempted_requests_score_their_prompt_once(tiny):
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, 256, (20,), generator=g).tolist() for _ in range(8)]
    per_token = 2 * 2 * 2 * 16 * 4  # k+v, layers, kv heads, head_dim, float32
    llm = make_llm(tiny, kv_cache_bytes=16 * 4 * per_token)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, prompt_logprobs=2)
    outs = llm.generate(prompts, params)
    assert sum(o.num_preemptions for o in outs) > 0
    for out, prompt, logits in zip(outs, prompts, log_softmax(tiny, prompts)):
        assert_scores(out, prompt, logits, 2)
    assert_pages_back(llm)


def test_n_completions_give_the_prompts_scores(tiny, expected):
    llm = make_llm(tiny)
    params = SamplingParams(max_tokens=3, temperature=1.0, seed=4, n=3, prompt_logprobs=1)
    out = llm.generate([PROMPTS[1]], params)[0]
    assert_scores(out, PROMPTS[1], expected[1], 1)
    assert_pages_back(llm)


def test_bad_prompt_logprobs_are_refused(tiny):
    for value, message in ((21, "prompt_logprobs must be an integer in [0, 20]"),
                           (-1, "prompt_logprobs must be an integer in [0, 20]"),
                           (True, "prompt_logprobs must be an integer")):  # fmt: skip
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
            SamplingParams(prompt_logprobs=value)
    llm = make_llm(tiny, speculative_algorithm="ngram")
    out = llm.generate([PROMPTS[1]], SamplingParams(max_tokens=2, prompt_logprobs=1))[0]
    assert out.finish_reason == "error" and "prompt_logprobs" in out.error
    assert out.prompt_logprobs is None


def test_a_failing_request_leaves_the_others_scores_whole(tiny, expected):
    """A forward that raises runs each request alone (``_retry_alone``): the culprit fails and
    the others' scores, launched in the retry, are those of a clean run."""
    llm = make_llm(tiny)
    forward, poison = llm.engine.runner.forward, [255, 0, 255, 0]

    def faulty(batch, in_flight=None, path=None):
        ids = list(batch.input_ids)
        if any(ids[i : i + 4] == poison for i in range(len(ids) - 3)):
            raise RuntimeError("injected fault")
        return forward(batch, in_flight, path)

    llm.engine.runner.forward = faulty
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True, prompt_logprobs=2)
    outs = llm.generate([PROMPTS[0], [1, *poison, 2], PROMPTS[3]], params)
    assert outs[1].finish_reason == "error" and outs[1].prompt_logprobs is None
    assert_scores(outs[0], PROMPTS[0], expected[0], 2)
    assert_scores(outs[2], PROMPTS[3], expected[3], 2)
    assert_pages_back(llm)
