"""Streamed text of one request: token ids in, text deltas out.

Invariants:
- Detokenisation is incremental (``Tokenizer.decode_stream``): a UTF-8 character split across
  tokens comes out whole, once its last byte arrived.
- No stop string ever streams out: text that could be the start of a stop string is held back
  until the next tokens show it is not one. The engine cuts its own text at the first stop
  string; everything sent before is a prefix of that (what was sent never ended inside a
  possible stop string, and never contained one, or the engine would have stopped there).
- The concatenated deltas equal ``final``'s text: the engine's (cut at a stop string) when it
  kept one, else the decoded text of all tokens. Streamed and non-streamed answers are equal.
"""

from __future__ import annotations

from typing import Any


class TextStream:
    def __init__(self, tokenizer: Any, stop: tuple[str, ...] = ()) -> None:
        self._decoder = tokenizer.decode_stream() if tokenizer is not None else None
        self._stop = stop
        self.text = ""  # decoded so far
        self._sent = 0  # characters of ``text`` already handed out

    def feed(self, token_ids: list[int]) -> str:
        """The text that may be sent now that ``token_ids`` were generated."""
        if self._decoder is None:
            return ""
        self.text += "".join(self._decoder.step(t) for t in token_ids)
        safe = len(self.text) - self._held_back()
        delta = self.text[self._sent : safe]
        self._sent = max(self._sent, safe)
        return delta

    def final(self, token_ids: list[int], engine_text: str | None) -> str:
        """The rest of the text once the request finished (``engine_text``: the engine's text,
        when it tracked one for stop strings)."""
        if self._decoder is not None:
            self.text += "".join(self._decoder.step(t) for t in token_ids)
        if engine_text is not None:
            self.text = engine_text
        delta = self.text[self._sent :]
        self._sent = len(self.text)
        return delta

    def _held_back(self) -> int:
        """Length of the longest end of ``text`` that a stop string starts with."""
        longest = 0
        for stop in self._stop:
            for k in range(min(len(stop) - 1, len(self.text)), longest, -1):
                if self.text.endswith(stop[:k]):
                    longest = k
                    break
        return longest
