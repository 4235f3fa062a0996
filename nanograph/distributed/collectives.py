"""The forward's collectives over the device group: one all-reduce per row-parallel layer, and
the gather of vocabulary shards for sampling.

Invariants:
- With one rank every function returns its input untouched: no copy, no call into
  torch.distributed (a single-GPU engine runs the code it always ran).
- ``all_reduce`` is in place, allocates nothing and reads nothing on the host, so CUDA graphs
  capture it (NCCL records the collective into the graph; every rank replays the same graphs in
  the same order, which the runners' rank-agreed capture guarantees). While torch.compile
  traces (tc_piecewise) it is one opaque torch.library op, so dynamo records a node instead of
  tracing into torch.distributed.
- ``gather_vocab`` runs outside graphs (logits are computed after replay), on every rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from nanograph.distributed.group import TensorParallel

# group_name -> process group, for the torch.library op (ops take strings, not groups); filled
# when a group is created, emptied when it is destroyed
_GROUPS: dict[str, dist.ProcessGroup] = {}


def register_group(name: str, group: dist.ProcessGroup) -> None:
    _GROUPS[name] = group


def unregister_group(name: str) -> None:
    _GROUPS.pop(name, None)


@torch.library.custom_op("nanograph::all_reduce", mutates_args=("x",))
def _all_reduce_op(x: torch.Tensor, group_name: str) -> None:
    dist.all_reduce(x, group=_GROUPS[group_name])


@_all_reduce_op.register_fake
def _(x, group_name):
    return None


def all_reduce(x: torch.Tensor, tp: TensorParallel | None) -> torch.Tensor:
    """Sums ``x`` over the ranks, in place; returns it."""
    if tp is None or not tp.enabled:
        return x
    if torch.compiler.is_compiling():
        _all_reduce_op(x, tp.group_name)
    else:
        dist.all_reduce(x, group=tp.device_group)
    return x


def gather_vocab(local: torch.Tensor, tp: TensorParallel | None, vocab_size: int) -> torch.Tensor:
    """Logits [T, V / size] of this rank's vocabulary shard -> [T, V] on every rank."""
    if tp is None or not tp.enabled:
        return local
    if local.shape[0] == 0:  # every rank sees the same batch: all skip together
        return local.new_empty(0, vocab_size)
    parts = [torch.empty_like(local) for _ in range(tp.size)]
    dist.all_gather(parts, local.contiguous(), group=tp.device_group)
    return torch.cat(parts, dim=-1)[:, :vocab_size]
