"""The server in-process on a tiny random Qwen3 (token-id prompts), over both fronts (the
engine's loop in a thread, and in a child process): an internal error fails one request only, a
full queue answers 503, and arbitrary request bodies mixed with valid ones (hypothesis) leave
valid requests with the tokens they get alone and the KV pool as it was. Then the fronts alone:
abort frees pages at once (read through the stats), stop with requests in flight, and for the
process front, a child that fails or dies at start-up or while serving (a dead one ends the
server with status 1).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
import uvicorn  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from serving import (  # noqa: E402
    ADD_POISON,
    POISON,
    ROOT,
    ServerProcess,
    breaking_engine,
    dead_engine,
    faulty_engine,
    free_port,
    health,
    wait_pages_free,
    wait_until,
)

from nanograph import LLM, SamplingParams  # noqa: E402
from nanograph.engine.config import EngineConfig  # noqa: E402
from nanograph.engine.engine import Engine  # noqa: E402
from nanograph.engine.front import EngineFront, ShuttingDown, Update  # noqa: E402
from nanograph.engine.process_front import ProcessFront  # noqa: E402
from nanograph.serve.app import build_app  # noqa: E402

VOCAB = 255  # valid prompts stay below 255, so only the poisoned prompt holds the pattern
ENGINE = dict(page_size=4, kv_cache_bytes=8 * 2**20, max_num_seqs=4, progress=False)
FRONTS = ["thread", "process"]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return str(tiny_model_dir("qwen3"))


@pytest.fixture(scope="module")
def reference(tiny):
    llm = LLM(tiny, **ENGINE)
    cache: dict = {}

    def tokens(prompt: list[int], max_tokens: int) -> list[int]:
        key = (tuple(prompt), max_tokens)
        if key not in cache:
            params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
            cache[key] = llm.generate([prompt], params)[0].token_ids
        return cache[key]

    return tokens


def _front(kind: str, tiny: str, build=Engine):
    config = EngineConfig(model=tiny, **ENGINE)
    return EngineFront(build(config)) if kind == "thread" else ProcessFront(config, build=build)


@pytest.fixture(scope="module", params=FRONTS)
def server(request, tiny):
    front = _front(request.param, tiny, faulty_engine)
    port = free_port()
    config = uvicorn.Config(
        build_app(front, "tiny"), host="127.0.0.1", port=port, log_level="error"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: health(base), 60, "the in-process server")
    yield base, front
    server.should_exit = True
    thread.join(30)
    assert not front.running
    front.close()


def _body(prompt, max_tokens, stream=False) -> dict:
    return {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": stream,
    }


def _tokens(response: httpx.Response, stream: bool) -> list[int]:
    if not stream:
        return response.json()["choices"][0]["token_ids"]
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [t for e in events[:-1] for t in json.loads(e)["choices"][0].get("token_ids", [])]


async def _post_all(base: str, bodies: list) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        calls = [
            client.post("/v1/completions", content=b if isinstance(b, bytes) else json.dumps(b))
            for b in bodies
        ]
        return await asyncio.wait_for(asyncio.gather(*calls), 120)


def test_internal_error_fails_that_request_only(server, reference):
    base, _ = server
    start = wait_pages_free(base)
    good = [[1, 2, 3, 4, 5], [7] * 11, [9, 8]]
    bodies = [
        _body(good[0], 6),
        _body([3, *POISON, 4], 6),
        _body(good[1], 6, stream=True),
        _body(good[2], 6),
    ]
    responses = asyncio.run(_post_all(base, bodies))
    assert responses[1].status_code == 500
    assert responses[1].json()["error"]["type"] == "server_error"
    for prompt, r, stream in zip(
        good, [responses[0], responses[2], responses[3]], [False, True, False]
    ):
        assert r.status_code == 200 and _tokens(r, stream) == reference(prompt, 6)
    assert wait_pages_free(base)["kv_pages_available"] == start["kv_pages_available"]


@pytest.mark.parametrize("stream", [False, True])
def test_an_internal_error_at_admission_answers_500_not_a_hang(server, stream):
    """The engine failing inside add_request (a bug, not the caller's mistake): that request
    gets a 500 (streamed: an error event) at once; its first update was its last one."""
    base, _ = server
    with httpx.Client(base_url=base, timeout=20) as client:
        r = client.post("/v1/completions", json=_body([*ADD_POISON, 5], 4, stream=stream))
    if stream:
        events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        assert any("internal error" in e for e in events) and events[-1] == "[DONE]"
    else:
        assert r.status_code == 500 and "internal error" in r.json()["error"]["message"]


def test_full_queue_answers_503_with_retry_after(server, reference):
    base, front = server
    front.max_queue = 0  # nothing may wait: every request is refused before it is enqueued
    try:
        r = httpx.post(f"{base}/v1/completions", json=_body([1, 2], 2), timeout=30)
    finally:
        front.max_queue = 1024
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "queue_full"
    r = httpx.post(f"{base}/v1/completions", json=_body([1, 2], 2), timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == reference([1, 2], 2)


FIELDS = [
    "prompt",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "n",
    "stream",
    "ignore_eos",
    "stop_token_ids",
    "model",
    "logprobs",
    "presence_penalty",
    "repetition_penalty",
    "logit_bias",
    "messages",
    "min_tokens",
    "prompt_logprobs",
    "echo",
    "truncate_prompt_tokens",
    "allowed_token_ids",
    "bad_words",
    "response_format",
    "structured_outputs",
    "guided_choice",
    "regex",
    "tools",
    "tool_choice",
    "stream_options",
]
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**65), 2**65)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=8,
)
valid = st.builds(
    lambda p, m, s: ("valid", p, m, s),
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=24),
    st.integers(1, 6),
    st.booleans(),
)
arbitrary = st.one_of(
    st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=5),
    st.fixed_dictionaries(
        {"prompt": st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=4)},
        optional={f: json_values for f in FIELDS[1:]},
    ),
    json_values,
    st.binary(max_size=16),
).map(lambda body: ("arbitrary", body))


@settings(
    max_examples=12,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(valid | arbitrary, min_size=1, max_size=6))
def test_arbitrary_bodies_mixed_with_valid_requests(server, reference, requests):
    base, _ = server
    start = wait_pages_free(base)
    bodies = [_body(r[1], r[2], r[3]) if r[0] == "valid" else r[1] for r in requests]
    responses = asyncio.run(_post_all(base, bodies))
    for request, r in zip(requests, responses):
        if request[0] == "valid":
            assert r.status_code == 200, r.text
            assert _tokens(r, request[3]) == reference(request[1], request[2])
        else:
            assert r.status_code == 200 or 400 <= r.status_code < 500, r.text
            if r.status_code != 200:
                assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert wait_pages_free(base)["kv_pages_available"] == start["kv_pages_available"]


def _on_server_loop(front, coroutine, timeout: float = 60):
    """Runs ``coroutine`` on the event loop the front delivers to (the server's)."""
    return asyncio.run_coroutine_threadsafe(coroutine, front._loop).result(timeout)


LONG = SamplingParams(max_tokens=1000, temperature=0, ignore_eos=True)


def test_abort_frees_pages_at_once(server, reference):
    base, front = server
    start = wait_pages_free(base)

    async def abort_after_first_tokens():
        stream = front.submit([5, 6, 7, 8, 9], LONG)
        await stream.admitted()
        updates = stream.updates()
        first = await anext(updates)
        front.abort(stream)
        rest = [u async for u in updates]
        # the snapshot that came with the finishing update already counts the pages free
        return first, rest[-1], front.stats

    first, last, stats = _on_server_loop(front, abort_after_first_tokens())
    assert (
        first.token_ids
        and first.token_ids == reference([5, 6, 7, 8, 9], 1000)[: len(first.token_ids)]
    )
    assert last.finished and last.finish_reason == "abort"
    assert stats.kv_pages_available == start["kv_pages_available"]
    assert stats.running == 0 and stats.waiting == 0


@pytest.mark.parametrize("kind", FRONTS)
def test_stop_finishes_or_aborts_requests_in_flight(tiny, reference, kind):
    front = _front(kind, tiny)

    async def stop_while_serving():
        front.start()
        short = front.submit(
            [1, 2, 3], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
        )
        long = front.submit([4, 5, 6], LONG)
        for stream in (short, long):
            await stream.admitted()
        first = await anext(long.updates())
        assert first.token_ids
        await asyncio.to_thread(front.stop, 0.3)
        with pytest.raises(ShuttingDown):
            front.submit([1], LONG)
        ends = []
        for stream in (short, long):
            ends.append([u async for u in stream.updates()][-1])
        return ends

    try:
        short, long = asyncio.run(asyncio.wait_for(stop_while_serving(), 120))
    finally:
        front.close()
    assert short.finish_reason == "length" and long.finish_reason == "abort"
    assert "shut down" in long.error
    assert not front.running and not front.failed  # asked to stop: no failure
    assert front.stats.kv_pages_available == front.stats.kv_pages_total
    if kind == "process":
        assert front._process.exitcode == 0


def test_process_front_child_death_fails_live_streams(tiny):
    front = ProcessFront(EngineConfig(model=tiny, **ENGINE))

    async def kill_while_serving():
        front.start()
        stream = front.submit([4, 5, 6], LONG)
        await stream.admitted()
        await anext(stream.updates())
        front._process.kill()
        last = [u async for u in stream.updates()][-1]
        await asyncio.to_thread(wait_until, lambda: not front.running, 30, "running to turn False")
        with pytest.raises(ShuttingDown):
            front.submit([1], LONG)
        return last

    try:
        last = asyncio.run(asyncio.wait_for(kill_while_serving(), 120))
    finally:
        front.close()
    assert last.finished and last.finish_reason == "error"
    assert "engine process ended" in last.error
    assert front.failed  # and it stays so after close's stop


@pytest.mark.parametrize("kind", FRONTS)
def test_a_broken_engine_ends_the_loop_and_the_front_fails(kind, tiny):
    """A step that leaves the engine ``broken`` (a tensor-parallel rank lost) fails the live
    requests and ends the loop, instead of failing every later request."""
    front = _front(kind, tiny, breaking_engine)

    async def break_while_serving():
        front.start()
        live = front.submit([4, 5, 6], LONG)
        await live.admitted()
        await anext(live.updates())
        poisoned = front.submit([1, *POISON], LONG)
        ends = [[u async for u in s.updates()][-1] for s in (live, poisoned)]
        await asyncio.to_thread(wait_until, lambda: front.failed, 30, "the front to fail")
        with pytest.raises(ShuttingDown):
            front.submit([1], LONG)
        return ends

    try:
        ends = asyncio.run(asyncio.wait_for(break_while_serving(), 120))
    finally:
        front.close()
    live, poisoned = ends
    assert poisoned.finish_reason == "error" and "injected fault" in poisoned.error
    assert live.finish_reason == "error"  # its step ran well alone: the engine's state ended it
    assert live.error == "the engine cannot serve any more: rank 1 exited (injected)"
    assert front.failed and not front.running


def test_the_server_exits_1_when_its_engine_process_dies(tiny):
    """A stream in flight gets an error event, then the server shuts down by itself with
    status 1 (a supervisor's cue to start it again), as vLLM's and SGLang's do."""
    server = ServerProcess("--model", tiny, "--max-num-seqs", "2", "--quiet")
    try:
        body = {"prompt": [4, 5, 6], "max_tokens": 4000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{server.base}/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            os.kill(_engine_process(server.proc.pid), signal.SIGKILL)
            events = [line[6:] for line in lines if line.startswith("data: ")]
        error = json.loads(events[-2] if events[-1] == "[DONE]" else events[-1])
        assert "engine process ended" in json.dumps(error)
        assert server.proc.wait(30) == 1
        assert "the engine stopped serving: shutting the server down" in server.output()
    finally:
        server.stop()


def _engine_process(server: int) -> int:
    """The server's spawned child that runs the engine (not multiprocessing's tracker)."""
    children = Path(f"/proc/{server}/task/{server}/children").read_text().split()
    return next(int(c) for c in children
                if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes())  # fmt: skip


def test_process_front_reports_a_child_that_dies_at_start_up(tiny):
    with pytest.raises(RuntimeError, match="exited with code 3 before it was ready"):
        ProcessFront(EngineConfig(model=tiny, **ENGINE), build=dead_engine)


def test_serve_exits_2_with_the_childs_start_up_error(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "nosuch"}')
    (tmp_path / "model.safetensors").touch()
    r = subprocess.run(
        [sys.executable, "-m", "nanograph", "serve", "--engine-process", "--model", str(tmp_path)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert "unsupported model_type 'nosuch'" in r.stderr.splitlines()[-1]


def test_wire_reads_every_waiting_message_at_once_and_frames_survive_any_split():
    from nanograph.engine import process_wire as wire

    updates = [Update([1, 2]), Update([], rejected=True, finished=True, error="too long"),
               Update([3], True, "stop", None, "text", cached_tokens=16)]  # fmt: skip
    assert [wire.from_wire(wire.to_wire(k, u)) for k, u in enumerate(updates)] == list(
        enumerate(updates)
    )
    r, w = os.pipe()
    reader = wire.Reader(r)
    small = [("step", i, list(range(i))) for i in range(3)]
    for message in small:
        wire.write_message(w, message)
    assert reader.read() == small  # all three in one read: the receiver drains in bursts
    big = ("big", list(range(300_000)))  # larger than the pipe: written in parts, read whole
    writer = threading.Thread(target=lambda: [wire.write_message(w, m) for m in (big, small[1])])
    writer.start()
    got = []
    while len(got) < 2:
        got += reader.read()
    writer.join()
    assert got == [big, small[1]]
    os.close(w)
    with pytest.raises(EOFError):
        reader.read()
    os.close(r)


def test_server_imports_nothing_below_the_engine():
    """DESIGN.md: serve/ talks to the engine's front, never to runners, graphs or models."""
    import ast
    from pathlib import Path

    import nanograph.serve

    below = (
        "nanograph.runners",
        "nanograph.graph",
        "nanograph.models",
        "nanograph.attention",
        "nanograph.kernels",
        "nanograph.layers",
        "nanograph.loader",
    )
    for path in Path(nanograph.serve.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom | ast.Import):
                names = (
                    [node.module]
                    if isinstance(node, ast.ImportFrom)
                    else [a.name for a in node.names]
                )
                assert not any(n and n.startswith(below) for n in names), (path.name, names)
