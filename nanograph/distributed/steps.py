"""Each step from rank 0 to the other ranks: the batch, and the tokens it takes from the step
still in flight.

Invariants:
- Per step rank 0 sends one host object over the gloo group, ``(ForwardBatch, n)``, and, only
  when the batch has ``future_rows`` (overlap schedule), the ``n`` sampled tokens of the step in
  flight as a device broadcast (stream-ordered: the host does not wait for them). ``None``
  means stop. Every rank then runs the same forward, collectives included, and computes the
  gathered logits; only rank 0 samples.
- A forward that raises on rank 0 after the step was sent leaves the group in an unknown
  state (a collective may be half-done), so the group is marked broken: this and every later
  step fail with a ``TensorParallelError`` that names the first error, instead of hanging.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from nanograph.distributed.group import TensorParallel, TensorParallelError

if TYPE_CHECKING:
    from nanograph.runners.forward_batch import ForwardBatch

Forward = Callable[["ForwardBatch", "torch.Tensor | None"], torch.Tensor]


def run_step(
    tp: TensorParallel, forward: Forward, batch: ForwardBatch, in_flight: torch.Tensor | None
) -> torch.Tensor:
    """Rank 0: ``forward(batch, in_flight)`` on every rank; returns rank 0's logits."""
    if not tp.enabled:
        return forward(batch, in_flight)
    if tp.broken is not None or tp.peer_failure is not None:
        raise TensorParallelError(
            f"the tensor-parallel group stopped: {tp.peer_failure or tp.broken}; restart the engine"
        )
    needs = in_flight if batch.future_rows else None
    try:
        dist.broadcast_object_list(
            [(batch, -1 if needs is None else needs.shape[0])], src=0, group=tp.cpu_group
        )
        if needs is not None:
            dist.broadcast(needs, src=0, group=tp.device_group)
    except RuntimeError as e:
        error = tp.lost(e)
        tp.broken = str(error)
        raise error from e
    try:
        return forward(batch, in_flight)
    except Exception as e:
        if tp.failed_peer() is not None:  # a collective failed because a worker died
            error = tp.lost(e)
        else:
            error = TensorParallelError(
                f"rank 0 failed during a step: {type(e).__name__}: {e}; restart the engine"
            )
        tp.broken = str(error)
        raise error from e


def send_stop(tp: TensorParallel) -> None:
    dist.broadcast_object_list([None], src=0, group=tp.cpu_group)


def receive_step(tp: TensorParallel) -> tuple[ForwardBatch, torch.Tensor | None] | None:
    """Ranks 1..N-1: the next step (batch, in-flight tokens), or None when rank 0 stops."""
    box: list = [None]
    dist.broadcast_object_list(box, src=0, group=tp.cpu_group)
    if box[0] is None:
        return None
    batch, n = box[0]
    in_flight = None
    if n >= 0:
        in_flight = torch.empty(n, dtype=torch.long, device=tp.device)
        dist.broadcast(in_flight, src=0, group=tp.device_group)
    return batch, in_flight
