"""Tool calls in a chat answer's text, in the Hermes format that Qwen2.5, Qwen3 and Hermes models
answer in: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, any number of
blocks, with text before, between or after them.

Invariants:
- One incremental parser serves the whole and the streamed answer: ``feed`` the text as it
  comes, ``finish`` at the end. What it returns does not depend on how the text was split, so
  the streamed content deltas and calls equal the whole answer's.
- Content never carries a call's markup: text that could still become ``<tool_call>`` is held
  back, and so is an open block until its ``</tool_call>``.
- A block whose body is not a JSON object with a non-empty ``name`` string stays text, and so
  does a block still open at the end (a length cut, a stop string): vLLM's choice. Parsing
  never raises.
- Content that is whitespace only so far is held back; at the end it is given only when no
  call was parsed, so an answer of calls alone has no content (``null``, as vLLM's).
- The parser is pure (no ids, no I/O); ``openai_tool_call`` gives each call its
  ``call_<hex>`` id.
- ``tool_choice`` ``"required"`` or a named function needs no parser: the answer is
  constrained to the calls' JSON (a structured output; ``ForcedCalls``). A named function's
  answer is its arguments, streamed as they come (the call opens with the first text, then
  ``Parsed.arguments`` continue it), and stays a call even when cut short (vLLM's choice);
  each item of ``"required"``'s list is a call once its object closes.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

# --tool-call-parser values, all this one format: vLLM's name, SGLang's two, and qwen3 for Qwen3
# (which answers in it; SGLang's qwen3_coder is another, XML format, not read here)
TOOL_CALL_PARSERS = ("hermes", "qwen25", "qwen", "qwen3")
START, END = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it


@dataclass(frozen=True)
class Parsed:
    """What one ``feed`` or ``finish`` gives: new content, newly opened calls (whole, or the
    start of one whose arguments stream), and ``arguments`` continuing the last call opened
    (a parser that streams arguments opens one call, so a sum keeps them in order)."""

    content: str = ""
    calls: tuple[ToolCall, ...] = ()
    arguments: str = ""

    def __add__(self, other: Parsed) -> Parsed:
        return Parsed(self.content + other.content, self.calls + other.calls,
                      self.arguments + other.arguments)  # fmt: skip


class ToolCallParser:
    def __init__(self) -> None:
        self.calls: list[ToolCall] = []  # every call parsed so far
        self._undecided = ""  # a possible start of <tool_call>, or an open block
        self._blank = ""  # whitespace-only content held back (nothing but whitespace sent yet)
        self._sent_text = False

    def feed(self, text: str) -> Parsed:
        self._undecided += text
        content, calls = [], []
        while self._undecided:
            rest = self._undecided
            if rest.startswith(START):
                end = rest.find(END, len(START))
                if end < 0:
                    break  # the block is still open
                self._undecided = rest[end + len(END) :]
                call = _call(rest[len(START) : end])
                if call is None:
                    content.append(rest[: end + len(END)])
                else:
                    calls.append(call)
                continue
            start = rest.find(START)
            if start < 0:
                start = len(rest) - _start_prefix(rest)
                if start == 0:
                    break  # all of it may be the start of a block
            content.append(rest[:start])
            self._undecided = rest[start:]
        self.calls += calls
        return Parsed(self._content("".join(content)), tuple(calls))

    def finish(self) -> Parsed:
        """The rest once the answer ended: held-back text, and an unfinished block as text."""
        text = self._blank + self._undecided
        self._blank = self._undecided = ""
        return Parsed(text if text.strip() or not self.calls else "")

    def _content(self, text: str) -> str:
        if not self._sent_text and not (self._blank + text).strip():
            self._blank += text
            return ""
        text, self._blank, self._sent_text = self._blank + text, "", True
        return text


class ForcedCalls:
    """The answer to a ``tool_choice`` that forces calls, whose structured output is the calls
    themselves in JSON (``protocol.forced_tool_schema``). A named function's answer is its
    arguments object: the call opens with the first text and its arguments stream (a length
    cut leaves them cut, as vLLM's). ``"required"``'s is a list of ``{"name",
    "parameters"}``: each item is a call as soon as its object closes (a scan that skips
    strings finds it); a list cut before its first item closed stays text, and what follows
    the last whole item of a cut list is dropped. The same interface as
    ``ToolCallParser``."""

    def __init__(self, name: str | None) -> None:
        self.name = name  # the named function; None: "required"
        self.calls: list[ToolCall] = []  # opened so far (a streamed one: its first arguments)
        self._text = ""
        # "required"'s scan: where it is, the nesting there, inside a string or after its
        # backslash, and where the list's current item began
        self._at = self._depth = self._item = 0
        self._in_string = self._escaped = False

    def feed(self, text: str) -> Parsed:
        if self.name is None:
            self._text += text
            return Parsed(calls=self._closed_items())
        if not text:
            return Parsed()
        if self.calls:
            return Parsed(arguments=text)
        self.calls.append(ToolCall(self.name, text))  # opened; its arguments go on
        return Parsed(calls=(self.calls[0],))

    def _closed_items(self) -> tuple[ToolCall, ...]:
        calls, text = [], self._text
        for at in range(self._at, len(text)):
            c = text[at]
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == '"':
                    self._in_string = False
            elif c == '"':
                self._in_string = True
            elif c in "[{":
                self._depth += 1
                if self._depth == 2:
                    self._item = at
            elif c in "]}":
                if self._depth == 2 and c == "}":
                    call = _forced_item(text[self._item : at + 1])
                    if call is not None:
                        calls.append(call)
                self._depth -= 1
        self._at = len(text)
        self.calls += calls
        return tuple(calls)

    def finish(self) -> Parsed:
        if self.name is not None or self.calls:
            return Parsed()
        return Parsed(self._text)  # no item closed: not a call


def _forced_item(text: str) -> ToolCall | None:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    return _forced(value)


def _forced(value: dict) -> ToolCall:
    arguments = json.dumps(value.get("parameters", {}), ensure_ascii=False)
    return ToolCall(value["name"], arguments)


def _start_prefix(text: str) -> int:
    """Length of the longest end of ``text`` that ``<tool_call>`` starts with (0 if none)."""
    for k in range(min(len(START) - 1, len(text)), 0, -1):
        if text.endswith(START[:k]):
            return k
    return 0


def _call(body: str) -> ToolCall | None:
    """The call a block's body holds, or None when it is not one (it stays text)."""
    try:
        value = json.loads(body)
        if not isinstance(value, dict):
            return None
        name = value.get("name")
        # "parameters": what some Hermes-format models write instead (SGLang takes both)
        arguments = value.get("arguments", value.get("parameters", {}))
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False, allow_nan=False)
    except (ValueError, RecursionError):  # not JSON (or NaN), or nested beyond the parser
        return None
    if not isinstance(name, str) or not name:
        return None
    return ToolCall(name, arguments)


def openai_tool_call(call: ToolCall, index: int | None = None) -> dict:
    """OpenAI's object for ``call`` with a fresh id; ``index`` for a stream's delta."""
    body = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}  # fmt: skip
    return body if index is None else {"index": index, **body}
