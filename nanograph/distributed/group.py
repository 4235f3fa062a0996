"""The tensor-parallel group of this process: its rank, its size and its two process groups.

Invariants:
- One ``TensorParallel`` per engine. ``size == 1`` (the default) holds no process group and
  every collective is the identity: a single-GPU engine runs exactly the code it ran before
  tensor parallelism existed.
- Two groups over the same ranks: ``device_group`` carries tensors of the forward (NCCL on
  CUDA, gloo on CPU; its collectives may be captured in CUDA graphs), ``cpu_group`` (always
  gloo) carries host objects: each step's batch, start-up agreements, reports. A dead peer
  makes a gloo call raise at once; any other stall ends after ``timeout_s``.
- Rank 0 (the driver) owns the scheduler, the sampler and the tokenizer; every rank holds its
  shard of the weights and of the KV pool and runs the same forwards in the same order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


class TensorParallelError(RuntimeError):
    """A rank failed (or stopped answering); the message names the rank and its error."""


@dataclass(eq=False)
class TensorParallel:
    rank: int = 0
    size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    timeout_s: float = 300.0
    device_group: ProcessGroup | None = None
    cpu_group: ProcessGroup | None = None
    # the name of device_group for torch.library ops (they cannot take a ProcessGroup)
    group_name: str = ""
    # the rendezvous store (workers leave their error there before they exit)
    store: Any = None
    # set by the launcher's watchdog on rank 0 when a worker process died: "rank r: error"
    peer_failure: str | None = None
    # rank 0 of a spawned group: looks at the worker processes for one that died (its rank,
    # exit code and error), waiting briefly for a dying one to exit
    find_failure: Callable[[], str | None] | None = None
    # set when a step failed on rank 0 after the workers started it: collectives may be
    # half-done, so no further step can run
    broken: str | None = None

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.size > 1

    def __repr__(self) -> str:
        return f"TensorParallel(rank={self.rank}, size={self.size}, device={self.device})"

    # ---- host-object collectives over the gloo group ----------------------------------------
    def all_gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (the identity list when size is 1)."""
        if not self.enabled:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.size
        try:
            dist.all_gather_object(out, obj, group=self.cpu_group)
        except RuntimeError as e:
            raise self.lost(e) from e
        return out

    def failed_peer(self) -> str | None:
        """How another rank died ("rank r exited (exit code c): error"), or None if none did."""
        if self.peer_failure is None and self.find_failure is not None:
            self.peer_failure = self.find_failure()
        return self.peer_failure

    def lost(self, error: BaseException) -> TensorParallelError:
        """The error to raise when a collective with the other ranks failed."""
        cause = self.failed_peer() or f"{type(error).__name__}: {error}"
        return TensorParallelError(
            f"rank {self.rank} lost the other tensor-parallel ranks: {cause}. The engine "
            "cannot continue; restart it (see the failing rank's log above)"
        )
