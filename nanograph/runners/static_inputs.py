"""Static graph inputs: one typed set of buffers sized at a runner's largest shape.

Invariants:
- Buffers never move: ``copy_from`` refills them in place, and every captured shape reads views
  (``[:num_tokens]``, ``[:num_slots]``) of the same storage.
- The blocks' layout, the padding and the metadata views are ``attention_inputs``'s, the one
  batch -> metadata builder (eager forwards use it too).
- The host copies of the lengths are updated in place too, so an eager break that reads them
  at replay sees the live batch.
- The pinned host mirrors the device buffers are copied from come in two sets, used in turn:
  under the overlap schedule the host fills step t+1's while step t's copy may still be
  queued, and it waits for a set's last copy (two steps back) before writing it again.
- The three blocks (token rows, lengths, page table) lie in one byte buffer, on the device as
  in each mirror, so a step refills them with one host-to-device copy (three before: each copy
  is a launch and a gap on the step's path). Each block starts ALIGN-aligned, so its pointers
  have the alignment Triton specializes on, as separate allocations had.
"""

from __future__ import annotations

import torch

from nanograph.arith import ceil_div
from nanograph.attention.base import AttentionMetadata
from nanograph.runners.attention_inputs import fill, lens_size, lens_stride, views
from nanograph.runners.forward_batch import ForwardBatch
from nanograph.runners.shapes import ShapeKey

ALIGN = 256  # bytes; a fresh CUDA allocation's alignment


class _Layout:
    """Byte offsets of the three blocks in one buffer: token rows [3, max_tokens rounded up to
    even] int64 (so the positions row is 16-byte aligned too, as in ``eager_inputs``), the
    lengths block (``attention_inputs.lens_size``) and the page table [slots, max_pages],
    both int32."""

    def __init__(self, max_tokens: int, max_slots: int, max_pages: int) -> None:
        self.max_slots, self.max_pages = max_slots, max_pages
        self.row = max_tokens + max_tokens % 2
        self.tokens_bytes = 3 * self.row * 8
        self.lens_at = _aligned(self.tokens_bytes)
        self.lens_bytes = lens_size(max_slots) * 4
        self.pages_at = _aligned(self.lens_at + self.lens_bytes)
        self.row_bytes = max_pages * 4  # one slot's page-table row
        self.size = self.pages_at + max_slots * self.row_bytes

    def blocks(self, buffer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views of ``buffer`` (uint8, ``size`` bytes): tokens, lens, page table."""
        tokens = buffer[: self.tokens_bytes].view(torch.long).view(3, self.row)
        lens = buffer[self.lens_at : self.lens_at + self.lens_bytes].view(torch.int32)
        pages = buffer[self.pages_at :].view(torch.int32).view(self.max_slots, self.max_pages)
        return tokens, lens, pages

    def used(self, num_slots: int) -> int:
        """Bytes up to the end of the first ``num_slots`` page-table rows (what a step copies)."""
        return self.pages_at + num_slots * self.row_bytes


def _aligned(offset: int) -> int:
    return ceil_div(offset, ALIGN) * ALIGN


class StaticInputs:
    def __init__(
        self, max_tokens: int, max_slots: int, max_pages: int, page_size: int, device: torch.device
    ) -> None:
        self.max_tokens, self.max_slots, self.max_pages = max_tokens, max_slots, max_pages
        self.page_size = page_size
        m = max_slots
        # Three device blocks in one buffer, refilled by one host-to-device copy per step; the
        # named buffers are fixed views into them (graphs were captured against those
        # addresses).
        self._layout = _Layout(max_tokens, m, max_pages)
        self._buffer = torch.zeros(self._layout.size, dtype=torch.uint8, device=device)
        self._tokens, self._lens, self.page_table = self._layout.blocks(self._buffer)
        self.input_ids, self.positions, self.slot_mapping = self._tokens
        stride = lens_stride(m)
        self.seq_lens = self._lens[:m]
        self.query_lens = self._lens[stride : stride + m]
        self.query_start_loc = self._lens[2 * stride : 2 * stride + m + 1]
        self.num_tokens = self._lens[3 * stride : 3 * stride + 1]
        self._mirrors = [_HostMirror(self._layout, device) for _ in range(2)]
        self._turn = 0
        self.seq_lens_cpu: list[int] = [0] * m
        self.query_lens_cpu: list[int] = [0] * m

    def fits(self, batch: ForwardBatch) -> bool:
        return (
            batch.num_tokens <= self.max_tokens
            and batch.num_requests <= self.max_slots
            and batch.max_pages <= self.max_pages
        )

    def copy_from(self, batch: ForwardBatch, shape: ShapeKey) -> None:
        """Writes ``batch`` padded to ``shape`` into the buffers (which must fit it), through
        ``attention_inputs.fill`` into this turn's pinned mirror."""
        m, r = self.max_slots, batch.num_requests
        mirror = self._mirrors[self._turn]
        self._turn ^= 1
        mirror.wait()
        fill(batch, shape.num_slots, mirror.tokens_np, mirror.lens_np, mirror.pages_np,
             mirror.page_extent)  # fmt: skip
        mirror.page_extent = (batch.num_requests, batch.max_pages)
        used = self._layout.used(shape.num_slots)
        self._buffer[:used].copy_(mirror.buffer[:used], non_blocking=True)
        mirror.copied()
        self.seq_lens_cpu[:] = batch.seq_lens + [0] * (m - r)
        self.query_lens_cpu[:] = batch.query_lens + [0] * (m - r)

    def metadata(self, shape: ShapeKey, max_query_len: int) -> AttentionMetadata:
        """Views of the buffers for ``shape``; built once per captured shape. The host lists
        are the whole ones: slots past the live ones are sentinels (length 0)."""
        return views(
            self._tokens, self._lens, self.page_table, shape.num_tokens, shape.num_slots,
            self.page_size, max_query_len, self.seq_lens_cpu, self.query_lens_cpu,
        )  # fmt: skip


class _HostMirror:
    """A pinned host buffer in the device buffer's layout, written through numpy views."""

    def __init__(self, layout: _Layout, device: torch.device):
        pin = device.type == "cuda"
        self.buffer = torch.zeros(layout.size, dtype=torch.uint8, pin_memory=pin)
        self.tokens_np, self.lens_np, self.pages_np = (
            block.numpy() for block in layout.blocks(self.buffer)
        )
        self.page_extent = (0, 0)  # page-table rows and columns its last batch wrote
        self._event = torch.cuda.Event() if pin else None
        self._pending = False

    def copied(self) -> None:
        """Marks the device copies just queued from these buffers."""
        if self._event is not None:
            self._event.record()
            self._pending = True

    def wait(self) -> None:
        """Blocks until the last copies from these buffers have run (free when they have)."""
        if self._pending:
            self._event.synchronize()
            self._pending = False
