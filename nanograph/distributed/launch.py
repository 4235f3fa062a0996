"""Starting and stopping a tensor-parallel group: one command starts every rank.

Two ways in, one rendezvous (torch.distributed's ``env://`` variables: ``MASTER_ADDR``,
``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``):
- Spawned (the default): the process that builds the engine is rank 0. It hosts the
  rendezvous store and starts ranks 1..N-1 as ``python -m nanograph.distributed.worker``
  subprocesses with those variables set (the engine config arrives on their stdin). No user
  script is re-imported, so no ``if __name__ == "__main__"`` guard is needed.
- External (``torchrun``, or the variables set by hand on each node): every rank runs the same
  command; ``RANK`` says which one this process is. Ranks other than 0 serve rank 0's steps
  inside the engine's constructor and exit the process when rank 0 shuts down.

Invariants:
- Start-up never waits forever: rank 0 waits for every rank to reach the store, polling the
  spawned processes, so a rank that dies first is reported at once with its exit code and
  error; a rank that never comes is reported after ``timeout_s``. Every later collective of the
  group is bounded by the same timeout.
- A worker that fails writes ``nanograph/error/<rank>`` into the store before it exits; rank 0's
  watchdog thread reads it when the process ends, logs it and sets ``tp.peer_failure``, so the
  error rank 0 raises names the rank and its error.
- ``shutdown`` is idempotent and also runs at exit: it tells the workers to stop, waits for
  them briefly (spawned ones to exit, ones started by torchrun to say they closed their groups),
  kills what is left and destroys the process groups.
"""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from nanograph.distributed.collectives import register_group, unregister_group
from nanograph.distributed.group import TensorParallel, TensorParallelError

if TYPE_CHECKING:
    from nanograph.engine.config import EngineConfig

logger = logging.getLogger("nanograph")

ALIVE_KEY = "nanograph/alive/{}"
ERROR_KEY = "nanograph/error/{}"
LEFT_KEY = "nanograph/left/{}"  # a worker closed its groups and is leaving
# how often rank 0 looks at the store and the worker processes while it waits for them
POLL_S = 0.05
# how long shutdown waits for workers to leave on their own before it kills them
EXIT_WAIT_S = 10.0
# how long shutdown releases the GIL at its end, for gloo's threads to let go of tensors
GLOO_RELEASE_S = 0.05


class _Launch:
    """What rank 0 keeps of a spawned group: the store, the worker processes, the watchdog."""

    def __init__(self, store: dist.TCPStore, workers: dict[int, subprocess.Popen]) -> None:
        self.store = store
        self.workers = workers
        self.stopping = False


_launches: dict[int, _Launch] = {}  # id(tp) -> its launch (rank 0 of a spawned group)


def start(config: EngineConfig) -> TensorParallel:
    """This process's tensor-parallel group for ``config`` (rank 0 spawns the others)."""
    size = config.tensor_parallel_size
    if size == 1:
        return TensorParallel(device=config.torch_device)
    if dist.is_initialized():
        raise ValueError(
            "a tensor-parallel engine is already running in this process: close() it before "
            "starting another one"
        )
    if "RANK" in os.environ:  # torchrun, or env:// variables set by hand, or our own worker
        return _join(config, int(os.environ["RANK"]), dict(os.environ), workers={})
    if config.torch_device.type == "cuda" and size > torch.cuda.device_count():
        raise ValueError(
            f"tensor_parallel_size={size} needs {size} GPUs but {torch.cuda.device_count()} are "
            "visible; lower it, or start ranks on several machines (env:// or torchrun)"
        )
    store = dist.TCPStore("127.0.0.1", 0, size, True, _timeout(config), wait_for_workers=False)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port))
    workers = {rank: _spawn(config, rank, env) for rank in range(1, size)}
    try:
        return _join(config, 0, env, workers, store)
    except BaseException:
        for proc in workers.values():
            _stop_process(proc, wait_s=0.0)
        raise


@contextmanager
def failure_reported(tp: TensorParallel) -> Iterator[None]:
    """Around an engine's start-up: if it raises, rank 0 stops the workers and a worker leaves
    its error for rank 0 (its process then exits with it)."""
    try:
        yield
    except BaseException as e:
        if tp.enabled and tp.is_driver:
            tp.broken = tp.broken or f"rank 0 failed to start: {type(e).__name__}: {e}"
            shutdown(tp)
        elif tp.enabled:
            report_error(tp, e)
        raise


def _timeout(config: EngineConfig) -> timedelta:
    return timedelta(seconds=config.distributed_timeout_s)


def _spawn(config: EngineConfig, rank: int, env: dict[str, str]) -> subprocess.Popen:
    package_root = str(Path(__file__).resolve().parents[2])  # where ``nanograph`` imports from
    path = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env = dict(env, RANK=str(rank), LOCAL_RANK=str(rank), PYTHONPATH=path,
               WORLD_SIZE=str(config.tensor_parallel_size))  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "nanograph.distributed.worker"], stdin=subprocess.PIPE, env=env
    )
    proc.stdin.write(pickle.dumps(config))
    proc.stdin.close()
    return proc


def _join(
    config: EngineConfig,
    rank: int,
    env: dict[str, str],
    workers: dict[int, subprocess.Popen],
    store: dist.TCPStore | None = None,
) -> TensorParallel:
    size = config.tensor_parallel_size
    world = int(env.get("WORLD_SIZE", size))
    if world != size:
        raise ValueError(
            f"tensor_parallel_size={size} but WORLD_SIZE={world}: launch one process per rank"
        )
    if store is None:  # the env:// store: rank 0 hosts it unless torchrun's agent does
        agent = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        store = dist.TCPStore(
            env["MASTER_ADDR"], int(env["MASTER_PORT"]), size, rank == 0 and not agent,
            _timeout(config), wait_for_workers=False,
        )  # fmt: skip
    device = _device(config, int(env.get("LOCAL_RANK", rank)))
    if rank == 0:
        _wait_for_ranks(store, size, workers, config.distributed_timeout_s)
    else:
        store.set(ALIVE_KEY.format(rank), "1")
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=size, timeout=_timeout(config),
        device_id=device if device.type == "cuda" else None,
    )  # fmt: skip
    world_group = dist.group.WORLD
    cpu_group = (
        dist.new_group(backend="gloo", timeout=_timeout(config)) if backend == "nccl"
        else world_group
    )  # fmt: skip
    name = world_group.group_name
    register_group(name, world_group)
    tp = TensorParallel(
        rank=rank, size=size, device=device, timeout_s=config.distributed_timeout_s,
        device_group=world_group, cpu_group=cpu_group, group_name=name, store=store,
    )  # fmt: skip
    if rank == 0:
        launch = _launches[id(tp)] = _Launch(store, workers)
        tp.find_failure = lambda: _dead_worker(launch)
        if workers:
            threading.Thread(
                target=_watch, args=(tp, launch), name="nanograph-tp-watchdog", daemon=True
            ).start()
        atexit.register(shutdown, tp)
    return tp


def _device(config: EngineConfig, local_rank: int) -> torch.device:
    if config.torch_device.type != "cuda":
        return torch.device("cpu")
    if local_rank >= torch.cuda.device_count():
        raise TensorParallelError(
            f"local rank {local_rank} needs GPU {local_rank} but this node has "
            f"{torch.cuda.device_count()}; start at most that many ranks per node"
        )
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def _wait_for_ranks(
    store: dist.TCPStore, size: int, workers: dict[int, subprocess.Popen], timeout_s: float
) -> None:
    """Returns once every rank reached the store; raises at once if a worker died first."""
    deadline = time.monotonic() + timeout_s
    waiting = set(range(1, size))
    while waiting:
        waiting = {r for r in waiting if not store.check([ALIVE_KEY.format(r)])}
        for rank in sorted(waiting):
            proc = workers.get(rank)
            if proc is not None and proc.poll() is not None:
                raise TensorParallelError(
                    f"rank {rank} exited during start-up (exit code {proc.returncode}): "
                    f"{_reported_error(store, rank) or 'see its output above'}"
                )
        if waiting and time.monotonic() > deadline:
            raise TensorParallelError(
                f"rank(s) {sorted(waiting)} did not join within {timeout_s:.0f} s "
                "(distributed_timeout_s); check that every rank was started with the same "
                "MASTER_ADDR/MASTER_PORT and WORLD_SIZE"
            )
        if waiting:
            time.sleep(POLL_S)


def _reported_error(store: dist.TCPStore, rank: int) -> str | None:
    key = ERROR_KEY.format(rank)
    try:
        return store.get(key).decode() if store.check([key]) else None
    except RuntimeError:
        return None


def report_error(tp: TensorParallel, error: BaseException) -> None:
    """A worker's last words: its error where rank 0 can read it (best effort)."""
    try:
        tp.store.set(ERROR_KEY.format(tp.rank), f"{type(error).__name__}: {error}")
    except Exception:  # the store went away with rank 0: nobody is left to tell
        pass


def _dead_worker(launch: _Launch, wait_s: float = 1.0) -> str | None:
    """The first worker that exited, with its exit code and error; waits up to ``wait_s`` for
    one (a collective fails as soon as a peer's socket closes, a moment before it is reaped)."""
    deadline = time.monotonic() + wait_s
    while True:
        for rank, proc in launch.workers.items():
            if proc.poll() is not None:
                error = _reported_error(launch.store, rank) or "see its output above"
                return f"rank {rank} exited (exit code {proc.returncode}): {error}"
        if time.monotonic() > deadline:
            return None
        time.sleep(POLL_S)


def _watch(tp: TensorParallel, launch: _Launch) -> None:
    """Rank 0: notices a worker that exits while the engine runs, and names its error."""
    while not launch.stopping:
        failure = _dead_worker(launch, wait_s=0.0)
        if failure is not None and not launch.stopping:
            tp.peer_failure = tp.peer_failure or failure
            logger.error("tensor parallel: %s", failure)
            return
        time.sleep(POLL_S * 4)


def _stop_process(proc: subprocess.Popen, wait_s: float) -> None:
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def shutdown(tp: TensorParallel) -> None:
    """Rank 0: stops the workers and ends the group. Idempotent; a no-op with one rank."""
    launch = _launches.pop(id(tp), None)
    if launch is None:
        return
    launch.stopping = True
    if tp.peer_failure is None and tp.broken is None:
        from nanograph.distributed.steps import send_stop

        try:
            send_stop(tp)
        except Exception as e:  # a worker already gone: they are killed below
            logger.debug("tensor parallel: stop message not delivered: %r", e)
    for proc in launch.workers.values():
        _stop_process(proc, wait_s=EXIT_WAIT_S)
    # ranks started by torchrun are not ours to wait for: wait for their word that they closed
    # their groups, so that ours are not torn down under their teardown (rank 0 once aborted at
    # exit after closing its groups while rank 1 closed its own)
    others = [r for r in range(1, tp.size) if r not in launch.workers]
    if others and tp.peer_failure is None and tp.broken is None:
        _wait_for_keys(launch.store, [LEFT_KEY.format(r) for r in others], EXIT_WAIT_S)
    close_groups(tp)  # the peers are gone: nothing can wait on them
    # A gloo worker thread lets go of a collective's tensors just after the collective's wait()
    # returns, and letting go of a tensor Python made takes the GIL. Were the interpreter
    # finalising by then (a torchrun script ending right after close()), that thread would be
    # told to exit inside a destructor: "terminate called without an active exception",
    # SIGABRT. Releasing the GIL a moment lets it finish first (docs/wip/gloo_exit_race.py:
    # 16 of 120 immediate exits aborted, 0 of 60 after 50 ms).
    time.sleep(GLOO_RELEASE_S)


def _wait_for_keys(store: dist.TCPStore, keys: list[str], wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    try:
        while not store.check(keys) and time.monotonic() < deadline:
            time.sleep(POLL_S)
    except RuntimeError:  # the store went away: nobody is left to wait for
        pass


def left(tp: TensorParallel) -> None:
    """A worker's word to rank 0 that it closed its groups and is leaving (best effort)."""
    try:
        tp.store.set(LEFT_KEY.format(tp.rank), "1")
    except Exception:  # rank 0 and its store are gone: nobody is waiting
        pass


def close_groups(tp: TensorParallel) -> None:
    unregister_group(tp.group_name)
    if dist.is_initialized():
        dist.destroy_process_group()
