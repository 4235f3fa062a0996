"""Runs a ``ForwardBatch`` through the model and returns the logits of its sampled rows.

This is the eager path. Graph runners (decode, prefill) plug in here: each says whether it
can take a batch, and the eager forward is the fallback when none can.
"""

from __future__ import annotations

import torch

from nanograph.models.llama import CausalLM
from nanograph.runners.forward_batch import ForwardBatch


class ModelRunner:
    def __init__(self, model: CausalLM, device: torch.device) -> None:
        self.model = model
        self.device = device

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits (float32) of ``batch.sample_rows``, shape [len(sample_rows), vocab]."""
        ids = torch.tensor(batch.input_ids, dtype=torch.long).to(self.device, non_blocking=True)
        pos = torch.tensor(batch.positions, dtype=torch.long).to(self.device, non_blocking=True)
        hidden = self.model(ids, pos, batch.metadata(self.device))
        rows = torch.tensor(batch.sample_rows, dtype=torch.long).to(self.device, non_blocking=True)
        return self.model.compute_logits(hidden[rows])
