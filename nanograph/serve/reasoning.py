"""Reasoning in a chat answer's text: the thinking that Qwen3, QwQ and DeepSeek-R1 write
between ``<think>`` and ``</think>`` before the answer, split from the content as vLLM's and
SGLang's ``--reasoning-parser`` do (``message.reasoning``, vLLM's name, and
``message.reasoning_content``, SGLang's; streamed ``delta.reasoning`` and
``delta.reasoning_content``).

The rules, one per parser (the same for the whole and the streamed answer):
- ``qwen3``: the answer opens a think block when it starts with ``<think>`` (after optional
  whitespace); the block is reasoning until ``</think>``, or to the end when none comes (a
  length cut). An answer that does not start with ``<think>`` is all content, tags included:
  Qwen3 with ``enable_thinking: false`` writes no block. This is vLLM's streaming rule (text
  after a ``<think>`` start is reasoning, text without one is content), made the whole
  answer's too. vLLM's whole answer has differed where a stream cannot know early: v0.9 read
  a ``<think>`` with no ``</think>`` as content; recent versions read the text before a
  ``</think>`` as reasoning without a ``<think>``, and (unless ``enable_thinking`` is false)
  an answer with no ``</think>`` as all reasoning, since Qwen3.5's template opens ``<think>``
  in the prompt. Templates that do are ``deepseek-r1``'s.
- ``deepseek-r1`` (also ``deepseek_r1``, vLLM's spelling, and SGLang's ``qwen3-thinking``):
  the template opens ``<think>`` in the prompt, so the answer starts in reasoning (a
  ``<think>`` it writes itself is dropped) until ``</think>``; with no ``</think>`` all of
  it is reasoning, as in vLLM and SGLang. For DeepSeek-R1, QwQ and Qwen3-Thinking-2507.
  A request that turns thinking off (``chat_template_kwargs`` ``enable_thinking``, Qwen's
  switch, or ``thinking``, DeepSeek-V3.1's, false) gets ``qwen3``'s rule instead: its template
  opened no block, so an answer is content unless it opens one itself (vLLM's ``deepseek_v3``
  and TensorRT-LLM read such answers so; vLLM's ``deepseek_r1`` gives them all as reasoning).
- Only the first ``</think>`` ends reasoning; later tags are content, as text.
- The newlines right after ``</think>`` are dropped: the models write ``</think>\\n\\n``
  before the answer, and Qwen3's template strips them when it reads an answer back. vLLM and
  SGLang keep them. Reasoning is given as written.

Invariants:
- One incremental parser serves the whole and the streamed answer: ``feed`` the text as it
  comes, ``finish`` at the end. What it returns does not depend on how the text was split.
- Text that could still be the start of a tag it looks for is held back: at the start of an
  answer whitespace and a prefix of ``<think>``, inside reasoning a prefix of ``</think>``.
  ``finish`` gives it to the side it was on.
- The parser is pure (text in, text out, no I/O); ``feed`` and ``finish`` never raise.
"""

from __future__ import annotations

from dataclasses import dataclass

START, END = "<think>", "</think>"
# --reasoning-parser values -> whether the answer starts inside the think block (its <think>
# is in the prompt): vLLM's and SGLang's names
REASONING_PARSERS = {"qwen3": False, "deepseek-r1": True, "deepseek_r1": True,
                     "qwen3-thinking": True}  # fmt: skip

_OPENING, _REASONING, _CONTENT = "opening", "reasoning", "content"


@dataclass(frozen=True)
class Split:
    """What one ``feed`` or ``finish`` gives: new reasoning and new content."""

    reasoning: str = ""
    content: str = ""

    def __add__(self, other: Split) -> Split:
        return Split(self.reasoning + other.reasoning, self.content + other.content)


def thinking_on(template_kwargs: dict | None) -> bool:
    """False when a request's chat template arguments turn thinking off."""
    kwargs = template_kwargs or {}
    return kwargs.get("enable_thinking", True) is not False and kwargs.get("thinking") is not False


class ReasoningParser:
    def __init__(self, name: str, thinking: bool = True) -> None:
        """``thinking``: False when the request turned it off (``thinking_on``)."""
        if name not in REASONING_PARSERS:
            raise ValueError(
                f"unknown reasoning parser {name!r}: one of {', '.join(REASONING_PARSERS)}"
            )
        self._starts_in_reasoning = REASONING_PARSERS[name] and thinking
        self._state = _OPENING  # until the answer shows whether it opens with <think>
        self._undecided = ""  # held back: the opening so far, or a possible start of </think>
        self._dropping_newlines = False  # right after </think>: newlines are dropped

    def feed(self, text: str) -> Split:
        self._undecided += text
        reasoning = content = ""
        if self._state == _OPENING:
            rest = self._undecided.lstrip()
            if START.startswith(rest) and rest != START:
                return Split()  # whitespace or a prefix of <think>: the opening is undecided
            if rest.startswith(START):
                self._undecided = rest[len(START) :]
                self._state = _REASONING
            else:  # no <think> at the start: qwen3's answer is content, DeepSeek's reasoning
                self._state = _REASONING if self._starts_in_reasoning else _CONTENT
        if self._state == _REASONING:
            end = self._undecided.find(END)
            if end < 0:
                keep = _end_prefix(self._undecided)
                cut = len(self._undecided) - keep
                reasoning, self._undecided = self._undecided[:cut], self._undecided[cut:]
                return Split(reasoning)
            reasoning = self._undecided[:end]
            self._undecided = self._undecided[end + len(END) :]
            self._state, self._dropping_newlines = _CONTENT, True
        content, self._undecided = self._undecided, ""
        if self._dropping_newlines:
            content = content.lstrip("\n")
            self._dropping_newlines = not content
        return Split(reasoning, content)

    def finish(self) -> Split:
        """The rest once the answer ended: held-back text, to the side it was on (an opening
        still undecided is whitespace or a part of ``<think>``: qwen3's content, DeepSeek's
        reasoning)."""
        text, self._undecided = self._undecided, ""
        if self._state == _REASONING or (self._state == _OPENING and self._starts_in_reasoning):
            return Split(text)
        return Split(content=text)


def _end_prefix(text: str) -> int:
    """Length of the longest end of ``text`` that ``</think>`` starts with (0 if none)."""
    for k in range(min(len(END) - 1, len(text)), 0, -1):
        if text.endswith(END[:k]):
            return k
    return 0
