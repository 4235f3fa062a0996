"""Log-probabilities of output tokens (``SamplingParams.logprobs``) on a tiny random Qwen3:
against a float64 transformers forward over the same tokens, in mixed batches, under the
overlap schedule and without it, cut with the tokens at a stop, and refused where they cannot
be computed."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_pages_back, make_llm

from nanograph import SamplingParams
from nanograph.engine import logprobs as token_logprobs


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return tiny_model_dir("qwen3")


@pytest.fixture(scope="module")
def reference(tiny):
    """``reference(prompt, output)``: float64 log-softmax at each output token's position."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny).double().eval()

    def run(prompt: list[int], output: list[int]) -> torch.Tensor:
        with torch.no_grad():
            logits = model(torch.tensor([prompt + output])).logits[0]
        return torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + len(output)], -1)

    return run


PROMPTS = [[5, 17, 3, 99, 42, 7], list(range(30, 61)), [200, 1]]


def check_against(reference, prompt, out, count: int) -> None:
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids)
    expected = reference(prompt, out.token_ids)
    for i, (token, lp) in enumerate(zip(out.token_ids, out.logprobs)):
        assert lp.logprob == pytest.approx(expected[i, token].item(), abs=1e-4)
        assert len(lp.top) == count
        top_values, top_ids = expected[i].topk(count)
        assert [v for _, v in lp.top] == pytest.approx(top_values.tolist(), abs=1e-4)
        # ids may only differ where the float64 values tie within float32's precision
        for (got, _), want, value in zip(lp.top, top_ids.tolist(), top_values.tolist()):
            assert got == want or expected[i, got].item() == pytest.approx(value, abs=1e-4)


@pytest.mark.parametrize("overlap", [True, False])
def test_logprobs_match_a_float64_forward_in_a_mixed_batch(tiny, reference, overlap):
    llm = make_llm(tiny, disable_overlap_schedule=not overlap)
    asked = [SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=k)
             for k in (3, 0)]  # fmt: skip
    sampled = SamplingParams(max_tokens=8, temperature=0.9, seed=7, ignore_eos=True, logprobs=5)
    plain = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    outs = llm.generate(PROMPTS, [asked[0], plain, sampled])
    check_against(reference, PROMPTS[0], outs[0], 3)
    check_against(reference, PROMPTS[2], outs[2], 5)  # raw, not the tempered distribution
    assert outs[1].logprobs is None
    greedy = outs[0].logprobs
    assert all(lp.top[0][0] == t for lp, t in zip(greedy, outs[0].token_ids))
    alone = [llm.generate([p], s)[0] for p, s in zip(PROMPTS, [asked[1], plain, sampled])]
    assert [o.token_ids for o in alone] == [o.token_ids for o in outs]  # logprobs change nothing
    assert all(lp.top == () for lp in alone[0].logprobs)
    assert [lp.logprob for lp in alone[2].logprobs] == pytest.approx(
        [lp.logprob for lp in outs[2].logprobs], abs=1e-5
    )
    assert_pages_back(llm)


def test_logprobs_are_cut_with_the_tokens_at_a_stop(tiny):
    llm = make_llm(tiny)
    free = llm.generate([PROMPTS[1]], SamplingParams(max_tokens=10, temperature=0.0,
                                                    ignore_eos=True, logprobs=1))[0]  # fmt: skip
    stop_at = free.token_ids[5]
    stopped = llm.generate([PROMPTS[1]], SamplingParams(
        max_tokens=10, temperature=0.0, stop_token_ids=[stop_at], logprobs=1))[0]  # fmt: skip
    n = free.token_ids.index(stop_at)
    assert stopped.finish_reason == "stop" and stopped.token_ids == free.token_ids[:n]
    assert stopped.logprobs == free.logprobs[:n]


def test_a_step_that_raises_keeps_logprobs_of_the_requests_run_alone(tiny, monkeypatch):
    """A failing step reruns each request alone; the packed rows of those that did not ask are
    zeros, so the others' logprobs still line up."""
    llm = make_llm(tiny)
    engine = llm.engine
    params = [SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=2),
              SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)]  # fmt: skip
    expected = llm.generate(PROMPTS[:2], params)
    original, calls = engine._forward_and_sample, []

    def flaky(requests, num_new, samples):
        calls.append(len(requests))
        if len(calls) == 2:  # the first decode step of the pair
            raise RuntimeError("a transient failure")
        return original(requests, num_new, samples)

    monkeypatch.setattr(engine, "_forward_and_sample", flaky)
    outs = llm.generate(PROMPTS[:2], params)
    assert 1 in calls[2:]  # it did run them alone
    assert [o.token_ids for o in outs] == [o.token_ids for o in expected]
    assert outs[1].logprobs is None
    for got, want in zip(outs[0].logprobs, expected[0].logprobs):  # a batch of 1 vs 2: rounding
        assert [t for t, _ in got.top] == [t for t, _ in want.top]
        assert [got.logprob, *(v for _, v in got.top)] == pytest.approx(
            [want.logprob, *(v for _, v in want.top)], abs=1e-5
        )


def test_speculative_decoding_refuses_logprobs_per_request(tiny):
    llm = make_llm(tiny, speculative_algorithm="ngram")
    bad, good = llm.generate(
        [PROMPTS[0], PROMPTS[0]],
        [SamplingParams(max_tokens=4, logprobs=1), SamplingParams(max_tokens=4, temperature=0)],
    )
    assert bad.finish_reason == "error" and "speculative decoding" in bad.error
    assert good.ok and len(good.token_ids) > 0


@pytest.mark.parametrize("value", [-1, 21, True, 2.0, "3"])
def test_bad_logprobs_values_name_the_field(value):
    with pytest.raises(ValueError, match=r"^logprobs must be an integer in \[0, 20\]"):
        SamplingParams(logprobs=value)


def test_packed_rows_hold_the_chosen_and_the_top_tokens():
    logits = torch.tensor([[0.0, 3.0, 1.0, -2.0], [5.0, 5.0, -1.0, 0.0]])
    rows = token_logprobs.packed(logits, torch.tensor([2, 0])).tolist()
    expected = torch.log_softmax(logits, -1)
    first = token_logprobs.unpack(rows[0], 2)
    assert first.logprob == pytest.approx(expected[0, 2].item())
    assert [t for t, _ in first.top] == [1, 2]
    assert [v for _, v in first.top] == pytest.approx(expected[0, [1, 2]].tolist())
    second = token_logprobs.unpack(rows[1], 0)
    assert second.logprob == pytest.approx(expected[1, 0].item()) and second.top == ()
