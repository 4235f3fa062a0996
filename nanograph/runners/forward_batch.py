"""``ForwardBatch``: the host-side description of one forward, built by the engine.

Invariants:
- Tokens are flat: request r owns rows ``[query_start[r], query_start[r] + query_lens[r])``.
- ``seq_lens[r]`` is the KV length after this forward; the new tokens sit at positions
  ``seq_lens[r] - query_lens[r] ...``; ``sample_rows`` are the rows whose logits are sampled
  (the last row of each request that finishes its pending tokens in this forward).
- ``mode`` is "decode" exactly when every request computes one token; runners pick the decode
  path for it and the prefill (extend) path otherwise.
- ``future_rows[i]`` holds a token still on the device (overlap schedule): its host value is a
  placeholder, and runners write ``tokens[future_src[i]]`` of the step in flight into that row
  before the model reads it (``fill_future``).

A batch becomes model inputs and attention metadata in one place: ``attention_inputs``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

# A request computing at least this many tokens gets its token rows (ids, positions, slots) as
# numpy arrays, which ``attention_inputs.fill`` copies without converting; fewer, e.g. a
# decode's one token, as lists (numpy's fixed cost is ~13 us a call). For one 8k-token prompt
# on the 2-core development CPU: lists of positions and slots and their conversions cost ~0.5
# ms of the prefill's latency, the arrays ~0.02 (the ids' one conversion stays, ~0.12).
NUMPY_ROWS_FROM = 64


def _rows(
    ids: list[int], pages: list[int], pos: range, page_size: int
) -> tuple[list[int] | np.ndarray, ...]:
    """A request's ids, positions and KV slots (of each position in ``pos``, in ``pages``)."""
    if len(pos) < NUMPY_ROWS_FROM:
        slots = [pages[p // page_size] * page_size + p % page_size for p in pos]
        return ids, list(pos), slots
    at = np.arange(pos.start, pos.stop)
    slots = np.asarray(pages, dtype=np.int64)[at // page_size] * page_size + at % page_size
    return np.fromiter(ids, np.int64, len(ids)), at, slots


def _join(parts: list) -> list[int] | np.ndarray:
    """Per-request rows as one list, or one int64 array if any request's rows are an array."""
    if any(isinstance(p, np.ndarray) for p in parts):
        return np.concatenate(parts).astype(np.int64, copy=False) if len(parts) > 1 else parts[0]
    return [t for p in parts for t in p]


@dataclass(frozen=True)
class ForwardBatch:
    # token rows: lists, or int64 arrays where a request computes NUMPY_ROWS_FROM tokens or more
    input_ids: list[int] | np.ndarray
    positions: list[int] | np.ndarray
    seq_lens: list[int]
    query_lens: list[int]
    page_tables: list[list[int]]
    slot_mapping: list[int] | np.ndarray
    sample_rows: list[int]
    page_size: int
    future_rows: tuple[int, ...] = ()
    future_src: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_requests(self) -> int:
        return len(self.seq_lens)

    @functools.cached_property
    def mode(self) -> str:
        return "decode" if all(q == 1 for q in self.query_lens) else "extend"

    @functools.cached_property
    def max_pages(self) -> int:
        return max((len(p) for p in self.page_tables), default=1) or 1

    @staticmethod
    def build(
        new_token_ids: list[list[int]],
        num_computed: list[int],
        pages: list[list[int]],
        page_size: int,
        sample: list[bool],
        future: list[int | None] | None = None,
    ) -> ForwardBatch:
        """One request per entry: computes ``new_token_ids[r]``, which sit right after the
        request's ``num_computed[r]`` cached tokens. ``future[r]``, when given, is the row of
        the step in flight that holds request r's last new token (still on the device)."""
        ids_parts, pos_parts, slot_parts = [], [], []
        sample_rows: list[int] = []
        future_rows: list[int] = []
        future_src: list[int] = []
        rows = 0
        for ids, start, req_pages, do_sample, src in zip(
            new_token_ids, num_computed, pages, sample, future or [None] * len(pages), strict=True
        ):
            part_ids, part_pos, part_slots = _rows(
                ids, req_pages, range(start, start + len(ids)), page_size
            )
            ids_parts.append(part_ids)
            pos_parts.append(part_pos)
            slot_parts.append(part_slots)
            rows += len(ids)
            if do_sample:
                sample_rows.append(rows - 1)
            if src is not None:
                future_rows.append(rows - 1)
                future_src.append(src)
        return ForwardBatch(
            input_ids=_join(ids_parts),
            positions=_join(pos_parts),
            seq_lens=[c + len(ids) for c, ids in zip(num_computed, new_token_ids)],
            query_lens=[len(ids) for ids in new_token_ids],
            page_tables=pages,
            slot_mapping=_join(slot_parts),
            sample_rows=sample_rows,
            page_size=page_size,
            future_rows=tuple(future_rows),
            future_src=tuple(future_src),
        )

    def fill_future(self, input_ids: torch.Tensor, tokens: torch.Tensor | None) -> None:
        """Writes the tokens still on the device into their rows of ``input_ids`` (stream
        ordered: no host sync). ``tokens`` are the sampled tokens of the step in flight."""
        if not self.future_rows:
            return
        if tokens is None:
            raise ValueError("the batch takes tokens from a step in flight, but none was given")
        k = len(self.future_rows)
        if self.future_rows == self.future_src == tuple(range(k)):  # decode in the same order
            input_ids[:k].copy_(tokens[:k])
            return
        device = input_ids.device
        rows = torch.tensor(self.future_rows, dtype=torch.long).to(device, non_blocking=True)
        src = torch.tensor(self.future_src, dtype=torch.long).to(device, non_blocking=True)
        input_ids.index_copy_(0, rows, tokens.index_select(0, src).to(input_ids.dtype))
