"""Presence, frequency and repetition penalties, logit_bias, allowed_token_ids, bad_words and
min_tokens on a tiny random Qwen3: greedy tokens against a plain step-by-step reference
(transformers logits, the definitions written out per token), each request of a mixed batch
equal to itself alone, equal under the overlap schedule and without it, through preemption, and
past the state buffer's first size."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import assert_pages_back, make_llm

from nanograph import SamplingParams


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return tiny_model_dir("qwen3")


def penalised_greedy(model, prompt: list[int], n: int, presence_penalty=0.0,
                     frequency_penalty=0.0, repetition_penalty=1.0,
                     logit_bias=None, min_tokens=0, ends=(), bad=()) -> list[int]:  # fmt: skip
    """The definition, one token at a time (vLLM's order: repetition, then frequency and
    presence on the output's counts, then the bias, then the last token of each ``bad`` word
    whose other tokens the output ends with, then ``ends`` (the tokens that end the request)
    masked before ``min_tokens``)."""
    presence, frequency, repetition = presence_penalty, frequency_penalty, repetition_penalty
    out: list[int] = []
    for _ in range(n):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + out])).logits[0, -1].double()
        for token in set(prompt + out):
            value = logits[token]
            logits[token] = value / repetition if value > 0 else value * repetition
        for token in set(out):
            logits[token] -= frequency * out.count(token) + presence
        for token, bias in (logit_bias or {}).items():
            logits[token] += bias
        for word in bad:
            if len(out) >= len(word) - 1 and out[len(out) - len(word) + 1 :] == list(word[:-1]):
                logits[word[-1]] = -torch.inf
        if len(out) < min_tokens:
            logits[list(ends)] = -torch.inf
        token = int(logits.argmax())
        if token in ends:
            break
        out.append(token)
    return out


PROMPTS = [[5, 17, 3, 99, 42, 7, 5, 5], list(range(30, 61)), [200, 1, 200, 1], [9, 8, 7]]
# a random model hardly repeats itself: these settings each change its greedy answer (the first
# makes tokens come twice, so counts above 1 matter)
SETTINGS = [
    dict(presence_penalty=-0.5, frequency_penalty=0.3),
    dict(frequency_penalty=-0.8, repetition_penalty=1.3),
    dict(repetition_penalty=0.6, presence_penalty=1.5),
    dict(logit_bias={203: -100.0, 17: 3.0}, repetition_penalty=1.1),
]


def test_greedy_penalties_follow_their_definition(tiny):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny).eval()
    llm = make_llm(tiny)
    params = [SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, **kw)
              for kw in SETTINGS]  # fmt: skip
    outs = llm.generate(PROMPTS, params)
    for prompt, kw, out in zip(PROMPTS, SETTINGS, outs):
        assert out.token_ids == penalised_greedy(model, prompt, 10, **kw), kw
    plain = llm.generate(PROMPTS, SamplingParams(max_tokens=10, temperature=0.0,
                                                 ignore_eos=True))  # fmt: skip
    assert all(p.token_ids != o.token_ids for p, o in zip(plain, outs))  # each did something
    assert not llm.engine.penalties._slot  # finished requests gave their rows back
    assert_pages_back(llm)


@pytest.mark.parametrize("overlap", [True, False])
def test_each_request_of_a_mixed_batch_equals_itself_alone(tiny, overlap):
    llm = make_llm(tiny, disable_overlap_schedule=not overlap)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 256, (int(n),), generator=g).tolist()
               for n in torch.randint(2, 30, (12,), generator=g)]  # fmt: skip
    params = [
        SamplingParams(
            max_tokens=9,
            temperature=0.8 if i % 3 else 0.0,
            seed=i,
            ignore_eos=True,
            **(SETTINGS[i % 3] if i % 4 else {}),
        )
        for i in range(12)
    ]  # fmt: skip: 9 penalised requests in one batch, past the buffer's first 8 rows
    together = [o.token_ids for o in llm.generate(prompts, params)]
    alone = [llm.generate([p], s)[0].token_ids for p, s in zip(prompts, params)]
    assert together == alone
    assert llm.engine.penalties.counts.shape[0] >= 9


def test_preempted_requests_keep_their_counts(tiny):
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, 256, (20,), generator=g).tolist() for _ in range(8)]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, frequency_penalty=1.0,
                            repetition_penalty=1.2)  # fmt: skip
    ample = [o.token_ids for o in make_llm(tiny).generate(prompts, params)]
    per_token = 2 * 2 * 2 * 16 * 4  # k+v, layers, kv heads, head_dim, float32
    small = make_llm(tiny, kv_cache_bytes=16 * 4 * per_token)
    outs = small.generate(prompts, params)
    assert sum(o.num_preemptions for o in outs) > 0
    assert [o.token_ids for o in outs] == ample
    assert_pages_back(small)


def test_a_large_bias_forces_its_token_and_a_bias_outside_the_vocabulary_fails_alone(tiny):
    llm = make_llm(tiny)
    forced, outside, plain = llm.generate(PROMPTS[:3], [
        SamplingParams(max_tokens=5, temperature=1.0, seed=1, logit_bias={42: 100}),
        SamplingParams(max_tokens=5, logit_bias={256: 1.0}),
        SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True),
    ])  # fmt: skip
    assert forced.token_ids == [42] * 5
    assert outside.finish_reason == "error" and "logit_bias token id 256" in outside.error
    assert plain.ok and len(plain.token_ids) == 5
    assert_pages_back(llm)


@pytest.fixture(scope="module")
def tiny_with_eos(tiny, tmp_path_factory):
    """The tiny model, its config naming token 200 EOS (the tiny model has none)."""
    path = tmp_path_factory.mktemp("tiny-eos")
    shutil.copytree(tiny, path, dirs_exist_ok=True)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "eos_token_id": 200}))
    return path


@pytest.mark.parametrize("overlap", [True, False])
def test_min_tokens_holds_off_eos_and_stop_tokens(tiny_with_eos, overlap):
    """Biased towards an end token, a request still gives min_tokens tokens first (the token
    in flight under the overlap schedule counts), then stops on it; ignore_eos leaves EOS
    unmasked. In one batch, each equal to itself alone and to the definition."""
    import transformers

    tiny, eos = tiny_with_eos, 200
    llm = make_llm(tiny, disable_overlap_schedule=not overlap)
    assert llm.engine.stops.eos_token_ids == {eos}
    greedy = dict(max_tokens=12, temperature=0.0)
    params = [
        SamplingParams(logit_bias={eos: 100}, min_tokens=5, **greedy),
        SamplingParams(logit_bias={17: 100}, stop_token_ids=[17], min_tokens=3, max_tokens=12,
                       temperature=0.8, seed=2),
        SamplingParams(logit_bias={eos: 100}, ignore_eos=True, min_tokens=4, max_tokens=6),
        SamplingParams(logit_bias={eos: 100}, **greedy),  # without min_tokens: no token at all
        SamplingParams(min_tokens=12, ignore_eos=True, repetition_penalty=1.3, **greedy),
    ]  # fmt: skip
    outs = llm.generate(PROMPTS + PROMPTS[:1], params)
    assert [o.finish_reason for o in outs] == ["stop", "stop", "length", "stop", "length"]
    assert [len(o.token_ids) for o in outs] == [5, 3, 6, 0, 12]
    assert (outs[0].stop_reason, outs[1].stop_reason) == (None, 17)
    assert 17 not in outs[1].token_ids and outs[2].token_ids == [eos] * 6
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny).eval()
    assert outs[0].token_ids == penalised_greedy(model, PROMPTS[0], 12, logit_bias={eos: 100},
                                                 min_tokens=5, ends=(eos,))  # fmt: skip
    alone = [llm.generate([p], s)[0].token_ids for p, s in zip(PROMPTS + PROMPTS[:1], params)]
    assert [o.token_ids for o in outs] == alone
    assert_pages_back(llm)


@pytest.mark.parametrize("overlap", [True, False])
def test_allowed_token_ids_leave_only_those_tokens(tiny, overlap):
    """vLLM's allowed_token_ids: greedy picks the best allowed token (the definition: every
    other logit -inf), sampled tokens stay inside the set, a bias cannot reach outside it, and
    an id past the vocabulary fails that request alone."""
    import transformers

    llm = make_llm(tiny, disable_overlap_schedule=not overlap)
    allowed = [3, 17, 42, 99, 200]
    outside = [t for t in range(256) if t not in allowed]
    greedy, sampled, biased, bad, plain = llm.generate(PROMPTS + PROMPTS[:1], [
        SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, allowed_token_ids=allowed),
        SamplingParams(max_tokens=8, temperature=1.5, seed=3, ignore_eos=True,
                       allowed_token_ids=allowed),
        SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, allowed_token_ids=[5, 6],
                       logit_bias={7: 100}),
        SamplingParams(max_tokens=4, allowed_token_ids=[5, 256]),
        SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
    ])  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny).eval()
    bias = dict.fromkeys(outside, -1e9)  # the definition: nothing outside can win
    assert greedy.token_ids == penalised_greedy(model, PROMPTS[0], 8, logit_bias=bias)
    assert greedy.token_ids != plain.token_ids  # it did something
    assert set(sampled.token_ids) <= set(allowed) and len(sampled.token_ids) == 8
    assert set(biased.token_ids) <= {5, 6}
    assert bad.finish_reason == "error" and "allowed_token_ids holds 256" in bad.error
    assert_pages_back(llm)


@pytest.mark.parametrize("overlap", [True, False])
def test_bad_words_are_never_written(tiny_with_tokenizer, overlap):
    """vLLM's bad_words: pushed towards a few letters (a bias), greedy requests write words of
    them; banned, three of those words (three, two and one letters) are never written, as the
    definition (the word's last token masked where the output ends with the rest) gives, which
    under the overlap schedule compares the token in flight on the device. In one batch, each
    equal to itself alone; a sampled one stays clear too."""
    import transformers

    llm = make_llm(tiny_with_tokenizer, disable_overlap_schedule=not overlap)
    encode = lambda text: llm.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    bias = {encode(c)[0]: 4.0 for c in "abcxyq"}
    prompts = PROMPTS[:3]
    greedy = dict(max_tokens=24, temperature=0.0, ignore_eos=True, logit_bias=bias)
    plain = [o.text for o in llm.generate(prompts, SamplingParams(**greedy))]
    words = (plain[0][2:5], plain[1][2:4], plain[2][1])
    assert all(w.isalpha() for w in words), plain
    banned = SamplingParams(**greedy, bad_words=words)
    sampled = SamplingParams(max_tokens=24, temperature=1.0, seed=4, ignore_eos=True,
                             logit_bias=bias, bad_words=words)  # fmt: skip
    outs = llm.generate(prompts + prompts[:1], [banned] * 3 + [sampled])
    texts = [o.text for o in outs]
    assert not any(w in t for t in texts for w in words), (words, texts)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_with_tokenizer).eval()
    forms = [tuple(encode(w)) for w in words]
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == penalised_greedy(model, prompt, 24, logit_bias=bias, bad=forms)
    assert [o.token_ids for o in outs[:3]] == [llm.generate([p], banned)[0].token_ids
                                               for p in prompts]  # fmt: skip
    assert_pages_back(llm)


def test_bad_word_forms_follow_vllm():
    """Each word as written (leading whitespace off) and, where it tokenizes to as many tokens
    with another first one, after a space; a word of whitespace only is kept as it is."""
    from serving import byte_tokenizer

    from nanograph.engine.penalties import bad_word_ids

    tokenizer = byte_tokenizer()
    encode = lambda text: tuple(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    # one token per byte: a space makes the word longer, so only the plain form counts
    assert bad_word_ids(tokenizer, (" ab", "ab", "\n")) == (encode("ab"), encode("\n"))

    class Words:  # a tokenizer of whole words, with a form for the word after a space
        def encode(self, text, add_special_tokens):
            return {"cat": [1], " cat": [2], "two words": [3, 4], " two words": [5, 4]}[text]

    assert bad_word_ids(Words(), ("cat", " two words")) == ((1,), (2,), (3, 4), (5, 4))


def test_bad_words_need_a_tokenizer_and_known_tokens(tiny, tiny_with_tokenizer):
    out = make_llm(tiny).generate([PROMPTS[0]], SamplingParams(max_tokens=3, bad_words=["a"]))
    assert out[0].finish_reason == "error" and "bad_words needs the model's tokenizer" in (
        out[0].error
    )
    llm = make_llm(tiny_with_tokenizer)
    eos = llm.tokenizer.eos_token_ids[0]  # <|end|>: one more than the model's 256 tokens
    outside, fine = llm.generate([PROMPTS[0]] * 2, [
        SamplingParams(max_tokens=3, bad_words=["a", llm.tokenizer.decode([eos], False)]),
        SamplingParams(max_tokens=3, bad_words=["a"]),
    ])  # fmt: skip
    assert outside.finish_reason == "error" and "holds token id 256" in outside.error
    assert fine.ok and len(fine.token_ids) == 3
    assert_pages_back(llm)


def test_speculative_decoding_refuses_penalties(tiny):
    llm = make_llm(tiny, speculative_algorithm="ngram")
    for params in (SamplingParams(max_tokens=4, presence_penalty=1.0),
                   SamplingParams(max_tokens=4, min_tokens=2),
                   SamplingParams(max_tokens=4, bad_words=["a"])):  # fmt: skip
        out = llm.generate([PROMPTS[0]], params)[0]
        assert out.finish_reason == "error" and "speculative decoding" in out.error


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(presence_penalty=2.5), "presence_penalty must be a number in [-2.0, 2.0]"),
        (dict(frequency_penalty="1"), "frequency_penalty must be a number"),
        (dict(repetition_penalty=0.0), "repetition_penalty must be a number > 0.0"),
        (dict(repetition_penalty=float("inf")), "repetition_penalty must be a number > 0.0"),
        (dict(logit_bias={3: 101}), "logit_bias[3] must be a number in [-100.0, 100.0]"),
        (dict(logit_bias={-3: 1}), "logit_bias token id must be an integer >= 0"),
        (dict(logit_bias="x"), "logit_bias must map token ids to numbers"),
        (dict(min_tokens=5, max_tokens=4), "min_tokens must be an integer in [0, 4]"),
        (dict(min_tokens=-1), "min_tokens must be an integer in [0, 128]"),
        (dict(min_tokens=2.0), "min_tokens must be an integer"),
        (dict(allowed_token_ids=[]), "allowed_token_ids must hold at least one token id"),
        (dict(allowed_token_ids=[1, -2]), "allowed_token_ids[1] must be an integer >= 0"),
        (dict(allowed_token_ids="12"), "allowed_token_ids must be a list of token ids"),
        (dict(bad_words=["a", ""]), "bad_words[1] must be a non-empty string"),
        (dict(bad_words=3), "bad_words must be a string or a list of strings"),
        (dict(bad_words=["w"] * 129), "bad_words holds 129 words: at most 128"),
    ],
)
def test_bad_penalties_name_the_field(kwargs, message):
    with pytest.raises(ValueError) as e:
        SamplingParams(**kwargs)
    assert str(e.value).startswith(message)
