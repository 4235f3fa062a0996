"""Reasoning output (``--reasoning-parser``): the parser alone (both rules, any split of the text
gives the same answer, which is what a five-line reading of the whole text gives), then the chat
server over real HTTP with a scripted front, read with the official ``openai`` client, streamed
and whole, alone and with tool calls; and the wire of a server without the flag, unchanged.
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanograph.serve.reasoning import (
    END,
    REASONING_PARSERS,
    START,
    ReasoningParser,
    Split,
    thinking_on,
)


def parse(name: str, *pieces: str) -> tuple[str, str]:
    """Reasoning and content of the text fed in ``pieces``."""
    parser = ReasoningParser(name)
    total = Split()
    for piece in pieces:
        total += parser.feed(piece)
    total += parser.finish()
    return total.reasoning, total.content


def reference(name: str, text: str) -> tuple[str, str]:
    """The rule, read off the whole text (``reasoning.py``'s docstring)."""
    rest = text.lstrip()
    if rest.startswith(START):
        text = rest[len(START) :]
    elif not REASONING_PARSERS[name]:  # qwen3: no <think> at the start, all content
        return "", text
    reasoning, end, content = text.partition(END)
    return reasoning, content.lstrip("\n") if end else ""


def test_plain_answer():
    text = "The capital of France is Paris."
    assert parse("qwen3", text) == ("", text)  # Qwen3 with thinking off
    assert parse("deepseek-r1", text) == (text, "")  # no </think> yet: all reasoning
    assert parse("qwen3", "") == parse("deepseek-r1", "") == ("", "")


def test_think_then_answer():
    assert parse("qwen3", "<think>\nAdd them.\n</think>\n\n42") == ("\nAdd them.\n", "42")
    # DeepSeek-R1's template opens <think> in the prompt; R1-0528 writes one itself
    assert parse("deepseek-r1", "Add them.\n</think>\n\n42") == ("Add them.\n", "42")
    assert parse("deepseek-r1", "<think>\nAdd them.</think>42") == ("\nAdd them.", "42")
    assert parse("deepseek_r1", "a</think>b") == parse("qwen3-thinking", "a</think>b") == ("a", "b")
    # whitespace before the opening tag
    assert parse("qwen3", "\n <think>a</think>b") == ("a", "b")
    assert parse("qwen3", " Hello") == ("", " Hello")


def test_no_closing_tag():
    """A length cut inside the block: qwen3's opened block and DeepSeek's answer are all
    reasoning; a qwen3 answer that did not open with <think> is content, tags and all."""
    assert parse("qwen3", "<think>Let me see, 2 + 2") == ("Let me see, 2 + 2", "")
    assert parse("deepseek-r1", "Let me see, 2 + 2") == ("Let me see, 2 + 2", "")
    assert parse("qwen3", "Let me see</think>4") == ("", "Let me see</think>4")
    assert parse("qwen3", "4, not <think>5</think>") == ("", "4, not <think>5</think>")


def test_empty_reasoning():
    assert parse("qwen3", "<think></think>Hi") == ("", "Hi")
    assert parse("qwen3", "<think>\n\n</think>\n\nHi") == ("\n\n", "Hi")
    assert parse("deepseek-r1", "</think>\n\nHi") == ("", "Hi")


def test_newlines_after_the_block_are_dropped_and_nothing_else():
    assert parse("qwen3", "<think>a</think>\n\n  x\n") == ("a", "  x\n")
    assert parse("qwen3", "<think>a</think>\nA\n\nB\n") == ("a", "A\n\nB\n")
    assert parse("qwen3", "<think>a</think>\n\n") == ("a", "")
    assert parse("qwen3", "<think>a\n</think> \nb") == ("a\n", " \nb")


def test_only_the_first_block_is_reasoning():
    text = "<think>a</think>b<think>c</think>d"
    assert parse("qwen3", text) == ("a", "b<think>c</think>d")
    assert parse("deepseek-r1", "a</think>b</think>c") == ("a", "b</think>c")


def test_held_back_text_is_what_may_be_a_tag():
    parser = ReasoningParser("qwen3")
    assert parser.feed("\n<thi") == Split()  # may open the block
    assert parser.feed("nk>Hmm </th") == Split("Hmm ")  # may close it
    assert parser.feed("ing") == Split("</thing")  # it did not
    assert parser.feed("</think>\n") == Split()  # closed; a newline after it is dropped
    assert parser.feed("\nOK") == Split(content="OK")
    assert parser.finish() == Split()
    parser = ReasoningParser("qwen3")
    assert parser.feed("<thin") == Split()
    assert parser.feed("g") == Split(content="<thing")
    parser = ReasoningParser("qwen3")
    assert parser.feed("  <th") == Split() and parser.finish() == Split(content="  <th")
    parser = ReasoningParser("deepseek-r1")
    assert parser.feed("  <th") == Split() and parser.finish() == Split("  <th")


@pytest.mark.parametrize("text", ["Paris.", "Hmm</think>Paris.", "<think>Hmm</think>Paris."])
def test_thinking_off_reads_deepseek_answers_with_qwen3s_rule(text):
    """A template asked not to think opened no block: only a block the answer opens is
    reasoning."""
    off = ReasoningParser("deepseek-r1", thinking=False)
    assert off.feed(text) + off.finish() == Split(*reference("qwen3", text))
    assert reference("qwen3", text) != reference("deepseek-r1", text) or text.startswith(START)


def test_thinking_on_reads_the_template_switches():
    assert thinking_on(None) and thinking_on({}) and thinking_on({"enable_thinking": True})
    assert not thinking_on({"enable_thinking": False}) and not thinking_on({"thinking": False})


def test_an_unknown_parser_is_refused():
    with pytest.raises(ValueError, match="qwen3, deepseek-r1"):
        ReasoningParser("granite")


TEXTS = [
    "<think>\nLet me think </th </think>\n\n\nAnswer </think> <think>",
    "  \n<think></think>\n",
    "<think><think>a</think></think>",
    "<thinking>not a block</think>",
    "é<think>é</think>é",
    "a</think>\n\nb</think>",
    "\n\n<thi",
    "<think>ends inside </thin",
]


@pytest.mark.parametrize("name", ["qwen3", "deepseek-r1"])
@pytest.mark.parametrize("text", TEXTS)
def test_every_split_gives_the_same_answer(name, text):
    whole = parse(name, text)
    assert whole == reference(name, text)
    assert parse(name, *text) == whole  # one character at a time
    for i in range(len(text) + 1):
        assert parse(name, text[:i], text[i:]) == whole, i
        for j in range(i, len(text) + 1):
            assert parse(name, text[:i], text[i:j], text[j:]) == whole, (i, j)


FRAGMENTS = [START, END, "<", "think", ">", "</", "\n", " ", "Hi", "é", "<tool_call>"]


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(REASONING_PARSERS)), st.lists(st.sampled_from(FRAGMENTS),
       max_size=12), st.data())  # fmt: skip
def test_any_split_of_any_text_gives_the_same_answer(name, fragments, data):
    text = "".join(fragments)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    assert parse(name, *pieces) == reference(name, text)


# --- the server, over HTTP, with a scripted front ---------------------------------------------

fastapi = pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
from serving import ScriptedFront, byte_tokenizer, scripted_server  # noqa: E402

from nanograph.serve.app import build_app  # noqa: E402

QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]
TOOL = {"type": "function", "function": {"name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}  # fmt: skip
WEATHER = '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'
THOUGHT = "<think>\nThe user asks for a sum.\n</think>\n\n"


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def qwen3(tokenizer):
    """A server started with --reasoning-parser qwen3 --tool-call-parser hermes."""
    with scripted_server(tokenizer, reasoning_parser="qwen3", tool_call_parser="hermes") as served:
        yield served


@pytest.fixture(scope="module")
def deepseek(tokenizer):
    with scripted_server(tokenizer, reasoning_parser="deepseek-r1") as served:
        yield served


@pytest.fixture(scope="module")
def no_parser(tokenizer):
    with scripted_server(tokenizer) as served:
        yield served


def ask(base: str, **kwargs):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=30)
    return client.chat.completions.create(
        model="scripted", messages=kwargs.pop("messages", QUESTION), **kwargs
    )


def reasoning_of(message) -> str | None:
    """``reasoning`` (vLLM's name) and ``reasoning_content`` (SGLang's): not in OpenAI's schema,
    so extra fields of the client's; both are sent, the same text."""
    reasoning = getattr(message, "reasoning", None)
    assert reasoning == getattr(message, "reasoning_content", None)
    return reasoning


def streamed(base: str, **kwargs) -> dict[int, dict]:
    """Each choice's streamed answer put together: reasoning, content, tool calls, finish."""
    choices: dict[int, dict] = {}
    for chunk in ask(base, stream=True, **kwargs):
        for c in chunk.choices:
            got = choices.setdefault(
                c.index, {"reasoning": "", "content": "", "tool_calls": [], "finish": None}
            )
            got["reasoning"] += reasoning_of(c.delta) or ""
            got["content"] += c.delta.content or ""
            got["tool_calls"] += c.delta.tool_calls or []
            got["finish"] = c.finish_reason or got["finish"]
    return choices


def test_whole_answer_has_reasoning_content(qwen3):
    base, front = qwen3
    front.answer(THOUGHT + "2 + 2 = 4.")
    answer = ask(base)
    message = answer.choices[0].message
    assert (reasoning_of(message), message.content) == (
        "\nThe user asks for a sum.\n",
        "2 + 2 = 4.",
    )
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage.completion_tokens == len(THOUGHT + "2 + 2 = 4.")  # reasoning counts


def test_no_think_block_is_content_and_null_reasoning(qwen3):
    """Qwen3 with enable_thinking false writes no block: all content, reasoning_content null."""
    base, front = qwen3
    front.answer("4.")
    body = {"messages": QUESTION, "chat_template_kwargs": {"enable_thinking": False}}
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30)
    message = r.json()["choices"][0]["message"]
    assert message == {
        "role": "assistant",
        "content": "4.",
        "reasoning": None,
        "reasoning_content": None,
    }


ANSWERS = {  # server -> answers, with what the whole answer holds
    "qwen3": [
        (THOUGHT + "4.", "\nThe user asks for a sum.\n", "4."),
        ("4, no </think> here", None, "4, no </think> here"),
        ("<think>cut short", "cut short", None),
        ("<think></think>\n\n4.", None, "4."),
    ],
    "deepseek": [
        ("Two and two.</think>\n\n4.", "Two and two.", "4."),
        ("<think>Two and two.</think>4.", "Two and two.", "4."),
        ("no end tag: all reasoning", "no end tag: all reasoning", None),
    ],
}  # fmt: skip


@pytest.mark.parametrize("server", ["qwen3", "deepseek"])
def test_streamed_answer_equals_the_whole(request, server):
    base, front = request.getfixturevalue(server)
    for text, reasoning, content in ANSWERS[server]:
        front.answer(text, text)
        message = ask(base).choices[0].message
        assert (reasoning_of(message), message.content) == (reasoning, content), text
        got = streamed(base)[0]
        assert (got["reasoning"], got["content"]) == (reasoning or "", content or ""), text
        assert got["finish"] == "stop"


@pytest.mark.parametrize("switch", ["enable_thinking", "thinking"])
def test_thinking_turned_off_is_content_with_deepseek(deepseek, switch):
    base, front = deepseek
    front.answer("4.", "4.")
    off = {"chat_template_kwargs": {switch: False}}
    whole = ask(base, extra_body=off).choices[0].message
    assert (reasoning_of(whole), whole.content) == (None, "4.")
    got = streamed(base, extra_body=off)[0]
    assert (got["reasoning"], got["content"]) == ("", "4.")


def test_a_structured_output_is_content_with_deepseek(deepseek):
    """A form holds the answer from its first token, so no think block opens: content."""
    base, front = deepseek
    front.answer('{"sum": 4}')
    message = ask(base, response_format={"type": "json_object"}).choices[0].message
    assert (reasoning_of(message), message.content) == (None, '{"sum": 4}')


def test_stream_chunks_carry_reasoning_deltas(deepseek):
    """Reasoning streams as it comes, in chunks of its own (no ``content`` key)."""
    base, front = deepseek
    front.answer("abc</think>xy")
    body = {"messages": QUESTION, "stream": True}
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30)
    deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in r.text.split("\n\n")
              if line.startswith("data: {")]  # fmt: skip
    assert deltas[0] == {"content": "", "role": "assistant"}
    sent = [d for d in deltas[1:] if d]
    assert sent[:3] == [{"reasoning": c, "reasoning_content": c} for c in "abc"]  # at once
    assert sent[3:] == [{"content": "x"}, {"content": "y"}]  # </think> held, then dropped


def test_n_choices_parse_on_their_own(deepseek):
    base, front = deepseek
    front.answer("a</think>b", "c")
    choices = ask(base, n=2).choices
    assert [(reasoning_of(c.message), c.message.content) for c in choices] == [
        ("a", "b"), ("c", None)
    ]  # fmt: skip
    front.answer("a</think>b", "c")
    got = streamed(base, n=2)
    assert [(got[i]["reasoning"], got[i]["content"]) for i in (0, 1)] == [("a", "b"), ("c", "")]


def test_a_tool_call_inside_the_think_block_is_reasoning(qwen3):
    """The tool-call parser reads the content only: a block written while thinking is text
    of the reasoning, one after ``</think>`` a call."""
    base, front = qwen3
    thinking = f"<think>I could write {WEATHER} now.</think>\n\n"
    text = thinking + WEATHER
    front.answer(text, text)
    choice = ask(base, tools=[TOOL]).choices[0]
    assert reasoning_of(choice.message) == f"I could write {WEATHER} now."
    assert choice.message.content is None and choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "weather",
        {"city": "Paris"},
    )
    got = streamed(base, tools=[TOOL])[0]
    assert got["reasoning"] == reasoning_of(choice.message) and got["content"] == ""
    assert [c.function.name for c in got["tool_calls"]] == ["weather"]
    assert got["finish"] == "tool_calls"
    # only the thinking mentions a call: no call, the answer is content
    front.answer(thinking + "Sunny.")
    choice = ask(base, tools=[TOOL]).choices[0]
    assert (choice.message.content, choice.message.tool_calls) == ("Sunny.", None)
    assert choice.finish_reason == "stop"


def test_logprobs_cover_every_token(qwen3):
    """Reasoning tokens too, whole and streamed (each chunk the tokens it brings)."""
    base, front = qwen3
    front.answer(THOUGHT + "4.", THOUGHT + "4.")
    choice = ask(base, logprobs=True).choices[0]
    assert "".join(t.token for t in choice.logprobs.content) == THOUGHT + "4."
    chunks = [c.choices[0] for c in ask(base, logprobs=True, stream=True) if c.choices]
    tokens = [t.token for c in chunks if c.logprobs for t in c.logprobs.content]
    assert "".join(tokens) == THOUGHT + "4."


def test_completions_are_not_parsed(qwen3):
    base, front = qwen3
    front.answer(THOUGHT + "4.")
    body = {"prompt": "2 + 2 =", "max_tokens": 64}
    choice = httpx.post(f"{base}/v1/completions", json=body, timeout=30).json()["choices"][0]
    assert choice["text"] == THOUGHT + "4."
    assert not {"reasoning", "reasoning_content"} & choice.keys()


@pytest.mark.parametrize("name", ["reasoning", "reasoning_content"])
def test_a_past_turns_thinking_reaches_the_template_under_either_name(qwen3, tokenizer, name):
    """A client sends the thinking back under the name it read (vLLM's or SGLang's); the
    template reads ``reasoning_content``, as Qwen3's does."""
    base, _ = qwen3
    history = QUESTION + [{"role": "assistant", "content": "4.", name: "A sum."},
                          {"role": "user", "content": "And 3 + 3?"}]  # fmt: skip
    r = httpx.post(f"{base}/tokenize", json={"messages": history}, timeout=30)
    assert tokenizer.decode(r.json()["tokens"]) == (
        "<user>What is 2 + 2?<assistant><think>A sum.</think>4.<user>And 3 + 3?<assistant>"
    )


def _masked(raw: bytes) -> str:
    text = raw.decode()
    text = re.sub(r'"id":( ?)"chatcmpl-[0-9a-f]+"', r'"id":\1"ID"', text)
    return re.sub(r'"created":( ?)\d+', r'"created":\g<1>0', text)


def test_without_the_flag_the_wire_is_unchanged(no_parser):
    """Byte for byte what the server sent before --reasoning-parser existed: the think block
    is content, and no chunk or message has a new key."""
    base, front = no_parser
    text = "<think>\nhm</think>\n\nHi"
    front.answer(text, text)
    body = {"messages": [{"role": "user", "content": "Hi?"}]}
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30)
    assert _masked(r.content) == (
        '{"id":"ID","object":"chat.completion","created":0,"model":"scripted","choices":[{'
        '"index":0,"finish_reason":"stop","stop_reason":null,"logprobs":null,"message":{'
        '"role":"assistant","content":"<think>\\nhm</think>\\n\\nHi"}}],"usage":{'
        '"prompt_tokens":20,"completion_tokens":22,"total_tokens":42,'
        '"prompt_tokens_details":{"cached_tokens":0}}}'
    )
    r = httpx.post(f"{base}/v1/chat/completions", json={**body, "stream": True}, timeout=30)
    head = 'data: {"id": "ID", "object": "chat.completion.chunk", "created": 0, "model": "scripted"'

    def event(choice: str) -> str:
        return f'{head}, "choices": [{{"index": 0, {choice}}}]}}\n\n'

    start = '"finish_reason": null, "logprobs": null, '
    expected = event(start + '"delta": {"content": "", "role": "assistant"}')
    for c in text:
        expected += event(start + f'"delta": {{"content": {json.dumps(c)}}}')
    expected += event('"finish_reason": "stop", "logprobs": null, "stop_reason": null, "delta": {}')
    assert _masked(r.content) == expected + "data: [DONE]\n\n"


def test_an_unknown_parser_is_refused_at_build(tokenizer):
    with pytest.raises(ValueError, match="deepseek-r1"):
        build_app(ScriptedFront(tokenizer), "scripted", reasoning_parser="granite")
