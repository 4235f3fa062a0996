"""Tool calling: the Hermes-format parser alone (any split of the text gives the same answer),
then the chat server over real HTTP with a scripted front (the answer's text is given, token by
token through a byte-level tokenizer whose chat template prints the tools and the calls of past
turns), read with the official ``openai`` client, streamed and whole; and the refusals.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanograph.serve.tool_calls import END, START, ForcedCalls, ToolCall, ToolCallParser

WEATHER = '{"name": "weather", "arguments": {"city": "Paris"}}'
TIME = '{"name": "time", "arguments": {"zone": "CET", "exact": true}}'


def block(body: str) -> str:
    return f"{START}\n{body}\n{END}"


def parse(*pieces: str) -> tuple[str | None, list[ToolCall]]:
    """Content (None for calls alone, as the server answers) and calls of the text fed in
    ``pieces``."""
    parser = ToolCallParser()
    content, calls = "", []
    for piece in pieces:
        parsed = parser.feed(piece)
        content, calls = content + parsed.content, calls + list(parsed.calls)
    rest = parser.finish()
    content, calls = content + rest.content, calls + list(rest.calls)
    assert calls == parser.calls
    return (content or None) if calls else content, calls


def test_plain_text_is_content():
    assert parse("The capital of France is Paris.") == ("The capital of France is Paris.", [])
    assert parse("a < b and <tool> is not a call") == ("a < b and <tool> is not a call", [])
    assert parse("") == ("", [])
    assert parse("  \n") == ("  \n", [])  # no call: the text as it is


def test_one_call():
    assert parse(block(WEATHER)) == (None, [ToolCall("weather", '{"city": "Paris"}')])


def test_two_calls_and_whitespace_between():
    content, calls = parse(block(WEATHER) + "\n" + block(TIME) + "\n")
    assert content is None
    assert [c.name for c in calls] == ["weather", "time"]
    assert json.loads(calls[1].arguments) == {"zone": "CET", "exact": True}


def test_text_around_calls_is_content():
    content, calls = parse("Let me check.\n" + block(WEATHER) + "\nDone.")
    assert content == "Let me check.\n\nDone." and [c.name for c in calls] == ["weather"]


def test_a_block_that_is_no_call_stays_text():
    for body in ('{"name": "weather", "arguments": ', '{"arguments": {}}', '{"name": ""}',
                 '["weather"]', "weather(city=Paris)", '{"name": 3}', '{"name": "x", '
                 '"arguments": NaN}', "[" * 100_000):  # fmt: skip
        text = "Sure. " + block(body)
        assert parse(text) == (text, []), body
    # a bad block beside a good one: the good one is a call, the bad one text
    weather = ToolCall("weather", '{"city": "Paris"}')
    assert parse(block("nope") + block(WEATHER)) == (block("nope"), [weather])


def test_other_argument_forms():
    assert parse(block('{"name": "now"}'))[1] == [ToolCall("now", "{}")]
    assert parse(block('{"name": "w", "parameters": {"a": 1}}'))[1] == [ToolCall("w", '{"a": 1}')]
    # arguments already JSON text are passed on as they are
    assert parse(block('{"name": "w", "arguments": "{\\"a\\": 1}"}'))[1] == [
        ToolCall("w", '{"a": 1}')
    ]
    assert parse(block('{"name": "w", "arguments": {"s": "é"}}'))[1] == [
        ToolCall("w", '{"s": "é"}')
    ]


def test_an_unfinished_block_at_the_end_is_content():
    """A length cut inside a block: the text as the model wrote it, no call (vLLM's choice);
    the calls before it stay calls."""
    cut = START + '\n{"name": "weather", "argu'
    assert parse("Looking. " + cut) == ("Looking. " + cut, [])
    assert parse(block(WEATHER) + cut) == (cut, [ToolCall("weather", '{"city": "Paris"}')])
    assert parse("ends with <tool_c") == ("ends with <tool_c", [])


def test_held_back_text_is_what_may_start_a_block():
    parser = ToolCallParser()
    assert parser.feed("Hi <tool").content == "Hi "  # may start a block: held back
    assert parser.feed("s>").content == "<tools>"  # it did not
    assert parser.feed(START + WEATHER).content == ""  # an open block: held back
    assert parser.feed(END + " bye").calls == (ToolCall("weather", '{"city": "Paris"}'),)
    assert parser.finish().content == ""


TEXTS = [
    "Let me check.\n" + block(WEATHER) + "\n" + block(TIME) + "\nDone <tool",
    "\n\n" + block(WEATHER) + "\n",
    "<tool_call><tool_call>" + WEATHER + END + "x" + END,
    "<<tool_call>" + TIME + "</tool_call" + END + block("bad") + "é" + block(WEATHER),
    "  " + START + " " + END + START,
]


@pytest.mark.parametrize("text", TEXTS)
def test_every_split_gives_the_same_answer(text):
    whole = parse(text)
    assert parse(*text) == whole  # one character at a time
    for i in range(len(text) + 1):
        assert parse(text[:i], text[i:]) == whole, i


def forced(name: str | None, *pieces: str) -> tuple[str, list[tuple[str, str]], int]:
    """``ForcedCalls(name)`` fed ``pieces``: the content, the calls put together (a call's
    streamed arguments added to it), and how many deltas carried arguments."""
    reader, content, calls, deltas = ForcedCalls(name), "", [], 0
    for parsed in [*map(reader.feed, pieces), reader.finish()]:
        content += parsed.content
        calls += [[c.name, c.arguments] for c in parsed.calls]
        if parsed.arguments:
            calls[-1][1] += parsed.arguments
        deltas += bool(parsed.calls or parsed.arguments)
    return content, [tuple(c) for c in calls], deltas


def test_a_named_call_streams_its_arguments_and_a_required_list_each_item():
    args = '{"city": "Paris"}'
    assert forced("weather", *args) == ("", [("weather", args)], len(args))
    assert forced("weather", "", args[:3], args[3:]) == ("", [("weather", args)], 2)
    assert forced("weather", '{"ci') == ("", [("weather", '{"ci')], 1)  # cut: still a call
    assert forced("weather") == ("", [], 0)  # no answer at all: no call
    listed = '[{"name": "weather", "parameters": {"city": "Paris"}}]'
    assert forced(None, *listed) == ("", [("weather", '{"city": "Paris"}')], 1)
    assert forced(None, listed[:-2]) == (listed[:-2], [], 0)  # a cut list stays text
    tricky = {"city": 'P"}]{[ar\\is'}  # brackets, quotes and backslashes in a string
    two = json.dumps([{"name": "weather", "parameters": tricky}, {"name": "clock",
                                                                  "parameters": {}}])  # fmt: skip
    calls = [("weather", json.dumps(tricky)), ("clock", "{}")]
    assert forced(None, *two) == ("", calls, 2)  # a character at a time: a call as each closes
    assert forced(None, two) == ("", calls, 1)
    assert forced(None, two[:-8]) == ("", calls[:1], 1)  # cut in the second: the first call


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([None, "weather"]), st.integers(10, 90), st.data())
def test_forced_calls_do_not_depend_on_the_split(name, length, data):
    """Streamed (any split) equals whole, for a list cut anywhere or an arguments object."""
    text = json.dumps([{"name": "weather", "parameters": {"city": 'Pa"}r{is'}},
                       {"name": "clock", "parameters": {"at": [1, {"x": "]"}]}}])  # fmt: skip
    text = text[:length] if name is None else text[length // 3 :][:length]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    assert forced(name, *pieces)[:2] == forced(name, text)[:2]


FRAGMENTS = [START, END, WEATHER, TIME, "<", "tool", "_call>", "</", "\n", " ", "Hi", "{", "é"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=12), st.data())
def test_any_split_of_any_text_gives_the_same_answer(fragments, data):
    text = "".join(fragments)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    content, calls = parse(*pieces)
    assert (content, calls) == parse(text)
    if not calls:  # no call: the text, unchanged
        assert content == text
    else:  # each call took one of the JSON bodies; the others are still in the content
        bodies = lambda t: t.count(WEATHER) + t.count(TIME)  # noqa: E731
        assert bodies(content or "") == bodies(text) - len(calls)


# --- the server, over HTTP, with a scripted front ---------------------------------------------

fastapi = pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
from serving import ScriptedFront, byte_tokenizer, scripted_server  # noqa: E402

from nanograph.serve.app import build_app  # noqa: E402

TOOL = {"type": "function", "function": {"name": "weather", "description": "the weather now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}  # fmt: skip
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def hermes(tokenizer):
    """A server started with --tool-call-parser hermes, and its scripted front."""
    with scripted_server(tokenizer, tool_call_parser="hermes") as served:
        yield served


@pytest.fixture(scope="module")
def no_parser(tokenizer):
    with scripted_server(tokenizer) as served:
        yield served


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=30)


def ask(base: str, **kwargs):
    return client(base).chat.completions.create(
        model="scripted", messages=kwargs.pop("messages", QUESTION), **kwargs
    )


def streamed(base: str, **kwargs) -> dict[int, dict]:
    """Each choice's streamed answer put together: content, tool calls, finish reason."""
    choices: dict[int, dict] = {}
    for chunk in ask(base, stream=True, **kwargs):
        for c in chunk.choices:
            got = choices.setdefault(
                c.index,
                {
                    "content": "",
                    "tool_calls": [],
                    "finish": None,
                    "chunks": [],
                    "seen": 0,
                    "opened_at": [],
                },
            )  # chunks: each call's, the opening one included; opened_at: the chunk it opened in
            got["seen"] += 1
            got["content"] += c.delta.content or ""
            for call in c.delta.tool_calls or []:
                if call.id is None:  # OpenAI's continuation: more arguments of that call
                    assert call.function.name is None and got["tool_calls"]
                    assert call.index == len(got["tool_calls"]) - 1
                    got["tool_calls"][-1].function.arguments += call.function.arguments
                    got["chunks"][-1] += 1
                else:  # a call opens, in order, with its name
                    assert call.index == len(got["tool_calls"]) and call.function.name
                    got["tool_calls"].append(call)
                    got["chunks"].append(1)
                    got["opened_at"].append(got["seen"])
            got["finish"] = c.finish_reason or got["finish"]
    return choices


ANSWER = "Let me look.\n" + block(WEATHER) + "\n" + block(TIME)


def test_whole_answer_has_tool_calls(hermes):
    base, front = hermes
    front.answer(ANSWER)
    choice = ask(base, tools=[TOOL]).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me look.\n\n"
    first, second = choice.message.tool_calls
    assert first.type == "function" and first.id.startswith("call_") and first.id != second.id
    assert first.function.name == "weather" and json.loads(first.function.arguments) == {
        "city": "Paris"
    }
    assert second.function.name == "time"


def test_streamed_answer_equals_the_whole(hermes):
    base, front = hermes
    for text in (ANSWER, block(WEATHER), "No tools needed: " + START[:-1]):
        front.answer(text, text)
        whole = ask(base, tools=[TOOL], tool_choice="auto").choices[0]
        got = streamed(base, tools=[TOOL], tool_choice="auto")[0]
        assert got["content"] == (whole.message.content or "")
        assert [(c.function.name, c.function.arguments) for c in got["tool_calls"]] == [
            (c.function.name, c.function.arguments) for c in whole.message.tool_calls or []
        ]
        assert got["finish"] == whole.finish_reason
        assert all(c.id.startswith("call_") and c.type == "function" for c in got["tool_calls"])
    assert whole.finish_reason == "stop" and whole.message.content == text  # the last: no call


def test_each_choice_parses_on_its_own(hermes):
    base, front = hermes
    plain = "It is sunny."
    front.answer(block(WEATHER), plain)
    whole = ask(base, tools=[TOOL], n=2).choices
    assert [c.finish_reason for c in whole] == ["tool_calls", "stop"]
    assert whole[0].message.content is None and whole[1].message.content == plain
    assert whole[1].message.tool_calls is None
    front.answer(block(WEATHER), plain)
    got = streamed(base, tools=[TOOL], n=2)
    assert [got[i]["finish"] for i in (0, 1)] == ["tool_calls", "stop"]
    assert [len(got[i]["tool_calls"]) for i in (0, 1)] == [1, 0]
    assert got[1]["content"] == plain


def test_a_length_cut_is_no_tool_call_finish(hermes):
    """A call cut by max_tokens stays text; a call finished before the cut is a call, but the
    finish reason stays "length"."""
    base, front = hermes
    cut = block(WEATHER)[:-3]
    front.answer(cut, block(WEATHER) + cut, finish_reason="length")
    first, second = ask(base, tools=[TOOL], n=2).choices
    assert (first.finish_reason, first.message.content, first.message.tool_calls) == (
        "length", cut, None
    )  # fmt: skip
    assert second.finish_reason == "length" and second.message.content == cut
    assert [c.function.name for c in second.message.tool_calls] == ["weather"]


def test_tool_choice_none_answers_text_without_the_tools(hermes):
    base, front = hermes
    front.answer(block(WEATHER), block(WEATHER))
    plain = ask(base).usage.prompt_tokens
    none = ask(base, tools=[TOOL], tool_choice="none")
    assert none.choices[0].message.content == block(WEATHER)  # not read for calls
    assert none.choices[0].finish_reason == "stop" and none.usage.prompt_tokens == plain


def test_the_chat_template_gets_the_tools(hermes, tokenizer):
    base, front = hermes
    post = lambda body: httpx.post(f"{base}/tokenize", json=body, timeout=30).json()  # noqa: E731
    without = post({"messages": QUESTION})["tokens"]
    with_tools = post({"messages": QUESTION, "tools": [TOOL]})["tokens"]
    assert tokenizer.decode(with_tools) == f"[tools {json.dumps([TOOL])}]" + tokenizer.decode(
        without
    )
    front.answer("Sunny.")
    assert ask(base, tools=[TOOL]).usage.prompt_tokens == len(with_tools)
    assert front.prompts[-1] == with_tools


def test_past_tool_calls_render_with_their_arguments_as_objects(hermes, tokenizer):
    """An assistant turn with tool_calls (arguments as JSON text, content null) and the tool's
    answer render through the template; the arguments reach it as an object."""
    base, front = hermes
    history = QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1",
         "content": [{"type": "text", "text": "sunny"}, {"type": "text", "text": "20 C"}]},
    ]  # fmt: skip
    r = httpx.post(f"{base}/tokenize", json={"messages": history}, timeout=30)
    assert tokenizer.decode(r.json()["tokens"]) == (
        '<user>Weather in Paris?<assistant><call weather {"city": "Paris"}>'
        "<tool>sunny\n20 C<assistant>"
    )
    front.answer("It is sunny in Paris.")
    answer = ask(base, messages=history, tools=[TOOL]).choices[0]
    assert answer.message.content == "It is sunny in Paris." and answer.finish_reason == "stop"


BAD_CALL = {"id": "c", "type": "function", "function": {"name": "weather", "arguments": "{city"}}
BAD_ARGUMENTS = QUESTION + [{"role": "assistant", "content": None, "tool_calls": [BAD_CALL]}]

NAMED = {"type": "function", "function": {"name": "weather"}}
CLOCK = {"type": "function", "function": {"name": "clock"}}  # no parameters: any object


@pytest.mark.parametrize("server", ["hermes", "no_parser"])
def test_a_named_tool_choice_constrains_the_answer_to_its_arguments(request, server):
    """vLLM's named tool_choice: no parser needed; the answer is a structured output of the
    function's parameters schema (the engine holds it to it: engine/structured.py), and comes
    back as that function's call, whole and streamed (its arguments as they come, after a
    first chunk with the name); a length cut leaves the call with its arguments cut."""
    base, front = request.getfixturevalue(server)
    front.answer('{"city": "Paris"}', '{"city": "Paris"}')
    choice = ask(base, tools=[TOOL, CLOCK], tool_choice=NAMED).choices[0]
    asked = front.params[-1].structured_outputs
    assert json.loads(asked.json) == TOOL["function"]["parameters"]
    assert choice.message.content is None and choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("weather", '{"city": "Paris"}')
    got = streamed(base, tools=[TOOL, CLOCK], tool_choice=NAMED)[0]
    assert got["content"] == "" and got["finish"] == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in got["tool_calls"]] == [
        ("weather", '{"city": "Paris"}')
    ]
    assert got["chunks"][0] > 1  # the arguments came in pieces (a token a byte here)
    assert front.prompts[-1] == front.prompts[-2]  # the template saw the tools both times
    front.answer('{"city": "Pa', '{"city": "Pa', finish_reason="length")
    cut = ask(base, tools=[TOOL], tool_choice=NAMED).choices[0]
    assert cut.finish_reason == "length" and cut.message.content is None
    assert cut.message.tool_calls[0].function.arguments == '{"city": "Pa'
    got = streamed(base, tools=[TOOL], tool_choice=NAMED)[0]
    assert got["finish"] == "length" and got["content"] == ""
    assert [c.function.arguments for c in got["tool_calls"]] == ['{"city": "Pa']


def test_required_tool_choice_gives_one_call_or_more(hermes):
    """tool_choice "required": the answer is a JSON list of {"name", "parameters"} of the
    tools (at least one), each a call, streamed as its object closes; a list cut before its
    first item closed leaves text and no call."""
    base, front = hermes
    calls = [{"name": "weather", "parameters": {"city": "Paris"}}, {"name": "clock",
                                                                   "parameters": {}}]  # fmt: skip
    front.answer(json.dumps(calls))
    choice = ask(base, tools=[TOOL, CLOCK], tool_choice="required").choices[0]
    schema = json.loads(front.params[-1].structured_outputs.json)
    assert schema["type"] == "array" and schema["minItems"] == 1
    assert [c["properties"]["name"] for c in schema["items"]["anyOf"]] == [
        {"enum": ["weather"]},
        {"enum": ["clock"]},
    ]
    got = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
    assert got == [("weather", {"city": "Paris"}), ("clock", {})]
    front.answer(json.dumps(calls))
    stream = streamed(base, tools=[TOOL, CLOCK], tool_choice="required")[0]
    assert [(c.function.name, json.loads(c.function.arguments))
            for c in stream["tool_calls"]] == got  # fmt: skip
    first, second = stream["opened_at"]
    assert first < second  # the first call came as soon as its object closed
    front.answer('[{"name": "weather", "param', finish_reason="length")
    cut = ask(base, tools=[TOOL], tool_choice="required").choices[0]
    assert cut.message.tool_calls is None and cut.finish_reason == "length"
    assert cut.message.content == '[{"name": "weather", "param'


REFUSED = [  # (server, body, param, words in the message)
    ("no_parser", {"tools": [TOOL]}, "tools", "--tool-call-parser hermes"),
    ("no_parser", {"tools": [TOOL], "tool_choice": "auto"}, "tools", "--tool-call-parser"),
    ("hermes", {"tools": [{"name": "weather"}]}, "tools", "tools[0]"),
    ("hermes", {"tools": [TOOL, {"type": "function", "function": {}}]}, "tools", "tools[1]"),
    ("hermes", {"tools": [{"type": "code", "function": TOOL["function"]}]}, "tools", "tools[0]"),
    ("hermes", {"tools": [{"type": "function", "function": {"name": "w", "parameters": 3}}]},
     "tools", "parameters"),
    ("hermes", {"tool_choice": "required"}, "tools", "needs tools"),
    ("no_parser", {"tools": [{"name": "weather"}], "tool_choice": "required"}, "tools",
     "tools[0]"),
    ("hermes", {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "x"}}},
     "tool_choice", "not among the tools"),
    ("hermes", {"tools": [TOOL], "tool_choice": {"type": "function"}}, "tool_choice", "named"),
    ("hermes", {"tools": [TOOL], "tool_choice": "required",
                "response_format": {"type": "json_object"}}, "tool_choice", "give one"),
    ("hermes", {"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice", "auto"),
    ("hermes", {"functions": [TOOL["function"]]}, "functions", "tools instead"),
    ("hermes", {"messages": BAD_ARGUMENTS}, "messages[1].tool_calls", "not valid JSON"),
    ("hermes", {"messages": QUESTION + [{"role": "assistant", "tool_calls": [{"id": "c"}]}]},
     "messages[1].tool_calls", "name"),
]  # fmt: skip


@pytest.mark.parametrize("server,body,param,words", REFUSED)
def test_refusals_name_their_param(request, server, body, param, words):
    base, front = request.getfixturevalue(server)
    body = {"messages": QUESTION, **body}
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_tools_with_choice_none_or_no_tools_need_no_parser(no_parser):
    base, front = no_parser
    front.answer("Hi.", "Hi.")
    assert ask(base, tools=[TOOL], tool_choice="none").choices[0].message.content == "Hi."
    assert ask(base, tool_choice="auto").choices[0].message.content == "Hi."


def test_an_unknown_parser_is_refused_at_build(tokenizer):
    with pytest.raises(ValueError, match="hermes"):
        build_app(ScriptedFront(tokenizer), "scripted", tool_call_parser="mistral")
