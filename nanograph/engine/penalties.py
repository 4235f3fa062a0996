"""Repetition, frequency and presence penalties (OpenAI's ``presence_penalty`` and
``frequency_penalty``, vLLM's and transformers' ``repetition_penalty``) and OpenAI's
``logit_bias``, and vLLM's ``allowed_token_ids``, ``bad_words`` and ``min_tokens``, on the
device.

What they do to a row's logits before sampling, in vLLM's order: a token seen in the prompt or
the output so far is divided by ``repetition_penalty`` where its logit is positive and
multiplied by it where negative; then ``frequency_penalty`` x (times the token was generated)
and ``presence_penalty`` x (whether it was generated) are subtracted; then each biased token
gets its bias added; then every token outside ``allowed_token_ids`` becomes -inf, so does
the last token of a bad word whose other tokens the output ends with, and while fewer than
``min_tokens`` tokens are out, so do the end tokens (EOS unless ``ignore_eos``, and
``stop_token_ids``). Greedy rows take the argmax of the result; logprobs stay the model's raw
ones.

Bad words are vLLM's: each word's tokens as written (leading whitespace stripped) and, where
they differ in the first token only, after a space (the word in mid-text); only output tokens
are matched, not the prompt.

Invariants:
- Only requests with a penalty have state: one row each of a ``[slots, vocab]`` count buffer
  and a ``[slots, vocab]`` seen mask on the device, grown by doubling, filled from the prompt
  when the request is first sampled, updated by the sampled tokens in stream order (a gather
  before sampling and one accumulate after, for the whole batch). Tokens still on the device
  under the overlap schedule are counted before the next step reads them: no host round trip.
- A request keeps its row until it finishes (``release``): preemption and recompute do not
  resample its earlier tokens, so its counts stay right.
- A bias needs no state: its (row, token, bias) triples are added in one accumulate. Nor do
  ``allowed_token_ids`` (a row at a time: rare) and ``min_tokens``: the token being sampled is
  ``output_ids[len(output_ids)]`` (tokens in flight hold places there), so the host knows
  which rows to mask without reading the device. Nor do bad words: the host matches every
  token of a word's prefix it has read; only the last output token may still be on the device
  (in the step in flight), and that one comparison is made there, in the mask's values.
- A step with no request that adjusts its logits does nothing here.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from nanograph.engine.request import UNRESOLVED

if TYPE_CHECKING:
    from nanograph.engine.request import Request
    from nanograph.loader.tokenizer import Tokenizer

FIRST_SLOTS = 8


class Penalties:
    def __init__(self, device: torch.device, eos_token_ids: set[int]) -> None:
        self.device = device
        self.eos_token_ids = tuple(sorted(eos_token_ids))
        self.counts: torch.Tensor | None = None  # [slots, vocab] float32: output token counts
        self.seen: torch.Tensor | None = None  # [slots, vocab] bool: prompt or output tokens
        self._slot: dict[int, int] = {}  # request id -> row
        self._free: list[int] = []
        # live requests that penalise or bias: with none (nearly always), a step costs nothing
        # here, not a scan of its rows
        self._live: set[int] = set()

    @property
    def live(self) -> bool:
        """Whether a live request adjusts its logits (else ``apply`` returns them as they are)."""
        return bool(self._live)

    def admit(self, request: Request) -> None:
        if request.params.adjusts_logits:
            self._live.add(request.request_id)

    def apply(
        self, logits: torch.Tensor, requests: list[Request],
        in_flight: tuple[torch.Tensor, list[int | None]] | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """The logits each request samples from (``logits`` itself where none is penalised or
        biased; else a new tensor). Row i belongs to ``requests[i]``. ``in_flight``: the
        tokens of the step in flight and, per request, the row of its last output token there
        (None when the host has read it)."""
        if not self._live or not any(r.params.adjusts_logits for r in requests):
            return logits
        out = logits.clone()
        self._penalize(out, requests)
        bias = [(i, token, value) for i, r in enumerate(requests)
                for token, value in r.params.logit_bias]  # fmt: skip
        if bias:
            rows, tokens, values = zip(*bias)
            index = (torch.tensor(rows, device=out.device), torch.tensor(tokens, device=out.device))
            out.index_put_(index, torch.tensor(values, device=out.device), accumulate=True)
        for i, r in enumerate(requests):  # rare: a row at a time
            if r.params.allowed_token_ids is not None:
                keep = torch.tensor(r.params.allowed_token_ids, device=out.device)
                row = torch.full_like(out[i], -math.inf)
                row[keep] = out[i, keep]
                out[i] = row
        self._ban_words(out, requests, in_flight)
        ends = [(i, token) for i, r in enumerate(requests)
                if len(r.output_ids) < r.params.min_tokens
                for token in self._end_tokens(r)]  # fmt: skip
        if ends:
            rows, tokens = zip(*ends)
            index = (torch.tensor(rows, device=out.device), torch.tensor(tokens, device=out.device))
            out.index_put_(index, torch.tensor(-math.inf, device=out.device))
        return out

    def _ban_words(
        self, logits: torch.Tensor, requests: list[Request],
        in_flight: tuple[torch.Tensor, list[int | None]] | None,
    ) -> None:  # fmt: skip
        """-inf, in place, to each bad word's last token where the output ends with the rest
        of it. Decided on the host, but for an output whose last token is in flight: its
        prefix's other tokens match on the host, its last is compared on the device."""
        banned, pending = [], []  # (row, token); (row, token, expected last, row in flight)
        for i, request in enumerate(requests):
            out = request.output_ids
            for word in request.bad_words:
                *prefix, token = word
                if len(prefix) > len(out):
                    continue
                tail = out[len(out) - len(prefix) :]
                if not prefix or tail == prefix:
                    banned.append((i, token))
                elif tail[-1] == UNRESOLVED and tail[:-1] == prefix[:-1]:
                    assert in_flight is not None and in_flight[1][i] is not None
                    pending.append((i, token, prefix[-1], in_flight[1][i]))
        dev = logits.device
        if banned:
            rows, tokens = zip(*banned)
            index = (torch.tensor(rows, device=dev), torch.tensor(tokens, device=dev))
            logits.index_put_(index, torch.tensor(-math.inf, device=dev))
        if pending:
            rows, tokens, expected, flight_rows = zip(*pending)
            last = in_flight[0][torch.tensor(flight_rows, device=in_flight[0].device)].to(dev)
            matched = last == torch.tensor(expected, device=dev)
            minus = torch.where(matched, -math.inf, 0.0).to(logits.dtype)
            # accumulate: a row may hold one token for several words, matched or not
            index = (torch.tensor(rows, device=dev), torch.tensor(tokens, device=dev))
            logits.index_put_(index, minus, accumulate=True)

    def _end_tokens(self, request: Request) -> tuple[int, ...]:
        """The tokens that would end ``request``: its stop tokens, and EOS unless ignored."""
        params = request.params
        return params.stop_token_ids + (() if params.ignore_eos else self.eos_token_ids)

    def _penalize(self, logits: torch.Tensor, requests: list[Request]) -> None:
        """Penalises, in place, the rows of ``logits`` whose requests have penalties."""
        rows = [i for i, r in enumerate(requests) if r.params.penalized]
        if not rows:
            return
        slots = self._slots([requests[i] for i in rows], logits.shape[-1])
        dev = logits.device
        params = [requests[i].params for i in rows]
        repetition = torch.tensor([p.repetition_penalty for p in params], device=dev)[:, None]
        frequency = torch.tensor([p.frequency_penalty for p in params], device=dev)[:, None]
        presence = torch.tensor([p.presence_penalty for p in params], device=dev)[:, None]
        index = torch.tensor(rows, device=dev)
        counts, seen = self.counts[slots], self.seen[slots]
        chosen = logits[index]
        scaled = torch.where(chosen > 0, chosen / repetition, chosen * repetition)
        chosen = torch.where(seen, scaled, chosen)
        logits[index] = chosen - frequency * counts - presence * (counts > 0)

    def record(self, tokens: torch.Tensor, requests: list[Request]) -> None:
        """Counts the tokens just sampled (row i for ``requests[i]``) for penalised requests."""
        if not self._slot:  # no penalised request has been sampled yet
            return
        rows = [i for i, r in enumerate(requests) if r.params.penalized]
        if not rows:
            return
        slots = torch.tensor([self._slot[requests[i].request_id] for i in rows], device=self.device)
        sampled = tokens[torch.tensor(rows, device=tokens.device)].to(self.device)
        self.counts.index_put_((slots, sampled), torch.ones_like(sampled, dtype=torch.float32),
                               accumulate=True)  # fmt: skip
        self.seen[slots, sampled] = True

    def release(self, request_id: int) -> None:
        self._live.discard(request_id)
        slot = self._slot.pop(request_id, None)
        if slot is not None:
            self._free.append(slot)

    def _slots(self, requests: list[Request], vocab: int) -> torch.Tensor:
        """The rows of ``requests`` (new ones filled from their prompts)."""
        for request in requests:
            if request.request_id not in self._slot:
                slot = self._new_slot(vocab)
                self._slot[request.request_id] = slot
                self.counts[slot].zero_()
                self.seen[slot].zero_()
                # first sampled here, so its output is empty: only the prompt has been seen
                prompt = torch.tensor(request.prompt_ids, device=self.device)
                self.seen[slot, prompt] = True
        return torch.tensor([self._slot[r.request_id] for r in requests], device=self.device)

    def _new_slot(self, vocab: int) -> int:
        if not self._free:
            old = 0 if self.counts is None else self.counts.shape[0]
            new = max(FIRST_SLOTS, 2 * old)
            counts = torch.zeros(new, vocab, device=self.device)
            seen = torch.zeros(new, vocab, dtype=torch.bool, device=self.device)
            if self.counts is not None:
                counts[:old], seen[:old] = self.counts, self.seen
            self.counts, self.seen = counts, seen
            self._free.extend(range(new - 1, old - 1, -1))
        return self._free.pop()


def bad_word_ids(tokenizer: Tokenizer, words: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    """vLLM's token forms of ``bad_words``: each word with its leading whitespace stripped
    (kept when it is all whitespace), and after a space where that gives as many tokens and
    another first one."""
    forms: list[tuple[int, ...]] = []
    for word in words:
        word = word.lstrip() or word
        plain = tuple(tokenizer.encode(word, add_special_tokens=False))
        spaced = tuple(tokenizer.encode(" " + word, add_special_tokens=False))
        forms.append(plain)
        if plain and len(spaced) == len(plain) and spaced[0] != plain[0]:
            forms.append(spaced)
    return tuple(dict.fromkeys(forms))
