"""Structured outputs (``SamplingParams.structured_outputs``, xgrammar): on a tiny random Qwen3
with a one-token-per-byte tokenizer, greedy answers under a regex, a choice and an EBNF grammar
against the definition (transformers' argmax over the tokens that keep the text a prefix of the
form's language, ending where the language does), in mixed batches, overlap on and off,
through preemption; refusals; then SmolLM2's real tokenizer with JSON schemas."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
from conftest import assert_pages_back, make_llm, requires_smollm2

from nanograph import SamplingParams, StructuredOutputs

pytest.importorskip("xgrammar")

PROMPTS = [[5, 17, 3, 99, 42, 7, 5, 5], list(range(30, 61)), [200, 1, 200, 1], [9, 8, 7]]
FORMS = {  # a form, and its language written out
    "regex": (dict(regex="(ab|ba)[xy]|c"), ["abx", "aby", "bax", "bay", "c"]),
    "choice": (dict(choice=["yes", "no", "maybe so"]), ["yes", "no", "maybe so"]),
    "grammar": (
        dict(grammar='root ::= "n=" digit digit ";"\ndigit ::= [0-9]'),
        [f"n={i:02d};" for i in range(100)],
    ),
}


def constrained_greedy(model, encode, prompt: list[int], language: list[str]) -> list[int]:
    """The definition: argmax over the tokens that keep the text a prefix of a word of the
    language, until no word goes on."""
    text, out = "", []
    while True:
        nexts = sorted({w[len(text)] for w in language if w.startswith(text) and w != text})
        if not nexts:
            return out
        with torch.no_grad():
            logits = model(torch.tensor([prompt + out])).logits[0, -1]
        allowed = [encode(c) for c in nexts]
        best = max(range(len(allowed)), key=lambda k: logits[allowed[k]].item())
        out.append(allowed[best])
        text += nexts[best]


@pytest.fixture(scope="module")
def hf(tiny_with_tokenizer):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(tiny_with_tokenizer).eval()


@pytest.mark.parametrize("overlap", [True, False])
def test_forms_follow_their_definition_in_a_mixed_batch(tiny_with_tokenizer, hf, overlap):
    llm = make_llm(tiny_with_tokenizer, disable_overlap_schedule=not overlap)
    encode = lambda c: llm.tokenizer.encode(c, add_special_tokens=False)[0]  # noqa: E731
    plain = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    params, expected = [], []
    for i, (form, language) in enumerate(FORMS.values()):
        params.append(SamplingParams(max_tokens=16, temperature=0.0, structured_outputs=form))
        expected.append(constrained_greedy(hf, encode, PROMPTS[i], language))
    sampled = SamplingParams(max_tokens=16, temperature=1.0, seed=3,
                             structured_outputs=FORMS["grammar"][0])  # fmt: skip
    outs = llm.generate(PROMPTS + PROMPTS[:1], params + [plain, sampled])
    assert [o.token_ids for o in outs[:3]] == expected
    for out, (_, language) in zip(outs[:3], FORMS.values()):
        assert out.text in language and out.finish_reason == "stop"
    assert outs[3].token_ids == llm.generate([PROMPTS[3]], plain)[0].token_ids
    assert outs[4].text in FORMS["grammar"][1]
    alone = [llm.generate([p], s)[0].token_ids for p, s in zip(PROMPTS[:3], params)]
    assert alone == expected
    assert not llm.engine.grammars._matchers  # each finished request let its matcher go
    assert not llm.engine.grammars._ahead
    assert_pages_back(llm)


def test_the_next_forward_runs_before_a_form_reads_its_token(tiny_with_tokenizer, monkeypatch):
    """Under the overlap schedule a structured output does not serialise the batch: each
    forward is launched before the tokens of the step in flight are read for the masks."""
    from nanograph.engine import engine as engine_module

    llm = make_llm(tiny_with_tokenizer)
    events = []
    forward, read = llm.engine.runner.forward, engine_module._InFlight.read
    monkeypatch.setattr(llm.engine.runner, "forward",
                        lambda *a, **kw: events.append("forward") or forward(*a, **kw))  # fmt: skip
    monkeypatch.setattr(engine_module._InFlight, "read",
                        lambda self: events.append(self) or read(self))  # fmt: skip
    form = StructuredOutputs(regex="[a-z]{12}")
    params = SamplingParams(max_tokens=16, temperature=0.0, structured_outputs=form)
    (out,) = llm.generate([PROMPTS[0]], params)
    assert len(out.text) == 12 and out.text.isalpha()
    forwards = [i for i, e in enumerate(events) if e == "forward"]
    first_reads = [events.index(e) for e in dict.fromkeys(e for e in events if e != "forward")]
    # 12 steps sample the 12 tokens; a 13th, launched before the 12th token was read, runs in
    # vain. Step i's tokens are first read after step i + 1's forward was launched.
    assert len(forwards) == 13 and len(first_reads) >= 12
    assert all(forward < read for forward, read in zip(forwards[1:], first_reads))


def test_a_model_vocabulary_past_the_tokenizer_is_never_sampled(small_qwen3, tmp_path):
    """A model whose vocabulary (4096) outgrows its tokenizer (257 ids): xgrammar sees the
    tokenizer's ids only, and the ids past them are masked; answers follow the definition."""
    import shutil

    import transformers
    from serving import byte_tokenizer

    path = tmp_path / "padded"
    shutil.copytree(small_qwen3("structured", layers=2, hidden=256), path)
    byte_tokenizer().hf.save_pretrained(path)
    llm = make_llm(path)
    grammars = llm.engine.grammars
    assert (grammars.grammar_vocab, grammars.vocab_size) == (257, 4096)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    encode = lambda c: llm.tokenizer.encode(c, add_special_tokens=False)[0]  # noqa: E731
    params = [SamplingParams(max_tokens=16, temperature=0.0, structured_outputs=form)
              for form, _ in FORMS.values()]  # fmt: skip
    outs = llm.generate(PROMPTS[:3], params)
    for prompt, out, (_, language) in zip(PROMPTS, outs, FORMS.values()):
        assert out.token_ids == constrained_greedy(hf, encode, prompt, language)
        assert out.text in language and out.finish_reason == "stop"
    sampled = SamplingParams(max_tokens=16, temperature=1.5, seed=1,
                             structured_outputs=FORMS["grammar"][0])  # fmt: skip
    for out in llm.generate(PROMPTS, sampled):
        assert out.text in FORMS["grammar"][1] and max(out.token_ids) < 257


def test_a_form_survives_preemption(tiny_with_tokenizer):
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, 256, (20,), generator=g).tolist() for _ in range(8)]
    form = StructuredOutputs(regex="[a-z]{6}[0-9]{12}")
    params = SamplingParams(max_tokens=24, temperature=0.0, structured_outputs=form)
    ample = make_llm(tiny_with_tokenizer).generate(prompts, params)
    per_token = 2 * 2 * 2 * 16 * 4  # k+v, layers, kv heads, head_dim, float32
    small = make_llm(tiny_with_tokenizer, kv_cache_bytes=16 * 4 * per_token)
    outs = small.generate(prompts, params)
    assert sum(o.num_preemptions for o in outs) > 0
    assert [o.token_ids for o in outs] == [o.token_ids for o in ample]
    assert all(len(o.text) == 18 and o.text[:6].isalpha() and o.text[6:].isdigit() for o in outs)
    assert_pages_back(small)


def test_a_form_that_does_not_compile_fails_alone(tiny_with_tokenizer, tiny_model_dir):
    llm = make_llm(tiny_with_tokenizer)
    bad, good = llm.generate(PROMPTS[:2], [
        SamplingParams(max_tokens=4, structured_outputs={"regex": "(unclosed"}),
        SamplingParams(max_tokens=4, structured_outputs={"choice": ["a", "b"]}),
    ])  # fmt: skip
    assert bad.finish_reason == "error" and "could not be compiled" in bad.error
    assert good.ok and good.text in ("a", "b")
    # xgrammar's C++ errors carry its log line's time and source file: not the user's business
    odd = llm.generate([PROMPTS[0]], SamplingParams(
        max_tokens=4, structured_outputs={"json": {"type": "nonsense"}}))[0]  # fmt: skip
    assert odd.error.startswith("structured_outputs could not be compiled: Unsupported type")
    assert ".cc:" not in odd.error and not odd.error.endswith("\n")
    assert_pages_back(llm)
    no_tokenizer = make_llm(tiny_model_dir("qwen3")).generate(
        [PROMPTS[0]], SamplingParams(max_tokens=4, structured_outputs={"regex": "a+"})
    )[0]
    assert "needs the model's tokenizer" in no_tokenizer.error
    spec = make_llm(tiny_with_tokenizer, speculative_algorithm="ngram").generate(
        [PROMPTS[0]], SamplingParams(max_tokens=4, structured_outputs={"regex": "a+"})
    )[0]
    assert spec.finish_reason == "error" and "speculative decoding" in spec.error


ANSWER = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
STRUCTURAL_TAGS = {  # "<f>" opens a tag holding ANSWER's JSON, closed by "</f>"
    "vllm": {"type": "structural_tag", "triggers": ["<f>"],
             "structures": [{"begin": "<f>", "schema": ANSWER, "end": "</f>"}]},
    "xgrammar": {"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": ["<f>"],
        "tags": [{"type": "tag", "begin": "<f>", "end": "</f>",
                  "content": {"type": "json_schema", "json_schema": ANSWER}}]}},
}  # fmt: skip


@pytest.mark.parametrize("form", STRUCTURAL_TAGS)
def test_a_structural_tag_holds_what_its_trigger_opens(tiny_with_tokenizer, form):
    """Free text, except that each "<f>" opens a tag whose content keeps ANSWER's schema and
    which "</f>" closes: the model is biased toward the trigger's bytes to write it at all."""
    llm = make_llm(tiny_with_tokenizer)
    encode = lambda c: llm.tokenizer.encode(c, add_special_tokens=False)[0]  # noqa: E731
    params = SamplingParams(
        max_tokens=160, temperature=1.0, seed=3, ignore_eos=True,
        logit_bias={encode(c): 8.0 for c in "<f>"},
        structured_outputs={"structural_tag": STRUCTURAL_TAGS[form]},
    )  # fmt: skip
    texts = [out.text for out in llm.generate(PROMPTS, params)]
    tags = [inside for text in texts for inside in re.findall("<f>(.*?)</f>", text, re.S)]
    assert tags, texts
    for inside in tags:
        answer = json.loads(inside)
        assert list(answer) == ["a"] and type(answer["a"]) is int, inside
    # the unconstrained run with the same bias writes "<f>" followed by anything
    free = [
        o.text for o in llm.generate(PROMPTS, dataclasses.replace(params, structured_outputs=None))
    ]
    opened = [text.split("<f>", 1)[1] for text in free if "<f>" in text]
    assert opened and not all(re.match(r"\s*\{", rest) for rest in opened), free


@pytest.fixture
def held_compiles(monkeypatch):
    """Structured outputs' compiles wait on the worker thread until the event is set."""
    import threading

    from nanograph.engine.structured import Grammars

    release, compile_ = threading.Event(), Grammars._compile
    monkeypatch.setattr(Grammars, "_compile",
                        lambda self, g: release.wait(30) and compile_(self, g))  # fmt: skip
    yield release
    release.set()


def test_a_compiling_form_holds_up_no_other_request(tiny_with_tokenizer, held_compiles):
    """A form compiles on a worker thread: the requests beside it run meanwhile, and it starts
    once compiled, with the answer it has alone."""
    llm = make_llm(tiny_with_tokenizer)
    engine = llm.engine
    form, language = FORMS["grammar"]
    params = SamplingParams(max_tokens=16, temperature=0.0, structured_outputs=form)
    structured = engine.add_request(PROMPTS[0], params)
    plain = engine.add_request(PROMPTS[1], SamplingParams(max_tokens=8, ignore_eos=True))
    assert engine.has_work() and engine.num_waiting == 2
    for _ in range(40):
        if plain.status.name == "FINISHED":
            break
        engine.step()
    assert plain.finish_reason == "length" and len(plain.output_ids) == 8
    assert structured.status.name == "WAITING" and not structured.output_ids
    assert engine.has_work() and engine.num_waiting == 1
    held_compiles.set()
    engine.run([structured])
    alone = llm.generate([PROMPTS[0]], params)[0]
    assert structured.output_ids == alone.token_ids and alone.text in language
    assert_pages_back(llm)


def test_a_request_aborted_while_its_form_compiles_leaves_nothing(tiny_with_tokenizer,
                                                                   held_compiles):  # fmt: skip
    llm = make_llm(tiny_with_tokenizer)
    engine = llm.engine
    params = SamplingParams(max_tokens=4, structured_outputs=FORMS["regex"][0])
    request = engine.add_request(PROMPTS[0], params)
    engine.abort(request)
    assert request.finish_reason == "abort" and not engine.has_work()
    held_compiles.set()
    assert not engine.grammars.compiled()  # the compile's end is not read by anyone
    assert not engine.grammars.any_in([request]) and not engine.grammars.compiling(request)
    out = llm.generate([PROMPTS[0]], params)[0]  # the engine serves the same form after
    assert out.text in FORMS["regex"][1]
    assert_pages_back(llm)


def test_a_form_that_fails_to_compile_after_parsing_fails_alone(tiny_with_tokenizer,
                                                                monkeypatch):  # fmt: skip
    from nanograph.engine.structured import Grammars

    def refuse(self, grammar):
        raise RuntimeError("no tables for this grammar")

    monkeypatch.setattr(Grammars, "_compile", refuse)
    llm = make_llm(tiny_with_tokenizer)
    bad, good = llm.generate(PROMPTS[:2], [
        SamplingParams(max_tokens=4, structured_outputs=FORMS["choice"][0]),
        SamplingParams(max_tokens=4, ignore_eos=True),
    ])  # fmt: skip
    assert bad.finish_reason == "error"
    assert bad.error == "structured_outputs could not be compiled: no tables for this grammar"
    assert good.ok and len(good.token_ids) == 4
    assert_pages_back(llm)


@pytest.mark.parametrize(
    "form,message",
    [
        ({}, "structured_outputs must set exactly one of"),
        ({"regex": "a", "choice": ["a"]}, "structured_outputs must set exactly one of"),
        ({"json": "{not json"}, "structured_outputs.json is not JSON"),
        ({"json": [1]}, "structured_outputs.json must be a JSON schema object"),
        ({"json": {"enum": [{1, 2}]}}, "structured_outputs.json is not JSON"),
        ({"json": {"maximum": float("nan")}}, "structured_outputs.json is not JSON"),
        ({"regex": 3}, "structured_outputs.regex must be a non-empty string"),
        ({"choice": []}, "structured_outputs.choice must hold at least one string"),
        ({"choice": ["a", ""]}, "structured_outputs.choice[1] must be a non-empty string"),
        ({"jsn": {}}, "structured_outputs has no field 'jsn'"),
        ({"structural_tag": "{x"}, "structured_outputs.structural_tag is not JSON"),
        ({"structural_tag": {"triggers": ["<f>"]}}, "structured_outputs.structural_tag must be"),
        (
            {
                "structural_tag": {
                    "structures": [{"begin": "<f>", "end": "</f>"}],
                    "triggers": ["<"],
                }
            },
            "structured_outputs.structural_tag.structures must be",
        ),
        (
            {"structural_tag": {"structures": STRUCTURAL_TAGS["vllm"]["structures"]}},
            "structured_outputs.structural_tag.triggers must hold",
        ),
        ("a+", "structured_outputs must be a StructuredOutputs or a dict"),
    ],
)
def test_bad_forms_name_the_field(form, message):
    with pytest.raises(ValueError) as e:
        SamplingParams(structured_outputs=form)
    assert str(e.value).startswith(message)
    with pytest.raises(ValueError, match="min_tokens cannot be combined"):
        SamplingParams(min_tokens=2, structured_outputs={"regex": "a+"})


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                   "city": {"enum": ["Paris", "Rome"]}},
    "required": ["name", "age", "city"],
}  # fmt: skip


@requires_smollm2
@pytest.mark.parametrize("overlap", [True, False])
def test_json_answers_parse_and_keep_the_schema(overlap):
    from nanograph import LLM

    llm = LLM("smollm2-135m", progress=False, disable_overlap_schedule=not overlap)
    person = [{"role": "user", "content": "Describe a person as JSON."}]
    capital = [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]
    schema, any_object = llm.chat([person, capital], [
        SamplingParams(max_tokens=64, temperature=0, structured_outputs={"json": PERSON}),
        SamplingParams(max_tokens=64, temperature=0, structured_outputs={"json_object": True}),
    ])  # fmt: skip
    person = json.loads(schema.text)
    assert list(person) == ["name", "age", "city"]  # the schema's order
    assert isinstance(person["name"], str) and type(person["age"]) is int
    assert person["city"] in ("Paris", "Rome") and schema.finish_reason == "stop"
    assert isinstance(json.loads(any_object.text), dict) and any_object.finish_reason == "stop"


@requires_smollm2
def test_an_end_token_sampled_beside_running_requests():
    """A form that may end or go on, whose request takes the end token (biased to it): under
    the overlap schedule its next row was launched before the end was read, and gets no mask
    (xgrammar refuses to fill one for a matcher that took its end token); the request ends
    there, the others go on as alone."""
    from nanograph import LLM

    llm = LLM("smollm2-135m", progress=False)
    eos = llm.tokenizer.eos_token_ids[0]
    ending = SamplingParams(max_tokens=8, temperature=0.0, logit_bias={eos: 100.0},
                            structured_outputs={"regex": "yes|yes indeed"})  # fmt: skip
    plain = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    prompts = ["Is the sky blue?", "The capital of France is", "Is water wet?"]
    outs = llm.generate(prompts, [ending, plain, ending])
    for out in (outs[0], outs[2]):  # ended by the end token, which is not kept
        assert out.text == "yes" and out.finish_reason == "stop" and out.stop_reason is None
    assert outs[1].token_ids == llm.generate(prompts[1], plain)[0].token_ids
    assert not llm.engine.grammars._matchers and not llm.engine.grammars._ahead
    assert_pages_back(llm)
