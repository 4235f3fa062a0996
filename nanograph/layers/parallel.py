"""The vocabulary-parallel embedding of tensor parallelism (the other sharded layers are plain
``Linear``s of a rank's smaller config followed by ``distributed.collectives.all_reduce``).

Invariant: rank r holds rows ``[r * rows, (r + 1) * rows)`` of the (padded) vocabulary; a token
outside them embeds to zeros here, so the all-reduce of every rank's rows is the full lookup.
Graph-safe: masks on the device, no host reads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nanograph.distributed.collectives import all_reduce
from nanograph.distributed.group import TensorParallel
from nanograph.distributed.sharding import vocab_rows


class VocabParallelEmbedding(nn.Embedding):
    def __init__(self, vocab_size: int, hidden_size: int, tp: TensorParallel) -> None:
        rows = vocab_rows(vocab_size, tp.size)
        super().__init__(rows, hidden_size)
        self.tp = tp
        self.start = tp.rank * rows

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.num_embeddings)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside[:, None], 0.0)
        return all_reduce(out, self.tp)
