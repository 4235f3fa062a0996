"""A tensor-parallel rank other than 0: builds its shard of the engine, then runs rank 0's steps.

``python -m nanograph.distributed.worker`` is what rank 0 spawns (the engine config arrives
pickled on stdin, the rank in the env:// variables). Under torchrun the same loop runs inside
the ``Engine`` constructor of ranks 1..N-1 (``serve_steps``).

Invariant: a worker leaves only by rank 0's stop message (exit 0) or by an error (exit 1, its
error logged with its rank and left in the store for rank 0); it never outlives a lost group:
a dead rank 0 makes the next gloo receive raise.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
from typing import TYPE_CHECKING, NoReturn

from nanograph.distributed.launch import close_groups, report_error
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
    sys.exit(0)


def fail(rank: int, error: BaseException, tp=None) -> NoReturn:
    logger.error("tensor-parallel rank %d failed: %s: %s", rank, type(error).__name__, error)
    if tp is not None:
        report_error(tp, error)
    sys.exit(1)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format=f"[rank {os.environ.get('RANK')}] %(message)s")
    # Ctrl-C reaches the whole process group: rank 0 decides (it stops the workers, or its exit
    # ends their next receive), so a worker does not die of it mid-collective
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    config = pickle.load(sys.stdin.buffer)
    from nanograph.engine.engine import Engine

    code = 1  # Engine returns only by raising here: serve_steps ends the process
    try:
        try:
            Engine(config)  # joins the group (RANK is set), loads its shard, then serve_steps
        except Exception as e:
            fail(int(os.environ["RANK"]), e)
    except SystemExit as done:  # serve_steps' or fail's exit: the process has nothing left
        code = done.code if isinstance(done.code, int) else 1
    # Leave without interpreter teardown: a worker whose work was done once printed "terminate
    # called without an active exception" at exit (a C++ thread of torch.distributed destroyed
    # while joinable; seen in 2 of ~10 CPU bench runs). Flush what it printed first.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
