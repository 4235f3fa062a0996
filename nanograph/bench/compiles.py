"""Triton compilations seen by a benchmark process: which kernels compiled, how long each took,
and which came from the disk cache. What ``bench startup`` reports so that a slow cold start
names the kernels it spent its time on.

It listens through Triton's compilation listener (``triton.knobs.compilation.listener``, Triton
3.4 and later): Triton calls it after every compile and every cache hit with the stage timings.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple, TextIO

TOP_KERNELS = 8  # kernels listed by name in a summary, the slowest to compile first


class Compile(NamedTuple):
    at_s: float  # seconds since the log began
    kernel: str
    seconds: float
    cache_hit: bool
    stages: tuple[tuple[str, float], ...]  # (lowering stage, seconds)


@dataclass
class CompileLog:
    started: float  # perf_counter() when the log began
    available: bool = True
    events: list[Compile] = field(default_factory=list)

    def summary(self, after_s: float = 0.0, until_s: float = float("inf")) -> dict:
        """Compiles between ``after_s`` and ``until_s`` seconds since the log began."""
        events = [e for e in self.events if after_s <= e.at_s < until_s]
        compiled = [e for e in events if not e.cache_hit]
        by_kernel: dict[str, list[float]] = {}
        stage_s: dict[str, float] = {}
        for e in compiled:
            by_kernel.setdefault(e.kernel, []).append(e.seconds)
            for stage, seconds in e.stages:
                stage_s[stage] = stage_s.get(stage, 0.0) + seconds
        top = sorted(by_kernel.items(), key=lambda kv: -sum(kv[1]))[:TOP_KERNELS]
        return {
            "available": self.available,
            "compiled": len(compiled),
            "cache_hits": len(events) - len(compiled),
            "compile_s": sum(e.seconds for e in compiled),
            "last_compile_at_s": max((e.at_s for e in compiled), default=None),
            "stage_s": stage_s,
            "top": [
                {
                    "kernel": name,
                    "variants": len(times),
                    "seconds": sum(times),
                    "slowest_s": max(times),
                }
                for name, times in top
            ],  # fmt: skip
        }


@contextlib.contextmanager
def triton_compiles(echo: TextIO | None = None) -> Iterator[CompileLog]:
    """Records every Triton compile and cache hit inside the block (``available`` is False
    where Triton is missing or has no listener); ``echo`` gets a line per compile as it ends
    (what a process killed at a timeout leaves behind)."""
    log = CompileLog(started=time.perf_counter())
    try:
        from triton import knobs

        compilation = knobs.compilation
        previous = compilation.listener
    except (ImportError, AttributeError):
        log.available = False
        yield log
        return

    def listen(**event) -> None:  # keywords: Triton's listener protocol may grow
        try:
            src, metadata, times = event["src"], event["metadata"], event["times"]
            name = metadata.get("name") or getattr(getattr(src, "fn", None), "__name__", "?")
            stages = list(times.lowering_stages)
            total_us = times.ir_initialization + sum(t for _, t in stages) + times.store_results
            record = Compile(
                time.perf_counter() - log.started, name, total_us / 1e6,
                bool(event["cache_hit"]), tuple((stage, us / 1e6) for stage, us in stages),
            )  # fmt: skip
            log.events.append(record)
            if echo is not None and not record.cache_hit:
                print(f"compiled {name} in {record.seconds:.1f} s at {record.at_s:.1f} s",
                      file=echo, flush=True)  # fmt: skip
        except (KeyError, AttributeError, TypeError):  # never fail a compile over a record
            log.available = False
        if previous is not None:
            previous(**event)

    compilation.listener = listen
    try:
        yield log
    finally:
        compilation.listener = previous
