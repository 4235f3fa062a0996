"""The rank-0 abort at exit of a torchrun script, alone (stop 74): two gloo ranks broadcast a few
objects, destroy the group and end; rank 0 then finalises the interpreter at once, or after
releasing the GIL for PAUSE seconds. Run from anywhere (CPU only):

    for i in $(seq 60); do p=$((20000 + RANDOM % 20000))
      python3 gloo_exit_race.py 1 $p 0 & python3 gloo_exit_race.py 0 $p 0; echo rc=$?; wait; done

Stop 74, this machine (torch 2.13 CPU): PAUSE 0: 16 of 120 runs of rank 0 aborted
("terminate called without an active exception"; the core: a `ProcessGroupGloo::runLoop`
thread destroying a finished work's tensors, `TensorImpl::decref_pyobject` -> take_gil ->
PyThread_exit_thread during Py_FinalizeEx); PAUSE 0.05: 0 of 60. Hence
`launch.shutdown`'s closing `GLOO_RELEASE_S`.
"""

import os
import sys
import time

import torch.distributed as dist

rank, port, pause = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, wait_for_workers=False)
dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
for i in range(20):
    box = [i] if rank == 0 else [None]
    dist.broadcast_object_list(box, src=0, group=dist.group.WORLD)
dist.destroy_process_group()
if pause:
    time.sleep(pause)
if rank != 0:
    os._exit(0)  # as nanograph's workers leave
