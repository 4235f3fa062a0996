"""The client side of ``nanograph bench serve``: streamed requests and their timings, a point's
summary, nanograph's graph counters from /metrics, and a launched server.

Timings per request: TTFT is the first chunk carrying output; ITL the gaps between such chunks
(a chunk may carry several tokens); TPOT the time after the first token over the tokens after
it; output tokens come from the final ``usage`` (``stream_options.include_usage``), else from
the chunk count.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class Outcome:
    ok: bool
    prompt_len: int
    output_tokens: int = 0
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    error: str | None = None


async def _one(session, url: str, body: dict, prompt_len: int) -> Outcome:
    import aiohttp

    start = time.perf_counter()
    out = Outcome(False, prompt_len)
    last, chunks, usage = start, 0, None
    try:
        async with session.post(url, json=body) as r:
            if r.status != 200:
                out.error = f"HTTP {r.status}: {(await r.read())[:300].decode(errors='replace')}"
                return out
            async for line in r.content:  # one server-sent-events line at a time
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    out.error = str(chunk["error"])[:300]
                    return out
                usage = chunk.get("usage") or usage
                choices = chunk.get("choices") or []
                if choices and (choices[0].get("text") or choices[0].get("token_ids")):
                    now = time.perf_counter()
                    if out.ttft is None:
                        out.ttft = now - start
                    else:
                        out.itl.append(now - last)
                    last, chunks = now, chunks + 1
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as e:
        out.error = f"{type(e).__name__}: {e}"[:300]
        return out
    out.latency = time.perf_counter() - start
    out.output_tokens = usage["completion_tokens"] if usage else chunks
    out.ok = out.ttft is not None
    if not out.ok:
        out.error = "no token came back"
    return out


async def run_point(
    base_url: str,
    model: str,
    requests: list[tuple[list[int], int]],
    rate: float,
    concurrency: int,
    seed: int,
    api_key: str | None,
    timeout: float,
) -> tuple[list[Outcome], float]:
    """Sends ``requests`` (Poisson arrivals at ``rate``, at most ``concurrency`` in flight);
    returns their outcomes and the wall time from the first send to the last answer.

    aiohttp, not httpx: at a small model's saturation (~16k streamed chunks/s on the H200) the
    load generator itself ran at 100% of a core with httpx's async client: ~67 us of CPU per
    chunk through this function with httpx, ~34 us with aiohttp (this project's CPU machine,
    128 streams of 256 chunks from a local mock server), so the client set part of the
    measured ceiling."""
    import aiohttp

    rng = np.random.default_rng(seed)
    gate = asyncio.Semaphore(concurrency) if concurrency > 0 else None
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = f"{base_url}/v1/completions"

    async def send(prompt: list[int], output_len: int) -> Outcome:
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": output_len,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }
        if gate is None:
            return await _one(session, url, body, len(prompt))
        async with gate:
            return await _one(session, url, body, len(prompt))

    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),  # no cap on connections: the gate caps
        timeout=aiohttp.ClientTimeout(total=timeout),
        headers=headers,
    ) as session:
        start = time.perf_counter()
        tasks = []
        for i, (prompt, output_len) in enumerate(requests):
            if i and math.isfinite(rate):
                await asyncio.sleep(rng.exponential(1 / rate))
            tasks.append(asyncio.create_task(send(prompt, output_len)))
        outcomes = await asyncio.gather(*tasks)
    return list(outcomes), time.perf_counter() - start


def _stats_ms(values: list[float]) -> dict | None:
    if not values:
        return None
    ms = np.asarray(values) * 1000
    return {
        "mean": float(ms.mean()),
        "median": float(np.median(ms)),
        "p90": float(np.percentile(ms, 90)),
        "p99": float(np.percentile(ms, 99)),
    }


def summarize(outcomes: list[Outcome], duration: float) -> dict:
    ok = [o for o in outcomes if o.ok]
    tpot = [(o.latency - o.ttft) / (o.output_tokens - 1) for o in ok if o.output_tokens > 1]
    input_tokens, output_tokens = sum(o.prompt_len for o in ok), sum(o.output_tokens for o in ok)
    return {
        "completed": len(ok),
        "failed": len(outcomes) - len(ok),
        "duration_s": duration,
        "request_throughput": len(ok) / duration,
        "input_throughput": input_tokens / duration,
        "output_throughput": output_tokens / duration,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "ttft_ms": _stats_ms([o.ttft for o in ok]),
        "tpot_ms": _stats_ms(tpot),
        "itl_ms": _stats_ms([x for o in ok for x in o.itl]),
        "e2e_ms": _stats_ms([o.latency for o in ok]),
        "errors": sorted({o.error for o in outcomes if o.error})[:5],
    }


def forward_counts(base_url: str) -> dict[str, int] | None:
    """nanograph's graph replays / eager forwards per path, from /metrics (None elsewhere)."""
    import httpx

    try:
        text = httpx.get(f"{base_url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    pattern = r'^nanograph_forwards_total\{kind="(\w+)",path="(\w+)"\} (\S+)$'
    found = re.findall(pattern, text, re.M)
    return {f"{path}_{kind}": int(float(v)) for kind, path, v in found} or None


class LaunchedServer:
    """``nanograph serve FLAGS`` on a free loopback port; stopped with SIGTERM on exit."""

    def __init__(self, flags: str, log: Path, startup_timeout: float) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}"
        self.log = open(log, "w")  # noqa: SIM115 (closed in stop)
        cmd = [sys.executable, "-m", "nanograph", "serve", "--port", str(port), *shlex.split(flags)]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + startup_timeout
        while not _healthy(self.base_url):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"the server did not start (see {log})")
            time.sleep(0.5)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def _healthy(base_url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{base_url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def served_model(base_url: str, api_key: str | None) -> str:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.get(f"{base_url}/v1/models", headers=headers, timeout=30).json()["data"][0]["id"]
