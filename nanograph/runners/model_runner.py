"""Runs a ``ForwardBatch`` through the model and returns the logits of its sampled rows.

This is the eager path. Graph runners (decode, prefill) plug in here: each says whether it
can take a batch, and the eager forward is the fallback when none can.
"""

from __future__ import annotations

import torch

from nanograph.attention.base import AttentionBackend
from nanograph.attention.op import ForwardContext, forward_context
from nanograph.models.llama import CausalLM
from nanograph.runners.forward_batch import ForwardBatch


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        attention: AttentionBackend,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
        device: torch.device,
    ) -> None:
        self.model = model
        self.attention = attention
        self.k_caches, self.v_caches = k_caches, v_caches
        self.device = device

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits (float32) of ``batch.sample_rows``, shape [len(sample_rows), vocab]."""
        ids = torch.tensor(batch.input_ids, dtype=torch.long).to(self.device, non_blocking=True)
        pos = torch.tensor(batch.positions, dtype=torch.long).to(self.device, non_blocking=True)
        ctx = ForwardContext(
            self.attention, batch.metadata(self.device), self.k_caches, self.v_caches
        )
        with forward_context(ctx):
            hidden = self.model(ids, pos)
        rows = torch.tensor(batch.sample_rows, dtype=torch.long).to(self.device, non_blocking=True)
        return self.model.compute_logits(hidden[rows])
