"""When a sampled token ends its request: stop tokens, stop strings, max_tokens, the context.

Invariant: ``accept`` is the one place a sampled token enters ``output_ids`` (plain and
speculative steps alike), so every stop condition acts on it the same way. A stop token is not
kept; a stop string cuts ``text`` before it (after it with ``include_stop_str_in_output``);
``max_tokens`` and the context length end the request with ``"length"``. Before
``min_tokens`` tokens only the context length ends it (vLLM's rule). Stop strings are
searched incrementally: each token decodes once, and only the new tail of the text is searched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nanograph.engine.request import Request

if TYPE_CHECKING:
    from nanograph.loader.tokenizer import IncrementalDecoder, Tokenizer


class StopChecker:
    def __init__(
        self, eos_token_ids: set[int], tokenizer: Tokenizer | None, max_model_len: int
    ) -> None:
        self.eos_token_ids = eos_token_ids
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self._decoders: dict[int, IncrementalDecoder] = {}  # stop-string requests only

    def accept(self, request: Request, index: int, token: int) -> str | None:
        """Puts a sampled token at ``output_ids[index]``; returns a finish reason when the
        request is done ("stop-token": the token is a stop token and is not kept).
        ``request.stop_reason`` becomes the request's own stop token or the stop string it
        met (vLLM's: None for EOS)."""
        params = request.params
        # before min_tokens nothing stops it but the context (end tokens are masked from its
        # logits: engine/penalties.py), as vLLM's
        stoppable = index + 1 >= params.min_tokens
        if stoppable and token in self.eos_token_ids and not params.ignore_eos:
            return "stop-token"
        if stoppable and token in params.stop_token_ids:
            request.stop_reason = token
            return "stop-token"
        request.output_ids[index] = token
        seen = self._decode(request, token)
        if stoppable and seen is not None:
            hits = [
                (i, stop) for stop in params.stop
                if (i := request.text.find(stop, max(0, seen - len(stop) + 1))) >= 0
            ]  # fmt: skip
            if hits:
                cut, request.stop_reason = min(hits, key=lambda hit: hit[0])
                if params.include_stop_str_in_output:
                    cut += len(request.stop_reason)
                request.text = request.text[:cut]
                return "stop"
        if (
            index + 1 >= params.max_tokens
            or len(request.prompt_ids) + index + 1 >= self.max_model_len
        ):
            return "length"
        return None

    def _decode(self, request: Request, token: int) -> int | None:
        """Appends ``token``'s text to a request with stop strings; returns the text's length
        before it (None: the request's text is not followed here)."""
        if not request.params.stop or self.tokenizer is None:
            return None
        decoder = self._decoders.get(request.request_id)
        if decoder is None:
            decoder = self._decoders[request.request_id] = self.tokenizer.decode_stream()
        seen = len(request.text)
        request.text += decoder.step(token)
        return seen

    def release(self, request_id: int) -> None:
        """Forgets a finished request's text decoder."""
        self._decoders.pop(request_id, None)


__all__ = ["StopChecker"]
