"""One rank of the agreement test: ``python tests/tp_agree.py`` with the env:// variables set.

Prints, one per line, what each agreement gives this rank (rank 1 alone fails, offers fewer
pages and another ladder), for ``test_tensor_parallel.test_agreements_across_ranks``.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed as dist

from nanograph.distributed.agreement import agree_equal, agree_failure, agree_min
from nanograph.distributed.group import TensorParallel, TensorParallelError


def main() -> None:
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
    group = dist.group.WORLD
    tp = TensorParallel(rank=rank, size=2, device_group=group, cpu_group=group)
    error = MemoryError("out of memory in capture") if rank == 1 else None
    print("failure:", agree_failure(tp, "decode capture of bs=8", error))
    print("none:", agree_failure(tp, "decode capture of bs=4", None))
    print("min:", agree_min(tp, 100 - 10 * rank))
    try:
        agree_equal(tp, "graph shapes", (1, 2, 4) if rank == 0 else (1, 2))
    except TensorParallelError as e:
        print("equal:", e)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
