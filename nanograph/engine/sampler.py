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
from nanograph.layers import ops


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
            return ops.argmax(logits)
        probs = self.probabilities(logits, params)
        sampled = ops.argmax(probs / self.exponentials(request_ids, params, probs.shape[-1]))
        greedy = torch.tensor([p.greedy for p in params], device=logits.device)
        # greedy rows of a mixed batch take the argmax of the unscaled logits (same order)
        return torch.where(greedy, ops.argmax(logits), sampled)

    def probabilities(self, logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """The distribution each row samples from (float32 [B, V]): temperature, top-k, top-p,
        min-p, softmax; greedy rows are one-hot at the argmax of the unscaled logits."""
        dev = logits.device
        temps = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=dev)
        scaled = logits / temps[:, None]
        if any(p.top_k > 0 or p.top_p < 1 or p.min_p > 0 for p in params):
            scaled = _filter(scaled, params)
        probs = torch.softmax(scaled, dim=-1)
        greedy = torch.tensor([p.greedy for p in params], device=dev)
        if not greedy.any():
            return probs
        one_hot = torch.zeros_like(probs).scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
        return torch.where(greedy[:, None], one_hot, probs)

    def exponentials(
        self, request_ids: list[int], params: list[SamplingParams], width: int
    ) -> torch.Tensor:
        """Exp(1) noise [len(request_ids), width]: one draw for all rows from the engine's
        generator, then seeded requests' rows redrawn from their own generators."""
        noise = torch.empty(len(request_ids), width, device=self.device)
        noise.exponential_(generator=self.generator)
        for row, (rid, p) in enumerate(zip(request_ids, params)):
            if p.seed is not None:
                noise[row].exponential_(generator=self._generator_for(rid, p))
        return noise

    def uniforms(self, request_ids: list[int], params: list[SamplingParams]) -> torch.Tensor:
        """U[0, 1) draws [len(request_ids)], seeded requests from their own generators."""
        draws = torch.empty(len(request_ids), device=self.device)
        draws.uniform_(generator=self.generator)
        for row, (rid, p) in enumerate(zip(request_ids, params)):
            if p.seed is not None:
                draws[row : row + 1].uniform_(generator=self._generator_for(rid, p))
        return draws


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
