"""Helpers for the server tests: free ports, a server subprocess, polling /health, and engines
with injected faults (module-level, so that a process front can build them in its child)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def health(base: str) -> dict | None:
    try:
        r = httpx.get(f"{base}/health", timeout=2)
    except httpx.HTTPError:
        return None
    return r.json() if r.status_code == 200 else None


def wait_pages_free(base: str, timeout: float = 20) -> dict:
    """The /health body once no request holds a KV page (every page is free or an evictable
    prefix-cache page) and none runs or waits."""

    def idle():
        h = health(base)
        ok = h and h["kv_pages_available"] == h["kv_pages_total"]
        ok = ok and not h["running"] + h["waiting"]
        return h if ok else None

    return wait_until(idle, timeout, "every KV page to be free")


class ServerProcess:
    """``python -m nanograph serve ARGS`` on a free loopback port, stopped with SIGTERM."""

    def __init__(self, *args: str, startup_timeout: float = 120) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.log = tempfile.TemporaryFile("w+")  # a pipe nobody reads could block the server
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nanograph", "serve", "--port", str(self.port), *args],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            wait_until(
                lambda: self.proc.poll() is not None or health(self.base),
                startup_timeout,
                "the server to start",
            )
        except AssertionError:
            self.stop()
            raise
        if self.proc.poll() is not None:
            raise RuntimeError(f"the server exited at start-up:\n{self.output()}")

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, then the exit status (killed after ``timeout`` seconds: a failure)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return -9

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()


POISON = [255, 0, 255, 0]  # a prompt holding these tokens makes the forward of faulty_engine raise
ADD_POISON = [0, 255, 255, 0]  # a prompt starting with these makes its add_request raise


def faulty_engine(config):
    """An Engine whose forward raises on a batch holding POISON, and whose add_request raises
    on a prompt starting with ADD_POISON."""
    from nanograph.engine.engine import Engine

    engine = Engine(config)
    forward = engine.runner.forward

    def faulty_forward(batch, in_flight=None):
        ids, n = batch.input_ids, len(POISON)
        if any(ids[i : i + n] == POISON for i in range(len(ids) - n + 1)):
            raise RuntimeError("injected fault")
        return forward(batch, in_flight)

    engine.runner.forward = faulty_forward
    add_request = engine.add_request

    def faulty_add(prompt, params):
        if list(prompt[: len(ADD_POISON)]) == ADD_POISON:
            raise RuntimeError("injected admission fault")
        return add_request(prompt, params)

    engine.add_request = faulty_add
    return engine


def dead_engine(config):
    """A child that dies at start-up without a word (as a crash or the OOM killer would)."""
    os._exit(3)
