"""OpenAI's ``logprobs`` objects from the engine's per-token log-probabilities.

Chat completions: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
"logprob", "bytes"}, ...]}, ...]}``. Legacy completions: ``{"tokens", "token_logprobs",
"top_logprobs": [{token: logprob}, ...], "text_offset"}``. A streamed answer carries, in each
chunk, the objects of the tokens that chunk brings; a chunk that is held back (text that could
start a stop string, half a UTF-8 character) hands its tokens to the next one sent.

The prompt's tokens (scored by the engine: ``SamplingParams.prompt_logprobs``) come as
completions' ``echo`` with ``logprobs`` wants them, the first token's entries null (OpenAI's
shape, what lm-evaluation-harness reads), or as vLLM's ``prompt_logprobs`` list: None for the
first token, then ``{"<id>": {"logprob", "rank", "decoded_token"}}`` for the token and its top
alternatives.

A token's text is its decoding alone (``tokenizer.decode([id])``), as vLLM gives it: a token
holding part of a UTF-8 character reads as U+FFFD, and ``bytes`` are that text's UTF-8. Without
a tokenizer a token reads ``token_id:<id>`` (vLLM's ``return_tokens_as_token_ids`` form).
"""

from __future__ import annotations

from typing import Any

from nanograph.engine.logprobs import TokenLogprob


class LogprobFormat:
    def __init__(self, tokenizer: Any, chat: bool, count: int) -> None:
        self.tokenizer, self.chat, self.count = tokenizer, chat, count
        self._text: dict[int, str] = {}
        self.offset = 0  # completions: characters of the answer before the next token

    def token(self, token_id: int) -> str:
        text = self._text.get(token_id)
        if text is None:
            text = (
                f"token_id:{token_id}" if self.tokenizer is None
                else self.tokenizer.decode([token_id])
            )  # fmt: skip
            self._text[token_id] = text
        return text

    def __call__(self, token_ids: list[int], logprobs: list[TokenLogprob]) -> dict:
        """The logprobs object of these tokens (consecutive, in the answer's order)."""
        return (
            self._chat(token_ids, logprobs) if self.chat else self._completion(token_ids, logprobs)
        )

    def _entry(self, token_id: int, logprob: float) -> dict:
        text = self.token(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    def _chat(self, token_ids: list[int], logprobs: list[TokenLogprob]) -> dict:
        content = []
        for token_id, lp in zip(token_ids, logprobs):
            entry = self._entry(token_id, lp.logprob)
            entry["top_logprobs"] = [self._entry(t, v) for t, v in lp.top[: self.count]]
            content.append(entry)
        return {"content": content}

    def _completion(self, token_ids: list[int], logprobs: list[TokenLogprob | None]) -> dict:
        tokens, offsets = [], []
        for token_id in token_ids:
            tokens.append(self.token(token_id))
            offsets.append(self.offset)
            self.offset += len(tokens[-1])
        return {
            "tokens": tokens,
            "token_logprobs": [None if lp is None else lp.logprob for lp in logprobs],
            "top_logprobs": [
                None if lp is None else {self.token(t): v for t, v in lp.top[: self.count]}
                for lp in logprobs
            ],
            "text_offset": offsets,
        }

    def echoed(self, prompt_ids: list[int], scores: list[TokenLogprob]) -> dict:
        """Completions' logprobs object of an echoed prompt (call before the answer's: the
        answer's text offsets follow the prompt's)."""
        return self._completion(prompt_ids, [None, *scores])

    def prompt_list(self, prompt_ids: list[int], scores: list[TokenLogprob]) -> list:
        """vLLM's ``prompt_logprobs``: the token and its ``count`` alternatives per prompt
        token after the first."""
        out: list[dict | None] = [None]
        for token_id, lp in zip(prompt_ids[1:], scores):
            entry = {str(token_id): self._ranked(token_id, lp.logprob, lp.rank)}
            for rank, (t, v) in enumerate(lp.top[: self.count], start=1):
                entry.setdefault(str(t), self._ranked(t, v, rank))
            out.append(entry)
        return out

    def _ranked(self, token_id: int, logprob: float, rank: int) -> dict:
        return {"logprob": logprob, "rank": rank, "decoded_token": self.token(token_id)}


def merge(first: dict | None, second: dict | None) -> dict | None:
    """Two completions logprobs objects of consecutive tokens as one."""
    if first is None or second is None:
        return first or second
    return {key: first[key] + second[key] for key in first}
