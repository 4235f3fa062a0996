"""`nanograph serve` over real HTTP on loopback: SmolLM2 on CPU in a subprocess, driven by the
official ``openai`` client (and raw httpx where the client would hide the wire format). A subset
(answers against offline, concurrency, cancellation, bad input, metrics, SIGTERM) runs again
against a second server with ``--no-engine-process`` (the engine in a thread).

References: the same requests through the offline ``LLM`` (greedy), the same request alone,
streamed against non-streamed, and the KV pool's free count before and after.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from conftest import requires_smollm2

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from serving import ServerProcess, wait_pages_free  # noqa: E402

from nanograph import LLM, SamplingParams  # noqa: E402

pytestmark = requires_smollm2
KEY = "test-key"
MAX_LEN = 512
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
COMPLETION_PROMPT = "The three primary colours are"
PENALTIES = dict(presence_penalty=1.0, frequency_penalty=0.5, repetition_penalty=1.3)


TOOL = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


SERVER_ARGS = ("--api-key", KEY, "--max-model-len", str(MAX_LEN), "--quiet",
               "--shutdown-timeout", "20")  # fmt: skip


@pytest.fixture(scope="module")
def server():
    server = ServerProcess(*SERVER_ARGS)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def thread_server():
    """The same server with the engine in a thread of the server (``--no-engine-process``)."""
    server = ServerProcess(*SERVER_ARGS, "--no-engine-process")
    yield server
    server.stop()


@pytest.fixture(params=["thread", "process"])
def any_server(request):
    """Each of the two servers in turn: the tests of the thread front's subset take it."""
    return request.getfixturevalue("server" if request.param == "process" else "thread_server")


def _openai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def client(server):
    return _openai(server)


@pytest.fixture(scope="module")
def reference():
    """Offline greedy answers, in one batch: the chat question (16 tokens), a completion (12),
    with each token's log-probability and its two most likely alternatives; the chat question
    with penalties; the chat question with its answer's first two words as bad_words."""
    llm = LLM("smollm2-135m", max_model_len=MAX_LEN, progress=False)
    chat, completion, penalised = llm.generate(
        [QUESTION, COMPLETION_PROMPT, QUESTION],
        [
            SamplingParams(max_tokens=16, temperature=0, logprobs=2),
            SamplingParams(max_tokens=12, temperature=0, logprobs=2),
            SamplingParams(max_tokens=16, temperature=0, **PENALTIES),
        ],
    )
    person = llm.generate([PERSON_QUESTION], SamplingParams(
        max_tokens=48, temperature=0, structured_outputs={"json": PERSON}))[0]  # fmt: skip
    words = [w for w in chat.text.split() if w.isalpha()][:2]
    banned = llm.generate([QUESTION], SamplingParams(max_tokens=16, temperature=0,
                                                     bad_words=words))[0]  # fmt: skip
    # a structural tag that the completion's own first token opens: a number must follow (a
    # token running past the trigger is masked, so the trigger is a whole token)
    trigger = llm.tokenizer.decode(completion.token_ids[:1])
    tag = {
        "type": "structural_tag",
        "triggers": [trigger],
        "structures": [{"begin": trigger, "schema": {"type": "integer"}, "end": "."}],
    }
    tagged = llm.generate([COMPLETION_PROMPT], SamplingParams(
        max_tokens=12, temperature=0, structured_outputs={"structural_tag": tag}))[0]  # fmt: skip
    return {"chat": chat, "completion": completion, "penalised": penalised, "banned": banned,
            "bad_words": words, "person": person, "tagged": (tag, tagged)}  # fmt: skip


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == ["smollm2-135m"]
    health = wait_pages_free(server.base)
    assert health["status"] == "ok" and health["kv_pages_total"] > 0


def test_chat_matches_offline_and_stream_matches_whole(any_server, reference):
    client = _openai(any_server)
    expected = reference["chat"]
    whole = client.chat.completions.create(
        model="smollm2-135m", messages=QUESTION, max_tokens=16, temperature=0
    )
    assert whole.choices[0].message.content == expected.text
    assert whole.choices[0].finish_reason == expected.finish_reason
    assert whole.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert whole.usage.completion_tokens == len(expected.token_ids)
    chunks = list(
        client.chat.completions.create(
            messages=QUESTION,
            model="smollm2-135m",
            max_completion_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == expected.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(
        expected.token_ids
    )
    assert all(c.usage is None for c in chunks[:-1])
    # one id, creation time and model on every chunk of the stream, and the chunk object type
    assert len({(c.id, c.created, c.model, c.object) for c in chunks}) == 1
    assert chunks[0].object == "chat.completion.chunk" and chunks[0].model == "smollm2-135m"


def test_text_format_and_tools_not_to_call_answer_as_a_plain_request(server, reference):
    """The refusable options in their harmless forms are accepted and change nothing: a text
    response_format, tools with tool_choice "none" (an answer in text), text modalities."""
    body = {"model": "smollm2-135m", "messages": QUESTION, "max_tokens": 16, "temperature": 0,
            "response_format": {"type": "text"}, "tools": [TOOL], "tool_choice": "none",
            "functions": [TOOL["function"]], "function_call": "none", "modalities": ["text"],
            "include_stop_str_in_output": None}  # fmt: skip
    r = httpx.post(f"{server.base}/v1/chat/completions", json=body, headers=_auth(), timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == reference["chat"].text


def test_completions_text_and_token_ids(client, reference, server):
    prompt = COMPLETION_PROMPT
    expected = reference["completion"]
    whole = client.completions.create(
        model="smollm2-135m", prompt=prompt, max_tokens=12, temperature=0
    )
    assert whole.choices[0].text == expected.text
    ids = client.completions.create(
        model="smollm2-135m", prompt=expected.prompt_token_ids, max_tokens=12, temperature=0
    )
    assert ids.choices[0].text == expected.text
    # the wire format ends with OpenAI's sentinel; return_token_ids carries the exact tokens
    body = {
        "prompt": prompt,
        "max_tokens": 12,
        "temperature": 0,
        "stream": True,
        "return_token_ids": True,
    }
    r = httpx.post(f"{server.base}/v1/completions", json=body, headers=_auth(), timeout=60)
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    choices = [json.loads(e)["choices"][0] for e in events[:-1]]
    assert "".join(c["text"] for c in choices) == expected.text
    assert [t for c in choices for t in c.get("token_ids", [])] == expected.token_ids


def test_max_tokens_past_the_context_ends_at_the_context(client):
    """More max_tokens than the context leaves is accepted (vLLM and SGLang refuse it): the
    answer stops at the context length, finish_reason "length"."""
    prompt = list(range(1000, 1000 + MAX_LEN - 5))
    out = client.completions.create(
        model="smollm2-135m", prompt=prompt, max_tokens=10 * MAX_LEN, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (MAX_LEN - 5, 5)


def test_logprobs_equal_offline_whole_and_streamed(any_server, reference):
    """Chat's logprobs objects (whole, and spread over stream chunks) and completions' carry
    the offline engine's log-probabilities for the same tokens."""
    client = _openai(any_server)
    expected = reference["chat"]
    ask = dict(model="smollm2-135m", messages=QUESTION, max_tokens=16, temperature=0,
               logprobs=True, top_logprobs=2)  # fmt: skip
    whole = client.chat.completions.create(**ask).choices[0]
    content = whole.logprobs.content
    assert len(content) == len(expected.token_ids)
    assert [c.logprob for c in content] == pytest.approx(
        [lp.logprob for lp in expected.logprobs], abs=1e-4
    )
    for c, lp in zip(content, expected.logprobs):
        assert [t.logprob for t in c.top_logprobs] == pytest.approx(
            [v for _, v in lp.top], abs=1e-4
        )
        assert c.top_logprobs[0].token == c.token and c.bytes == list(c.token.encode())
    assert "".join(c.token for c in content) == whole.message.content
    chunks = list(client.chat.completions.create(**ask, stream=True))
    streamed = [
        c
        for chunk in chunks
        if chunk.choices and chunk.choices[0].logprobs
        for c in chunk.choices[0].logprobs.content
    ]
    assert [c.token for c in streamed] == [c.token for c in content]
    assert [c.logprob for c in streamed] == pytest.approx([c.logprob for c in content], abs=1e-5)

    completion = reference["completion"]
    choice = client.completions.create(
        model="smollm2-135m", prompt=COMPLETION_PROMPT, max_tokens=12, temperature=0, logprobs=2
    ).choices[0]
    lp = choice.logprobs
    assert "".join(lp.tokens) == choice.text == completion.text
    assert lp.token_logprobs == pytest.approx([x.logprob for x in completion.logprobs], abs=1e-4)
    assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(len(lp.tokens))]
    assert all(1 <= len(top) <= 2 for top in lp.top_logprobs)


def test_penalties_equal_offline_and_a_bias_forces_its_token(any_server, reference):
    expected = reference["penalised"]
    assert expected.text != reference["chat"].text  # they change this answer
    answer = _openai(any_server).chat.completions.create(
        model="smollm2-135m", messages=QUESTION, max_tokens=16, temperature=0,
        presence_penalty=PENALTIES["presence_penalty"],
        frequency_penalty=PENALTIES["frequency_penalty"],
        extra_body={"repetition_penalty": PENALTIES["repetition_penalty"]},
    )  # fmt: skip
    assert answer.choices[0].message.content == expected.text
    forced = httpx.post(
        f"{any_server.base}/v1/completions", headers=_auth(), timeout=60,
        json={"prompt": COMPLETION_PROMPT, "max_tokens": 4, "logit_bias": {"42": 100},
              "return_token_ids": True, "seed": 3},
    )  # fmt: skip
    assert forced.json()["choices"][0]["token_ids"] == [42] * 4
    allowed = httpx.post(
        f"{any_server.base}/v1/completions", headers=_auth(), timeout=60,
        json={"prompt": COMPLETION_PROMPT, "max_tokens": 6, "allowed_token_ids": [42, 43],
              "return_token_ids": True, "temperature": 1.0, "seed": 3},
    )  # fmt: skip
    assert set(allowed.json()["choices"][0]["token_ids"]) <= {42, 43}
    # vLLM's bad_words: the answer's words, banned, are not written (offline gives the same)
    words = reference["bad_words"]
    banned = _openai(any_server).chat.completions.create(
        model="smollm2-135m", messages=QUESTION, max_tokens=16, temperature=0,
        extra_body={"bad_words": words},
    ).choices[0].message.content  # fmt: skip
    assert len(words) == 2 and banned == reference["banned"].text
    assert not any(f" {w}" in f" {banned}" for w in words), (words, banned)


PERSON = {"type": "object", "properties": {"name": {"type": "string"},
          "age": {"type": "integer"}}, "required": ["name", "age"]}  # fmt: skip
PERSON_QUESTION = [{"role": "user", "content": "Describe a person as JSON."}]


def test_structured_outputs_equal_offline_in_every_spelling(any_server, reference):
    """OpenAI's response_format json_schema (whole and streamed), vLLM's guided_json and
    structured_outputs and SGLang's json_schema give the offline answer under the same schema,
    which parses and keeps it; a choice and a regex stay inside theirs."""
    expected = reference["person"]
    client = _openai(any_server)
    ask = dict(model="smollm2-135m", messages=PERSON_QUESTION, max_tokens=48, temperature=0)
    schema = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    answers = [
        client.chat.completions.create(**ask, response_format=schema),
        client.chat.completions.create(**ask, extra_body={"guided_json": PERSON}),
        client.chat.completions.create(**ask, extra_body={"structured_outputs": {"json": PERSON}}),
        client.chat.completions.create(**ask, extra_body={"json_schema": json.dumps(PERSON)}),
    ]
    assert [a.choices[0].message.content for a in answers] == [expected.text] * 4
    person = json.loads(expected.text)
    assert list(person) == ["name", "age"] and type(person["age"]) is int
    stream = client.chat.completions.create(**ask, response_format=schema, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == (expected.text)
    ask["messages"] = QUESTION
    city = client.chat.completions.create(**ask, extra_body={"guided_choice": ["Lyon", "Nice"]})
    assert city.choices[0].message.content in ("Lyon", "Nice")
    body = {"prompt": COMPLETION_PROMPT, "max_tokens": 12, "regex": "(red|green|blue)(, [a-z]+)*"}
    r = httpx.post(f"{any_server.base}/v1/completions", headers=_auth(), json=body, timeout=60)
    assert re.fullmatch(body["regex"], r.json()["choices"][0]["text"]) or (
        r.json()["choices"][0]["finish_reason"] == "length"
    )
    tag, tagged = reference["tagged"]  # vLLM's structural_tag response_format
    body = {"prompt": COMPLETION_PROMPT, "max_tokens": 12, "temperature": 0, "response_format": tag}
    r = httpx.post(f"{any_server.base}/v1/completions", headers=_auth(), json=body, timeout=60)
    text = r.json()["choices"][0]["text"]
    assert text == tagged.text and re.match(re.escape(tag["triggers"][0]) + r"\s*-?[0-9]", text)


def test_a_named_tool_choice_gives_a_call_of_that_function(any_server):
    """The engine holds the answer to the function's parameters: its arguments parse and keep
    the schema (SmolLM2 writes no calls by itself)."""
    tool = {
        "type": "function",
        "function": {
            "name": "weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    answer = _openai(any_server).chat.completions.create(
        model="smollm2-135m", messages=QUESTION, max_tokens=32, temperature=0, tools=[tool],
        tool_choice={"type": "function", "function": {"name": "weather"}},
    )  # fmt: skip
    [call] = answer.choices[0].message.tool_calls
    assert call.function.name == "weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)


def test_tokenize_and_detokenize_agree_with_the_engine(server, reference):
    def post(path, body, headers=None):
        return httpx.post(f"{server.base}/{path}", json=body, headers=headers or _auth(),
                          timeout=30)  # fmt: skip

    completion, chat = reference["completion"], reference["chat"]
    r = post("tokenize", {"prompt": COMPLETION_PROMPT}).json()
    assert r == {"count": len(completion.prompt_token_ids), "max_model_len": MAX_LEN,
                 "tokens": completion.prompt_token_ids}  # fmt: skip
    assert post("tokenize", {"messages": QUESTION}).json()["tokens"] == chat.prompt_token_ids
    # the template's own variables pass through (SmolLM2's uses none of these); the
    # arguments of apply_chat_template itself are refused, naming the field
    quiet = {"messages": QUESTION, "chat_template_kwargs": {"enable_thinking": False}}
    assert post("tokenize", quiet).json()["tokens"] == chat.prompt_token_ids
    for path, extra in (("tokenize", {}), ("v1/chat/completions", {"max_tokens": 2})):
        r = post(path, {**quiet, "chat_template_kwargs": {"tokenize": True}, **extra})
        assert r.status_code == 400 and "'tokenize'" in r.json()["error"]["message"]
        assert r.json()["error"]["param"] == "chat_template_kwargs"
    r = post("v1/chat/completions", {**quiet, "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(chat.prompt_token_ids)
    text = post("detokenize", {"tokens": completion.token_ids}).json()["prompt"]
    assert text == completion.text
    assert post("tokenize", {"prompt": "a", "messages": QUESTION}).status_code == 400
    bad = post("detokenize", {"tokens": [1, 10**7]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    assert post("detokenize", {"tokens": [1], "model": "gpt-4"}).status_code == 404
    assert post("tokenize", {"prompt": "a"}, {"Authorization": "Bearer wrong"}).status_code == 401


def test_stop_strings_never_stream_out(client, reference):
    full = reference["chat"].text
    stop = "of"  # inside the greedy answer ("The capital of France is Paris.")
    assert stop in full
    kwargs = dict(
        model="smollm2-135m",
        messages=QUESTION,
        max_tokens=16,
        temperature=0,
        stop=[stop, "zzz-not-there"],
    )
    whole = client.chat.completions.create(**kwargs).choices[0]
    assert whole.message.content == full[: full.index(stop)] and whole.finish_reason == "stop"
    assert whole.stop_reason == stop  # vLLM's extension: what stopped it
    streamed = [c.choices[0] for c in client.chat.completions.create(stream=True, **kwargs)
                if c.choices]  # fmt: skip
    chunks = [c.delta.content or "" for c in streamed]
    assert "".join(chunks) == whole.message.content
    assert (streamed[-1].finish_reason, streamed[-1].stop_reason) == ("stop", stop)
    # vLLM's include_stop_str_in_output: the text ends with the stop string, whole or streamed
    kept = dict(kwargs, extra_body={"include_stop_str_in_output": True})
    whole = client.chat.completions.create(**kept).choices[0]
    assert whole.message.content == full[: full.index(stop) + len(stop)]
    stream = client.chat.completions.create(stream=True, **kept)
    streamed = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(streamed) == whole.message.content
    assert all(stop not in chunk for chunk in chunks)


def test_min_tokens_goes_past_the_end_of_the_answer(client, reference):
    """vLLM's min_tokens: the greedy answer (ended by EOS) goes on to min_tokens tokens, the
    same text first; streamed as whole."""
    expected = reference["chat"]
    assert expected.finish_reason == "stop"
    kwargs = dict(model="smollm2-135m", messages=QUESTION, max_tokens=24, temperature=0,
                  extra_body={"min_tokens": len(expected.token_ids) + 3})  # fmt: skip
    whole = client.chat.completions.create(**kwargs)
    assert whole.usage.completion_tokens >= len(expected.token_ids) + 3
    assert whole.choices[0].message.content.startswith(expected.text)
    stream = client.chat.completions.create(stream=True, **kwargs)
    streamed = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(streamed) == whole.choices[0].message.content


def test_seeded_sampling_is_reproducible(client):
    kwargs = dict(
        model="smollm2-135m",
        messages=QUESTION,
        max_tokens=12,
        temperature=0.9,
        top_p=0.95,
        seed=1234,
        extra_body={"top_k": 40, "min_p": 0.01},
    )
    first = client.chat.completions.create(**kwargs).choices[0].message.content
    second = client.chat.completions.create(**kwargs).choices[0].message.content
    assert first == second
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(stream=True, **kwargs)
        if c.choices
    )
    assert streamed == first


def test_n_choices_each_equal_their_seed_alone_whole_and_streamed(any_server):
    """n seeded choices: choice i is the request with seed + i run alone; streamed chunks of
    the n choices interleave and add up to the same texts; usage counts every choice."""
    client = _openai(any_server)
    kwargs = dict(model="smollm2-135m", messages=QUESTION, max_tokens=10, temperature=1.0,
                  extra_body={"ignore_eos": True})  # fmt: skip
    alone = [client.chat.completions.create(seed=50 + i, **kwargs).choices[0].message.content
             for i in range(3)]  # fmt: skip
    assert len(set(alone)) > 1  # the seeds give different answers
    whole = client.chat.completions.create(seed=50, n=3, **kwargs)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert [c.message.content for c in whole.choices] == alone
    assert whole.usage.completion_tokens == 30
    usage = {"include_usage": True}
    chunks = list(client.chat.completions.create(seed=50, n=3, stream=True, **kwargs,
                                                 stream_options=usage))  # fmt: skip
    texts, finishes = ["", "", ""], [0, 0, 0]
    for chunk in chunks:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            finishes[c.index] += c.finish_reason is not None
    assert texts == alone and finishes == [1, 1, 1]
    assert chunks[-1].usage.completion_tokens == 30
    assert all(c.usage is None for c in chunks[:-1])
    # vLLM's continuous_usage_stats: every chunk's usage is the answer's so far
    usage = {"include_usage": True, "continuous_usage_stats": True}
    counts = [c.usage.completion_tokens for c in client.chat.completions.create(
        seed=50, n=3, stream=True, stream_options=usage, **kwargs)]  # fmt: skip
    assert counts == sorted(counts) and counts[-1] == 30 and len(set(counts)) > 2
    greedy = client.completions.create(model="smollm2-135m", prompt=COMPLETION_PROMPT, n=2,
                                       max_tokens=6, temperature=0)  # fmt: skip
    assert greedy.choices[0].text == greedy.choices[1].text


def test_a_batch_of_prompts_answers_n_choices_per_prompt_in_order(any_server):
    """A completions prompt list: choice p * n + i is prompt p with seed + i, as alone."""
    client = _openai(any_server)
    prompts = [COMPLETION_PROMPT, "Once upon a time", "1, 2, 3,"]
    kwargs = dict(model="smollm2-135m", max_tokens=6, temperature=1.0, seed=9,
                  extra_body={"ignore_eos": True})  # fmt: skip
    alone = [client.completions.create(prompt=p, **{**kwargs, "seed": 9 + i})
             for p in prompts for i in range(2)]  # fmt: skip
    batch = client.completions.create(prompt=prompts, n=2, **kwargs)
    assert [c.index for c in batch.choices] == list(range(6))
    assert [c.text for c in batch.choices] == [a.choices[0].text for a in alone]
    assert batch.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone[::2])
    assert batch.usage.completion_tokens == 36
    texts = [""] * 6
    for chunk in client.completions.create(prompt=prompts, n=2, stream=True, **kwargs):
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts == [c.text for c in batch.choices]
    ids = [[1, 2, 3, 4], [5, 6, 7]]  # a batch of token-id prompts, greedy
    greedy = dict(model="smollm2-135m", max_tokens=5, temperature=0)
    together = client.completions.create(prompt=ids, **greedy).choices
    assert [c.text for c in together] == [
        client.completions.create(prompt=p, **greedy).choices[0].text for p in ids
    ]


def test_echo_puts_each_prompt_before_its_choices(server, reference):
    completion = reference["completion"]

    def post(prompt, stream=False):
        body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "echo": True, "n": 2,
                "stream": stream}  # fmt: skip
        return httpx.post(f"{server.base}/v1/completions", json=body, headers=_auth(), timeout=60)

    decoded = httpx.post(f"{server.base}/detokenize", json={"tokens": completion.prompt_token_ids},
                         headers=_auth(), timeout=30).json()["prompt"]  # fmt: skip
    for prompt, text in ((COMPLETION_PROMPT, COMPLETION_PROMPT),
                         (completion.prompt_token_ids, decoded)):  # fmt: skip
        whole = [c["text"] for c in post(prompt).json()["choices"]]
        assert whole == [text + completion.text] * 2
        joined = ["", ""]
        for line in post(prompt, stream=True).text.splitlines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    joined[c["index"]] += c["text"]
        assert joined == whole


@pytest.fixture(scope="module")
def scored():
    """The completion prompt scored offline (prompt_logprobs 3), one greedy token after it."""
    llm = LLM("smollm2-135m", max_model_len=MAX_LEN, progress=False)
    params = SamplingParams(max_tokens=1, temperature=0, logprobs=3, prompt_logprobs=3)
    return llm.generate(COMPLETION_PROMPT, params)[0]


def test_echo_with_logprobs_scores_the_prompt_as_lm_eval_reads_it(server, scored):
    """What lm-evaluation-harness sends for loglikelihoods (token ids, echo, logprobs 1,
    max_tokens 1): the logprobs object covers the prompt (the first token's entries null) and
    the answer, equal to the offline scores; streamed as whole; vLLM's prompt_logprobs too."""
    ids, n = scored.prompt_token_ids, len(scored.prompt_token_ids)
    body = {"prompt": [ids], "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1,
            "prompt_logprobs": 2}  # fmt: skip

    def post(stream: bool) -> httpx.Response:
        return httpx.post(f"{server.base}/v1/completions", json={**body, "stream": stream},
                          headers=_auth(), timeout=60)  # fmt: skip

    choice = post(False).json()["choices"][0]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == n + 1
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    want = [s.logprob for s in scored.prompt_logprobs[1:]] + [scored.logprobs[0].logprob]
    assert lp["token_logprobs"][1:] == pytest.approx(want, abs=1e-4)
    assert all(len(top) == 1 for top in lp["top_logprobs"][1:])
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
    assert choice["text"].endswith(scored.text)
    # vLLM's prompt_logprobs: the token and its two alternatives, ranked
    listed = choice["prompt_logprobs"]
    assert len(listed) == n and listed[0] is None
    for token, entry, want in zip(ids[1:], listed[1:], scored.prompt_logprobs[1:]):
        mine = entry[str(token)]
        assert mine["logprob"] == pytest.approx(want.logprob, abs=1e-4)
        assert mine["rank"] == want.rank and isinstance(mine["decoded_token"], str)
        assert {int(t) for t in entry} == {token, *(t for t, _ in want.top[:2])}
    chunks = [json.loads(line[6:])["choices"][0] for line in post(True).text.splitlines()
              if line.startswith("data: {")]  # fmt: skip
    assert "".join(c["text"] for c in chunks) == choice["text"]
    streamed = [x for c in chunks if c["logprobs"] for x in c["logprobs"]["token_logprobs"]]
    assert streamed == lp["token_logprobs"]
    assert [c["prompt_logprobs"] for c in chunks if "prompt_logprobs" in c] == [listed]


def test_truncate_prompt_tokens_runs_and_echoes_the_prompts_end(server, reference):
    """vLLM's truncate_prompt_tokens: the last k prompt tokens run (usage counts them), the
    echo is them decoded, and the answer is theirs alone."""
    ids = reference["completion"].prompt_token_ids

    def post(body: dict) -> httpx.Response:
        body = {"max_tokens": 4, "temperature": 0, **body}
        return httpx.post(f"{server.base}/v1/completions", headers=_auth(), json=body, timeout=60)

    cut = post({"prompt": COMPLETION_PROMPT, "truncate_prompt_tokens": 3, "echo": True}).json()
    alone = post({"prompt": ids[-3:], "echo": True}).json()
    assert cut["usage"]["prompt_tokens"] == 3
    assert cut["choices"][0]["text"] == alone["choices"][0]["text"]


def test_eight_concurrent_requests_equal_each_alone(any_server):
    server, client = any_server, _openai(any_server)
    prompts = [f"Count from {i} to {i + 5}:" for i in range(8)]
    alone = [
        client.completions.create(model="smollm2-135m", prompt=p, max_tokens=8, temperature=0)
        .choices[0]
        .text
        for p in prompts
    ]

    async def together():
        aclient = openai.AsyncOpenAI(
            base_url=f"{server.base}/v1", api_key=KEY, max_retries=0, timeout=60
        )
        async with aclient:
            calls = [
                aclient.completions.create(
                    model="smollm2-135m", prompt=p, max_tokens=8, temperature=0, stream=i % 2 == 1
                )
                for i, p in enumerate(prompts)
            ]
            results = await asyncio.gather(*calls)
            texts = []
            for r in results:
                if isinstance(r, openai.AsyncStream):
                    texts.append("".join([c.choices[0].text async for c in r]))
                else:
                    texts.append(r.choices[0].text)
            return texts

    assert asyncio.run(asyncio.wait_for(together(), 90)) == alone
    wait_pages_free(server.base)


def test_cancelled_stream_frees_its_pages(any_server):
    server, client = any_server, _openai(any_server)
    start = wait_pages_free(server.base)
    stream = client.chat.completions.create(
        model="smollm2-135m",
        messages=QUESTION,
        max_tokens=400,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    for _, _chunk in zip(range(3), stream):
        pass
    stream.close()  # the client goes away mid-stream
    assert wait_pages_free(server.base)["kv_pages_available"] == start["kv_pages_available"]
    several = client.chat.completions.create(  # every choice's request goes
        model="smollm2-135m", messages=QUESTION, max_tokens=400, stream=True, n=3,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    for _, _chunk in zip(range(6), several):
        pass
    several.close()
    assert wait_pages_free(server.base)["kv_pages_available"] == start["kv_pages_available"]
    # a non-streamed request whose client gives up is aborted too
    body = {"messages": QUESTION, "max_tokens": 400, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base}/v1/chat/completions", json=body, headers=_auth(), timeout=1.0)
    assert wait_pages_free(server.base)["kv_pages_available"] == start["kv_pages_available"]
    aborted = _metric(server, "nanograph_requests_finished_total", reason="abort")
    assert aborted >= 2


BAD = [  # (body or raw bytes, endpoint, status, param)
    (b"{not json", "chat/completions", 400, None),
    (b"[1, 2]", "chat/completions", 400, None),
    ({"messages": QUESTION, "temperature": "hot"}, "chat/completions", 400, "temperature"),
    ({"messages": QUESTION, "max_tokens": True}, "chat/completions", 400, "max_tokens"),
    ({"messages": "hello"}, "chat/completions", 400, "messages"),
    ({"messages": []}, "chat/completions", 400, "messages"),
    ({"messages": [{"role": "user"}]}, "chat/completions", 400, "messages"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "chat/completions",
        400,
        "messages[0].content",
    ),
    ({"messages": QUESTION, "max_tokens": 0}, "chat/completions", 400, "max_tokens"),
    (
        {"messages": QUESTION, "max_completion_tokens": -3},
        "chat/completions",
        400,
        "max_completion_tokens",
    ),
    ({"messages": QUESTION, "temperature": -0.5}, "chat/completions", 400, "temperature"),
    ({"messages": QUESTION, "top_p": 0}, "chat/completions", 400, "top_p"),
    ({"messages": QUESTION, "n": 0}, "chat/completions", 400, "n"),
    ({"prompt": "hi", "n": 129}, "completions", 400, "n"),
    ({"messages": QUESTION, "top_logprobs": 2}, "chat/completions", 400, "top_logprobs"),
    (
        {"messages": QUESTION, "logprobs": True, "top_logprobs": 21},
        "chat/completions",
        400,
        "top_logprobs",
    ),
    ({"messages": QUESTION, "logprobs": 2}, "chat/completions", 400, "logprobs"),
    ({"prompt": "hi", "logprobs": 21}, "completions", 400, "logprobs"),
    ({"prompt": "hi", "presence_penalty": 2.5}, "completions", 400, "presence_penalty"),
    ({"prompt": "hi", "repetition_penalty": 0}, "completions", 400, "repetition_penalty"),
    ({"prompt": "hi", "logit_bias": {"five": 1.0}}, "completions", 400, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"5": 101}}, "completions", 400, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"10000000": 1}}, "completions", 400, "logit_bias"),
    ({"messages": QUESTION, "model": "gpt-4"}, "chat/completions", 404, "model"),
    ({"prompt": "word " * (MAX_LEN + 10)}, "completions", 400, "prompt"),
    ({"prompt": [1, 2, 10**9]}, "completions", 400, "prompt"),
    ({"prompt": [1, -5]}, "completions", 400, "prompt"),
    ({"prompt": ["a"] * 65, "n": 2}, "completions", 400, "prompt"),
    ({"prompt": ["a", ""]}, "completions", 400, "prompt"),
    ({"prompt": ""}, "completions", 400, "prompt"),
    ({"prompt": "hi", "stop": [""]}, "completions", 400, "stop"),
    ({"prompt": "hi", "seed": 2**70}, "completions", 400, "seed"),
    ({}, "completions", 400, "prompt"),
    # what the engine cannot honour: refused, never silently ignored
    ({"prompt": "hi", "best_of": 2}, "completions", 400, "best_of"),
    ({"prompt": "hi", "suffix": "!"}, "completions", 400, "suffix"),
    # structured outputs: a bad form, or two, names the field it came in
    (
        {"messages": QUESTION, "response_format": {"type": "xml"}},
        "chat/completions",
        400,
        "response_format",
    ),
    (
        {"prompt": "hi", "response_format": {"type": "json_schema", "json_schema": {}}},
        "completions",
        400,
        "response_format",
    ),
    (
        {"prompt": "hi", "response_format": {"type": "structural_tag", "structures": []}},
        "completions",
        400,
        "response_format",
    ),
    ({"prompt": "hi", "guided_json": "{not json"}, "completions", 400, "guided_json"),
    ({"prompt": "hi", "guided_choice": []}, "completions", 400, "guided_choice"),
    (
        {"messages": QUESTION, "structured_outputs": {"regex": "a+", "choice": ["a"]}},
        "chat/completions",
        400,
        "structured_outputs",
    ),
    (
        {"messages": QUESTION, "structured_outputs": "a+"},
        "chat/completions",
        400,
        "structured_outputs",
    ),
    ({"messages": QUESTION, "regex": "(unclosed"}, "chat/completions", 400, "regex"),
    ({"messages": QUESTION, "ebnf": "root ::= undefined"}, "chat/completions", 400, "ebnf"),
    (
        {"messages": QUESTION, "regex": "a+", "guided_regex": "b+"},
        "chat/completions",
        400,
        "regex",
    ),
    ({"messages": QUESTION, "tools": [TOOL]}, "chat/completions", 400, "tools"),
    (
        {"messages": QUESTION, "tools": [TOOL], "tool_choice": "auto"},
        "chat/completions",
        400,
        "tools",
    ),
    ({"messages": QUESTION, "tool_choice": "required"}, "chat/completions", 400, "tools"),
    (
        {
            "messages": QUESTION,
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "clock"}},
        },
        "chat/completions",
        400,
        "tool_choice",
    ),
    ({"messages": QUESTION, "tools": [{"name": "weather"}]}, "chat/completions", 400, "tools"),
    ({"messages": QUESTION, "functions": [TOOL["function"]]}, "chat/completions", 400, "functions"),
    (
        {"messages": QUESTION, "modalities": ["text", "audio"]},
        "chat/completions",
        400,
        "modalities",
    ),
    (
        {"messages": QUESTION, "audio": {"voice": "alloy", "format": "wav"}},
        "chat/completions",
        400,
        "audio",
    ),
    ({"prompt": "hi", "min_tokens": 17}, "completions", 400, "min_tokens"),  # > max_tokens 16
    ({"prompt": "hi", "min_tokens": -1}, "completions", 400, "min_tokens"),
    ({"prompt": "hi", "prompt_logprobs": 21}, "completions", 400, "prompt_logprobs"),
    ({"prompt": "hi", "truncate_prompt_tokens": 0}, "completions", 400, "truncate_prompt_tokens"),
    ({"prompt": "hi", "allowed_token_ids": []}, "completions", 400, "allowed_token_ids"),
    ({"prompt": "hi", "allowed_token_ids": [10**7]}, "completions", 400, "allowed_token_ids"),
    ({"prompt": "hi", "bad_words": [""]}, "completions", 400, "bad_words"),
    ({"prompt": "hi", "bad_words": 3}, "completions", 400, "bad_words"),
    ({"messages": QUESTION, "prompt_logprobs": -1}, "chat/completions", 400, "prompt_logprobs"),
    (
        {"prompt": "hi", "include_stop_str_in_output": "yes"},
        "completions",
        400,
        "include_stop_str_in_output",
    ),
]


@pytest.mark.parametrize("body,endpoint,status,param", BAD)
def test_bad_input_gets_a_4xx_with_an_openai_error(any_server, body, endpoint, status, param):
    server = any_server
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(f"{server.base}/v1/{endpoint}", headers=_auth(), timeout=30, **kwargs)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param


def test_wrong_api_key_and_server_keeps_serving(server, client):
    bad = openai.OpenAI(base_url=f"{server.base}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="smollm2-135m", messages=QUESTION, max_tokens=2)
    r = httpx.get(f"{server.base}/v1/models", timeout=10)  # no key at all
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    ok = client.chat.completions.create(model="smollm2-135m", messages=QUESTION, max_tokens=2)
    assert ok.choices[0].finish_reason == "length"
    wait_pages_free(server.base)


def test_metrics_parse(any_server):
    server = any_server
    families = {
        f.name: f
        for f in text_string_to_metric_families(
            httpx.get(f"{server.base}/metrics", timeout=10).text
        )
    }
    for name in (
        "nanograph_requests_running",
        "nanograph_requests_waiting",
        "nanograph_kv_pages_used",
        "nanograph_prompt_tokens",
        "nanograph_generation_tokens",
        "nanograph_forwards",
        "nanograph_time_to_first_token_seconds",
        "nanograph_inter_token_latency_seconds",
    ):
        assert name in families, name
    forwards = {
        (s.labels["path"], s.labels["kind"]): s.value
        for s in families["nanograph_forwards"].samples
    }
    assert forwards[("decode", "eager")] > 0 and forwards[("decode", "graph")] == 0  # CPU: eager
    assert _metric(server, "nanograph_time_to_first_token_seconds_count") > 0
    assert _metric(server, "nanograph_requests_rejected_total", status="400") > 0


def test_bench_serve_reports_every_field(server, tmp_path):
    from nanograph.bench.serve import main

    out = tmp_path / "serve.json"
    argv = [
        "--base-url",
        server.base,
        "--api-key",
        KEY,
        "--dataset",
        "random,sharegpt",
        "--request-rate",
        "inf,20",
        "--max-concurrency",
        "2,0",
        "--num-prompts",
        "3",
        "--input-len",
        "8",
        "--output-len",
        "3",
        "--max-input-len",
        "16",
        "--max-output-len",
        "3",
        "--warmup",
        "1",
        "--request-timeout",
        "60",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert {"env", "config", "workloads", "points"} <= set(report)
    assert set(report["workloads"]) == {"random", "sharegpt"}
    stats = {"mean", "median", "p90", "p99"}
    for point, dataset in zip(report["points"], ["random", "sharegpt"]):
        assert point["dataset"] == dataset and point["completed"] == 3 and point["failed"] == 0
        for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            assert set(point[key]) == stats
        for key in ("request_throughput", "input_throughput", "output_throughput", "duration_s"):
            assert point[key] > 0
        assert point["forwards"]["decode_eager"] > 0
    # ignore_eos: every request produced exactly its output length
    assert report["points"][0]["total_output_tokens"] == 3 * 3
    assert report["points"][0]["total_input_tokens"] == 3 * 8


def test_a_repeated_prompt_reports_cached_tokens(server, client):
    """Prefix caching over HTTP: the second identical prompt takes its whole pages from the
    cache (usage.prompt_tokens_details.cached_tokens), and /metrics counts the hit."""
    messages = [{"role": "user", "content": "List the planets of the solar system, in order "
                 "from the sun, with one fact about each of them."}]  # fmt: skip
    hits_before = _metric(server, "nanograph_prefix_cache_hit_tokens_total")
    first = client.chat.completions.create(
        model="smollm2-135m", messages=messages, max_tokens=4, temperature=0
    )
    second = client.chat.completions.create(
        model="smollm2-135m", messages=messages, max_tokens=4, temperature=0
    )
    assert second.choices[0].message.content == first.choices[0].message.content
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < second.usage.prompt_tokens  # whole pages, never the last token
    assert _metric(server, "nanograph_prefix_cache_hit_tokens_total") >= hits_before + cached
    assert 0 < _metric(server, "nanograph_prefix_cache_hit_rate") <= 1


def test_sigterm_exits_cleanly_after_finishing_in_flight(any_server):
    server = any_server
    """The last test: SIGTERM while a request streams; it completes, then the process exits 0."""
    body = {"prompt": "Once upon a time", "max_tokens": 24, "ignore_eos": True, "stream": True}
    with httpx.stream(
        "POST", f"{server.base}/v1/completions", json=body, headers=_auth(), timeout=60
    ) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        server.proc.send_signal(15)
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    assert json.loads(rest[-2][6:])["choices"][0]["finish_reason"] == "length"
    assert server.stop() == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.base}/health", timeout=2)


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def _metric(server, name: str, **labels) -> float:
    text = httpx.get(f"{server.base}/metrics", timeout=10).text
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )
