"""Static graph inputs: one typed set of buffers sized at a runner's largest shape.

Invariants:
- Buffers never move: ``copy_from`` refills them in place, and every captured shape reads views
  (``[:num_tokens]``, ``[:num_slots]``) of the same storage.
- Padding: token rows past the live count get token 0, position 0 and slot -1 (no KV write);
  request slots past the live count are zero-length sentinels (seq_len = query_len = 0, page
  table row on the scratch page 0, ``query_start_loc`` parked at the live token count).
- The host copies of the lengths are updated in place too, so an eager break that reads them
  at replay sees the live batch.
"""

from __future__ import annotations

import torch

from nanograph.attention.base import AttentionMetadata
from nanograph.runners.forward_batch import ForwardBatch
from nanograph.runners.shapes import ShapeKey


class StaticInputs:
    def __init__(
        self, max_tokens: int, max_slots: int, max_pages: int, page_size: int, device: torch.device
    ) -> None:
        def buf(*shape: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.max_tokens, self.max_slots, self.max_pages = max_tokens, max_slots, max_pages
        self.page_size = page_size
        self.input_ids = buf(max_tokens, dtype=torch.long)
        self.positions = buf(max_tokens, dtype=torch.long)
        self.slot_mapping = buf(max_tokens, dtype=torch.long)
        self.page_table = buf(max_slots, max_pages)
        self.seq_lens = buf(max_slots)
        self.query_lens = buf(max_slots)
        self.query_start_loc = buf(max_slots + 1)
        self.num_tokens = buf(1)
        self.seq_lens_cpu: list[int] = [0] * max_slots
        self.query_lens_cpu: list[int] = [0] * max_slots
        # staging on the host: one pinned copy per step instead of many small transfers
        pin = device.type == "cuda"
        self._host_tokens = torch.zeros(3, max_tokens, dtype=torch.long, pin_memory=pin)
        self._host_slots = torch.zeros(3 * max_slots + 2, dtype=torch.int32, pin_memory=pin)
        self._host_pages = torch.zeros(max_slots, max_pages, dtype=torch.int32, pin_memory=pin)

    def fits(self, batch: ForwardBatch) -> bool:
        return (
            batch.num_tokens <= self.max_tokens
            and batch.num_requests <= self.max_slots
            and batch.max_pages <= self.max_pages
        )

    def copy_from(self, batch: ForwardBatch, shape: ShapeKey) -> None:
        """Writes ``batch`` padded to ``shape`` into the buffers (which must fit it)."""
        n, s, t, r = shape.num_tokens, shape.num_slots, batch.num_tokens, batch.num_requests
        tokens = self._host_tokens[:, :n]
        tokens.zero_()
        tokens[0, :t] = torch.tensor(batch.input_ids)
        tokens[1, :t] = torch.tensor(batch.positions)
        tokens[2, :t] = torch.tensor(batch.slot_mapping)
        tokens[2, t:] = -1
        lens = self._host_slots
        lens.zero_()
        lens[:r] = torch.tensor(batch.seq_lens)
        lens[s : s + r] = torch.tensor(batch.query_lens)
        starts = lens[2 * s : 3 * s + 1]
        torch.cumsum(lens[s : s + r], 0, out=starts[1 : r + 1])
        starts[r + 1 :] = t  # sentinels parked after the real tokens
        lens[3 * s + 1] = t
        pages = self._host_pages[:s]
        pages.zero_()
        for i, row in enumerate(batch.page_tables):
            pages[i, : len(row)] = torch.tensor(row, dtype=torch.int32)
        self.input_ids[:n].copy_(tokens[0], non_blocking=True)
        self.positions[:n].copy_(tokens[1], non_blocking=True)
        self.slot_mapping[:n].copy_(tokens[2], non_blocking=True)
        self.seq_lens[:s].copy_(lens[:s], non_blocking=True)
        self.query_lens[:s].copy_(lens[s : 2 * s], non_blocking=True)
        self.query_start_loc[: s + 1].copy_(starts, non_blocking=True)
        self.num_tokens.copy_(lens[3 * s + 1 : 3 * s + 2], non_blocking=True)
        self.page_table[:s].copy_(pages, non_blocking=True)
        self.seq_lens_cpu[:] = batch.seq_lens + [0] * (self.max_slots - r)
        self.query_lens_cpu[:] = batch.query_lens + [0] * (self.max_slots - r)

    def metadata(self, shape: ShapeKey, max_query_len: int) -> AttentionMetadata:
        """Views of the buffers for ``shape``; built once per captured shape."""
        n, s = shape.num_tokens, shape.num_slots
        return AttentionMetadata(
            page_table=self.page_table[:s],
            seq_lens=self.seq_lens[:s],
            query_lens=self.query_lens[:s],
            query_start_loc=self.query_start_loc[: s + 1],
            slot_mapping=self.slot_mapping[:n],
            num_tokens=self.num_tokens,
            page_size=self.page_size,
            max_query_len=max_query_len,
            # the whole host lists: slots past the live ones are sentinels (length 0)
            seq_lens_cpu=self.seq_lens_cpu,
            query_lens_cpu=self.query_lens_cpu,
        )
