"""Property-based fuzzing of the public API: no prompt and no sampling value can poison the engine.

Arbitrary prompts (strings of any code points, surrogates included; token-id lists of any
integers; conversations of any shape; vLLM's prompt dicts, well-formed or not; things that
are no prompt at all) and arbitrary
``SamplingParams`` values (any types, NaN/inf, huge and negative numbers) are mixed with valid
requests in one batch. Invariants, for every example:
- building ``SamplingParams`` either succeeds or raises ``ValueError`` (nothing else);
- ``generate`` returns one output per prompt, in order;
- the valid requests produce exactly the tokens they produce alone (greedy);
- a failed request carries ``finish_reason == "error"`` and a message;
- the KV pool's free page count returns to its start, nothing stays queued, and a following
  valid call works.

Profiles (``NANOGRAPH_FUZZ=ci|long``): ``ci`` (default) runs a fixed, derandomised set of
examples in about a minute; ``long`` runs many more with fresh randomness, for local runs. The
server reuses these strategies over HTTP.
"""

from __future__ import annotations

import math
import os

import pytest
from conftest import requires_smollm2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanograph import LLM, SamplingParams

settings.register_profile(
    "ci", max_examples=20, derandomize=True, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)  # fmt: skip
settings.register_profile(
    "long", max_examples=600, deadline=None, suppress_health_check=list(HealthCheck)
)
PROFILE = os.environ.get("NANOGRAPH_FUZZ", "ci")

# ---- strategies (imported by the server's HTTP fuzz tests) ------------------------------------
any_char = st.one_of(st.characters(exclude_categories=()), st.characters(categories=["Cs"]))
any_text = st.text(any_char, max_size=24)
any_int = st.one_of(
    st.integers(-5, 60_000), st.integers(), st.sampled_from([-(2**63), 2**63, 2**64, 2**200])
)
any_number = st.one_of(
    any_int,
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-320, 1e308, -1.0, 0.5, 1.0]),
)
junk = st.one_of(st.none(), st.booleans(), any_number, any_text, st.binary(max_size=8))
any_value = st.recursive(
    junk, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(any_text, inner, max_size=3),
    max_leaves=6,
)  # fmt: skip
message = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]),
                           "content": any_text}),
    st.dictionaries(st.sampled_from(["role", "content", "name", "x"]), any_value, max_size=3),
)  # fmt: skip
# vLLM's prompt dicts, well-formed or not
prompt_dict = st.dictionaries(
    st.sampled_from(["prompt", "prompt_token_ids", "role", "x"]),
    st.one_of(any_text, st.lists(any_int, max_size=24), any_value), max_size=2,
)  # fmt: skip
any_prompt = st.one_of(
    any_text,
    st.lists(any_int, max_size=24),
    st.lists(message, max_size=3),
    prompt_dict,
    st.lists(prompt_dict, min_size=1, max_size=2),
    any_value,
)
SAMPLING_FIELDS = {
    "max_tokens": st.one_of(st.integers(1, 6), any_value),
    "min_tokens": st.one_of(st.integers(-1, 7), any_value),
    "temperature": st.one_of(st.sampled_from([0.0, 0.7, 1e-9, 1e30]), any_value),
    "top_k": st.one_of(st.integers(-1, 5), any_value),
    "top_p": st.one_of(st.floats(0.01, 1.0), any_value),
    "min_p": st.one_of(st.floats(0.0, 1.0), any_value),
    "seed": st.one_of(st.none(), any_int, any_value),
    "stop": st.one_of(st.lists(any_text, max_size=2), any_value),
    "stop_token_ids": st.one_of(st.lists(st.integers(0, 50_000), max_size=2), any_value),
    "ignore_eos": st.one_of(st.booleans(), any_value),
    "include_stop_str_in_output": st.one_of(st.booleans(), any_value),
    "logprobs": st.one_of(st.none(), st.integers(-1, 21), any_value),
    "prompt_logprobs": st.one_of(st.none(), st.integers(-1, 21), any_value),
    "truncate_prompt_tokens": st.one_of(st.none(), st.integers(-2, 30), any_value),
    "allowed_token_ids": st.one_of(
        st.none(), st.lists(st.integers(-1, 60_000), max_size=3), any_value
    ),  # fmt: skip
    "bad_words": st.one_of(st.lists(any_text, max_size=2), any_value),
    "structured_outputs": st.one_of(
        st.none(),
        st.fixed_dictionaries(
            {},
            optional={
                "regex": any_text,
                "json": any_value,
                "choice": st.lists(any_text, max_size=2),
                "json_object": st.booleans(),
                "grammar": any_value,
                "structural_tag": st.one_of(
                    st.just(
                        {
                            "triggers": ["<"],
                            "structures": [
                                {"begin": "<", "schema": {"type": "integer"}, "end": ">"}
                            ],
                        }
                    ),
                    st.fixed_dictionaries(
                        {"triggers": st.lists(any_text, max_size=2)},
                        optional={
                            "structures": st.lists(
                                st.fixed_dictionaries(
                                    {"begin": any_text, "end": any_text, "schema": any_value}
                                ),
                                max_size=2,
                            )
                        },
                    ),
                    any_value,
                ),
            },
        ),
        any_value,
    ),  # fmt: skip
    "n": st.one_of(st.integers(0, 3), any_value),
    "presence_penalty": st.one_of(st.floats(-2.5, 2.5), any_value),
    "frequency_penalty": st.one_of(st.floats(-2.5, 2.5), any_value),
    "repetition_penalty": st.one_of(st.floats(0.0, 3.0), any_value),
    "logit_bias": st.one_of(
        st.dictionaries(st.integers(-1, 60_000), st.floats(-120, 120), max_size=3), any_value
    ),  # fmt: skip
}
any_sampling_kwargs = st.fixed_dictionaries({}, optional=SAMPLING_FIELDS)

# valid requests whose greedy tokens are known from a run alone
VALID_TEXTS = ["The capital of France is", "1, 2, 3,", "Hello"]  # each < 20 tokens
VALID = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def make_params(kwargs: dict):
    """SamplingParams of arbitrary values: built, or the ValueError that refused them (the
    engine then gets the kwargs dict itself, which it must refuse as a request error)."""
    try:
        return SamplingParams(**kwargs)
    except ValueError:
        return kwargs


@pytest.fixture(scope="module")
def fuzz_llm():
    # a short context bounds every request, whatever max_tokens it asks for
    return LLM("smollm2-135m", max_model_len=24, kv_cache_bytes=8 * 2**20, progress=False)


@pytest.fixture(scope="module")
def alone(fuzz_llm):
    return {t: fuzz_llm.generate(t, VALID)[0].token_ids for t in VALID_TEXTS}


@given(kwargs=any_sampling_kwargs)
@settings(settings.get_profile(PROFILE), max_examples=300 if PROFILE == "ci" else 5000)
def test_sampling_params_either_build_or_raise_value_error(kwargs):
    try:
        p = SamplingParams(**kwargs)
    except ValueError as e:
        assert str(e)
        return
    assert type(p.max_tokens) is int and p.max_tokens >= 1
    assert type(p.min_tokens) is int and 0 <= p.min_tokens <= p.max_tokens
    assert type(p.temperature) is float and math.isfinite(p.temperature) and p.temperature >= 0
    assert 0 < p.top_p <= 1 and 0 <= p.min_p <= 1 and type(p.top_k) is int and p.top_k >= -1
    assert p.seed is None or type(p.seed) is int
    assert all(isinstance(s, str) and s for s in p.stop + p.bad_words)
    assert all(type(t) is int and t >= 0 for t in p.stop_token_ids)
    for count in (p.logprobs, p.prompt_logprobs):
        assert count is None or (type(count) is int and 0 <= count <= 20)
    assert type(p.n) is int and 1 <= p.n <= 128
    allowed = p.allowed_token_ids
    assert allowed is None or (allowed and all(type(t) is int and t >= 0 for t in allowed))
    keep = p.truncate_prompt_tokens
    assert keep is None or (type(keep) is int and (keep == -1 or keep >= 1))
    assert type(p.ignore_eos) is bool and type(p.include_stop_str_in_output) is bool
    assert -2 <= p.presence_penalty <= 2 and -2 <= p.frequency_penalty <= 2
    assert math.isfinite(p.repetition_penalty) and p.repetition_penalty > 0
    assert all(type(t) is int and t >= 0 and -100 <= b <= 100 for t, b in p.logit_bias)


@requires_smollm2
@given(data=st.data())
@settings(settings.get_profile(PROFILE))
def test_arbitrary_requests_never_poison_the_engine(fuzz_llm, alone, data):
    engine = fuzz_llm.engine
    allocator = engine.kv_cache.allocator
    free_before = engine.scheduler.num_available_pages  # free + cached pages nobody reads
    fuzzed = data.draw(st.lists(st.tuples(any_prompt, any_sampling_kwargs), min_size=1, max_size=3))
    valid = data.draw(st.lists(st.sampled_from(VALID_TEXTS), min_size=1, max_size=2))
    batch = [(t, VALID, True) for t in valid] + [(p, make_params(k), False) for p, k in fuzzed]
    order = data.draw(st.permutations(range(len(batch))))
    batch = [batch[i] for i in order]

    outs = fuzz_llm.generate([b[0] for b in batch], [b[1] for b in batch])

    assert len(outs) == len(batch)
    for (prompt, params, is_valid), request_out in zip(batch, outs):
        n = params.n if isinstance(params, SamplingParams) else 1
        assert [c.index for c in request_out.outputs] == list(range(n))
        scores = request_out.prompt_logprobs
        if not is_valid and request_out.outputs[0].ok and params.prompt_logprobs is not None:
            assert len(scores) == len(request_out.prompt_token_ids) and scores[0] is None
            assert all(len(s.top) == params.prompt_logprobs for s in scores[1:])
        elif is_valid or not isinstance(params, SamplingParams) or params.prompt_logprobs is None:
            assert scores is None
        for out in request_out.outputs:  # each of the prompt's n completions
            if is_valid:
                assert out.ok and out.token_ids == alone[prompt], (prompt, out)
            elif out.finish_reason == "error":
                assert out.error
            else:
                assert out.finish_reason in ("stop", "length")
                if out.finish_reason == "stop":  # nothing stops it before min_tokens
                    assert len(out.token_ids) >= params.min_tokens, (params, out)
                if params.logprobs is not None:  # one per token, cut with the tokens at a stop
                    assert len(out.logprobs) == len(out.token_ids)
                    assert all(len(lp.top) == params.logprobs for lp in out.logprobs)
    assert not engine.has_work() and not engine.grammars._matchers  # no matcher left behind
    assert not engine.grammars._ahead and not engine.grammars.num_compiling
    assert engine.scheduler.num_available_pages == free_before == allocator.num_usable
    again = fuzz_llm.generate(VALID_TEXTS[0], VALID)[0]
    assert again.token_ids == alone[VALID_TEXTS[0]]
