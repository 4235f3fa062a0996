"""Helpers for the server tests: free ports, a server subprocess, polling /health, engines
with injected faults (module-level, so that a process front can build them in its child), and
an in-process server over a scripted front (answers given as text, token by token through a
byte-level tokenizer)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from nanograph.engine.front import Front, FrontStats, Update
from nanograph.engine.logprobs import TokenLogprob

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


def breaking_engine(config):
    """An Engine whose forward on a batch holding POISON fails as a tensor-parallel step that
    lost a rank does: it raises and leaves the engine ``broken``."""
    engine = faulty_engine(config)
    forward = engine.runner.forward

    def breaking_forward(batch, in_flight=None):
        try:
            return forward(batch, in_flight)
        except RuntimeError:
            engine.tp.broken = "rank 1 exited (injected)"
            raise

    engine.runner.forward = breaking_forward
    return engine


def dead_engine(config):
    """A child that dies at start-up without a word (as a crash or the OOM killer would)."""
    os._exit(3)


# prints the tools, a past turn's thinking under the name Qwen3's template reads, and for past
# calls their arguments as the template sees them (tojson: an object prints as one, a string
# would print quoted)
TEMPLATE = (
    "{% if tools %}[tools {{ tools | tojson }}]{% endif %}"
    "{% for m in messages %}<{{ m.role }}>"
    "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
    "{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<call {{ c.function.name }} "
    "{{ c.function.arguments | tojson }}>{% endfor %}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def byte_tokenizer():
    """A tokenizer of one token per byte (so a ``<tool_call>`` arrives in 11 steps), with
    ``TEMPLATE`` as its chat template."""
    from nanograph.bench.common import byte_tokenizer as hf_byte_tokenizer
    from nanograph.loader.tokenizer import Tokenizer

    hf = hf_byte_tokenizer()
    hf.chat_template = TEMPLATE
    return Tokenizer(hf)


class ScriptedFront(Front):
    """A front whose requests answer the texts of ``script`` (one per request, in order of
    submission), a token every few milliseconds, ending with ``finish_reason``; a request that
    asks for logprobs gets each token's as -1 (no alternatives)."""

    def __init__(self, tokenizer) -> None:
        super().__init__(max_queue=64, stats=FrontStats())
        self.tokenizer, self.max_model_len = tokenizer, 4096
        self.script: collections.deque[tuple[str, str]] = collections.deque()
        self.prompts: list[list[int]] = []
        self.params: list = []  # each request's SamplingParams
        self._running = False
        self._playing: set[asyncio.Task] = set()

    def answer(self, *texts: str, finish_reason: str = "stop") -> None:
        self.script.extend((text, finish_reason) for text in texts)

    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> None:
        super().start()
        self._running = True

    def stop(self, timeout: float) -> None:
        self._running = False

    def close(self) -> None:
        self._running = False

    def _send(self, command: tuple) -> None:
        if command[0] == "add":
            _, key, prompt, params = command
            self.prompts.append(prompt)
            self.params.append(params)
            text, reason = self.script.popleft()
            scored = params.logprobs is not None
            task = self._loop.create_task(self._play(key, text, reason, scored))
            self._playing.add(task)  # held: the loop keeps only weak references to tasks
            task.add_done_callback(self._playing.discard)

    async def _play(self, key: int, text: str, reason: str, scored: bool) -> None:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        self._deliver([(key, Update([]))])  # admitted
        for i, token in enumerate(ids):
            await asyncio.sleep(0.001)
            last = i == len(ids) - 1
            logprobs = [TokenLogprob(-1.0, ())] if scored else None
            update = Update([token], last, reason if last else None, logprobs=logprobs)
            self._deliver([(key, update)])


@contextlib.contextmanager
def in_process(front: Front, **options):
    """``build_app(front, "scripted", **options)`` served by uvicorn in a thread of this
    process; yields its base URL."""
    import uvicorn

    from nanograph.serve.app import build_app

    port = free_port()
    app = build_app(front, "scripted", **options)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: health(base), 30, "the in-process server")
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(30)


@contextlib.contextmanager
def scripted_server(tokenizer, **options):
    """A ``ScriptedFront`` on ``tokenizer`` behind ``in_process(front, **options)``; yields
    (base URL, front)."""
    front = ScriptedFront(tokenizer)
    with in_process(front, **options) as base:
        yield base, front
