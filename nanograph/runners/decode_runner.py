"""``DecodeRunner``: one token per request, one captured shape per batch size; ``DraftRunner``:
the draft model's autoregressive steps.

Invariants:
- A shape ``bs x bs`` holds ``bs`` requests of one new token each; fewer live requests leave
  zero-length sentinel slots and padded rows that write no KV.
- A ``DraftRunner`` with ``loop_steps = s > 0`` captures, per batch size, ONE graph holding s
  greedy steps: each step's argmax is the next step's input, and the attention metadata is
  advanced on the device between steps (positions and sequence lengths + 1, slots looked up in
  the page table) for live slots only; sentinel slots stay zero-length, their rows slot -1.
  Only a graph-safe attention backend reads that metadata from the device, so the engine asks
  for loop mode only with one. A loop graph replays whole loops (``draft_loop``): single steps
  of such a runner run eagerly (``forward`` returns None).
- Page-table columns past a request's pages hold the scratch page 0, so steps past the drafts
  a request asked for write and read only scratch; their tokens are dropped by the caller. The
  runner's page table is wide enough for ``loop_steps`` positions past the context.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from nanograph.layers import ops
from nanograph.runners.forward_batch import ForwardBatch
from nanograph.runners.graph_runner import GraphRunner
from nanograph.runners.shapes import ShapeKey


class DecodeRunner(GraphRunner):
    path = "decode"

    def max_query_len(self, shape: ShapeKey) -> int:
        return 1

    def dummy_query_lens(self, shape: ShapeKey) -> list[int]:
        return [1] * shape.num_slots


class DraftRunner(DecodeRunner):
    """The draft model's steps after its draft-extend forward: a one-step graph per batch size
    (``loop_steps == 0``, chained by the caller on the device), or the whole greedy loop."""

    path = "draft"

    def __init__(self, *args, loop_steps: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.loop_steps = loop_steps
        slots = self.static.max_slots
        self.drafts = torch.zeros(max(loop_steps, 1), slots, dtype=torch.long,
                                  device=self.output.device)  # fmt: skip
        # owned here, not by the loop's closure: a graph keeps no reference to the tensors it
        # reads, and the closure is dropped after capture (its own arange was freed and
        # reused, and the replay indexed the page table with whatever landed there)
        self.slot_rows = torch.arange(slots, device=self.output.device)

    def _graph_fn(self, shape: ShapeKey) -> Callable[[], torch.Tensor]:
        if not self.loop_steps:
            return super()._graph_fn(shape)
        s, static, page_size = shape.num_slots, self.static, self.static.page_size
        ids, positions = static.input_ids[:s], static.positions[:s]
        seq_lens, slots, table = static.seq_lens[:s], static.slot_mapping[:s], static.page_table
        rows = self.slot_rows[:s]
        drafts = self.drafts[:, :s]

        def loop() -> torch.Tensor:
            for step in range(self.loop_steps):
                hidden = self.model(ids, positions)
                ops.argmax(self.model.compute_logits(hidden), out=drafts[step])
                if step + 1 < self.loop_steps:
                    advance_inputs(drafts[step], ids, positions, seq_lens, slots, table, rows,
                                   page_size)  # fmt: skip
            return drafts

        return loop

    def forward(
        self, batch: ForwardBatch, in_flight: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        if self.loop_steps:
            return None  # loop graphs replay whole loops; a single step runs eagerly
        return super().forward(batch, in_flight)

    @torch.inference_mode()
    def draft_loop(self, batch: ForwardBatch, first: torch.Tensor) -> torch.Tensor | None:
        """Greedy drafts 2..loop_steps+1 of each request, ``[loop_steps, num_requests]`` on the
        device, after ``batch`` (one token per request, taken from ``first`` through its
        ``future_rows``); None when no loop graph takes the batch."""
        shape = self.dispatch(batch) if self.loop_steps else None
        if shape is None:
            self.fallbacks += 1
            return None
        self.replay(shape, batch, first)  # its output buffer is unused: the drafts are
        return self.drafts[:, : batch.num_requests]


def advance_inputs(
    tokens: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor, seq_lens: torch.Tensor,
    slots: torch.Tensor, table: torch.Tensor, rows: torch.Tensor, page_size: int,
) -> None:  # fmt: skip
    """A loop step's drafts ``tokens`` become the next step's inputs, in place: live slots
    (``seq_lens > 0``) move one position on, and their KV slot is looked up in the page
    table; sentinel slots stay zero-length, slot -1 (their rows write no KV). On CUDA one
    launch (``kernels/draft_inputs.py``: these ops took a dozen); ``rows`` is
    ``arange(len(tokens))`` owned by the caller (a tensor made inside a capture is freed with
    the closure, under the graph that reads it)."""
    if tokens.is_cuda and not torch.compiler.is_compiling():
        from nanograph.kernels.draft_inputs import advance_draft_inputs

        advance_draft_inputs(tokens, ids, positions, seq_lens, slots, table, page_size)
        return
    live = seq_lens > 0
    ids.copy_(tokens)
    positions.add_(live)
    seq_lens.add_(live.to(seq_lens.dtype))
    pages = table[rows, positions // page_size].to(slots.dtype)
    slots.copy_(torch.where(live, pages * page_size + positions % page_size, -1))


__all__ = ["DecodeRunner", "DraftRunner", "advance_inputs"]
