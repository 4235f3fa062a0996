"""Batched sampling on the model's device: greedy, temperature, top-k, top-p, min-p, seeds.

Invariants:
- One pass for the whole batch; per-row settings are tensors, so mixing greedy and sampled
  requests costs no host round trip. The chosen tokens stay on the device: the engine reads
  them when it needs them (after launching the next step, under the overlap schedule).
- Sampling is the exponential-race form of the categorical draw (argmax of p / E, E ~ Exp(1)).
  A seeded request draws its noise from its own generator, so its tokens do not depend on the
  rest of the batch.
"""

from __future__ import annotations

import torch

from nanograph.engine.sampling_params import SamplingParams


class Sampler:
    def __init__(self, device: torch.device, seed: int = 0) -> None:
        self.device = device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self._request_generators: dict[int, torch.Generator] = {}

    def release(self, request_id: int) -> None:
        self._request_generators.pop(request_id, None)

    def _generator_for(self, request_id: int, params: SamplingParams) -> torch.Generator:
        if params.seed is None:
            return self.generator
        gen = self._request_generators.get(request_id)
        if gen is None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(params.seed)
            self._request_generators[request_id] = gen
        return gen

    def __call__(
        self, logits: torch.Tensor, request_ids: list[int], params: list[SamplingParams]
    ) -> torch.Tensor:
        """logits: float32 [B, V]. Returns one token id per row (int64, on the device)."""
        if all(p.greedy for p in params):
            return logits.argmax(dim=-1)
        dev = logits.device
        temps = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=dev)
        logits = logits / temps[:, None]
        if any(p.top_k > 0 or p.top_p < 1 or p.min_p > 0 for p in params):
            logits = _filter(logits, params)
        probs = torch.softmax(logits, dim=-1)
        # one draw for the batch; seeded rows then redraw from their own generators
        noise = torch.empty_like(probs).exponential_(generator=self.generator)
        for row, (rid, p) in enumerate(zip(request_ids, params)):
            if p.seed is not None:
                noise[row].exponential_(generator=self._generator_for(rid, p))
        sampled = (probs / noise).argmax(dim=-1)
        greedy = torch.tensor([p.greedy for p in params], device=dev)
        # greedy rows of a mixed batch take the argmax of the unscaled logits (same order)
        return torch.where(greedy, logits.argmax(dim=-1), sampled)


def _filter(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Masks tokens outside top-k / top-p / min-p to -inf, row by row settings, one sort."""
    dev = logits.device
    vocab = logits.shape[-1]
    top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=dev)
    top_p = torch.tensor([p.top_p for p in params], device=dev)
    min_p = torch.tensor([p.min_p for p in params], device=dev)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=dev)[None, :]
    remove = ranks >= top_k[:, None]
    probs = torch.softmax(sorted_logits, dim=-1)
    # drop a token when the mass strictly before it already reaches top_p (keeps the first)
    remove |= (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
    remove |= probs < min_p[:, None] * probs[:, :1]
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)
