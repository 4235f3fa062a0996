"""A tensor-parallel rank other than 0: builds its shard of the engine, then runs rank 0's steps.

``python -m nanograph.distributed.worker`` is what rank 0 spawns (the engine config arrives
pickled on stdin, the rank in the env:// variables). Under torchrun the same loop runs inside
the ``Engine`` constructor of ranks 1..N-1 (``serve_steps``).

Invariant: a worker leaves only by rank 0's stop message (exit 0) or by an error (exit 1, its
error logged with its rank and left in the store for rank 0); it never outlives a lost group:
a dead rank 0 makes the next gloo receive raise. It leaves without interpreter teardown
(``leave``), spawned or started by torchrun: its process has nothing left to do.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
from typing import TYPE_CHECKING, NoReturn

from nanograph.distributed.launch import close_groups, left, report_error
from nanograph.distributed.steps import receive_step

if TYPE_CHECKING:
    from nanograph.engine.engine import Engine

logger = logging.getLogger("nanograph")


def serve_steps(engine: Engine) -> NoReturn:
    """Runs every step rank 0 sends through this rank's runner; exits the process at the end."""
    tp = engine.tp
    try:
        while (step := receive_step(tp)) is not None:
            engine.runner.forward(*step)
    except BaseException as e:
        fail(tp.rank, e, tp)
    close_groups(tp)
    left(tp)
    leave(0)


def fail(rank: int, error: BaseException, tp=None) -> NoReturn:
    logger.error("tensor-parallel rank %d failed: %s: %s", rank, type(error).__name__, error)
    if tp is not None:
        report_error(tp, error)
    leave(1)


def leave(code: int) -> NoReturn:
    """Ends the process without interpreter teardown: a rank whose work was done sometimes
    printed "terminate called without an active exception" at exit and ended with SIGABRT (a
    gloo worker thread letting go of a collective's tensors needs the GIL, and during
    finalisation that ends the thread inside a destructor; rank 0 waits it out instead:
    ``launch.shutdown``). What it printed is flushed first."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format=f"[rank {os.environ.get('RANK')}] %(message)s")
    # Ctrl-C reaches the whole process group: rank 0 decides (it stops the workers, or its exit
    # ends their next receive), so a worker does not die of it mid-collective
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    config = pickle.load(sys.stdin.buffer)
    from nanograph.engine.engine import Engine

    try:
        Engine(config)  # joins the group (RANK is set), loads its shard, then serve_steps
    except Exception as e:  # start-up failed (serve_steps ends the process itself)
        fail(int(os.environ["RANK"]), e)
    leave(1)  # unreachable: Engine returns only through serve_steps, which never returns


if __name__ == "__main__":
    main()
