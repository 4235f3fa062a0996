"""What every engine benchmark shares: environment record, medians, JSON + figure output."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def environment() -> dict[str, Any]:
    """Device, versions and commit (``NANOGRAPH_COMMIT`` where the tree has no .git)."""
    commit = os.environ.get("NANOGRAPH_COMMIT")
    if not commit:
        try:
            commit = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            commit = "unknown"
    env: dict[str, Any] = {
        "torch": torch.__version__, "commit": commit, "time": time.ctime(),
        "command": "nanograph " + " ".join(sys.argv[1:]),
    }  # fmt: skip
    if torch.cuda.is_available():
        import triton

        env["device"] = torch.cuda.get_device_name()
        env["triton"] = triton.__version__
    else:
        env["device"] = "cpu"
    return env


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], repeats: int, warmup: int = 2) -> list[float]:
    """Wall-clock seconds of ``fn`` (device synchronised around each call), after warm-up."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - start)
    return samples


L2_FLUSH_BYTES = 256 * 2**20  # five times the H200's 50 MiB L2


def graphed_samples(fn: Callable[[], object], rep_ms: int, warmup_ms: int = 25) -> list[float]:
    """Samples (ms, CUDA events) of ``fn`` captured in a CUDA graph and replayed, as the engine
    runs it: a 50 us kernel launched from Python would measure the launch path, not the kernel.

    Before each sample the L2 is flushed by *reading* 256 MiB, so it holds clean lines, as in
    the engine (weights streamed through it). ``triton.testing.do_bench`` flushes by zeroing a
    buffer instead: the measured kernel then also pays for writing ~50 MB of dirty lines back
    to HBM (the 1 x 32k decode: 57.5 us under that flush, 49.6-51.4 us under Nsight Compute).
    """
    fn()  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    flush_buffer = torch.ones(L2_FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")
    flushed = torch.empty((), dtype=torch.float32, device="cuda")

    def sample(count: int) -> list[float]:
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(count)
        ]
        for start, end in events:
            torch.sum(flush_buffer, dim=0, out=flushed)
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in events]

    estimate = median(sample(5))
    sample(max(1, int(warmup_ms / estimate)))
    return sample(max(1, int(rep_ms / estimate)))


def median(samples: list[float]) -> float:
    return statistics.median(samples)


def write(out: str | Path, report: dict[str, Any]) -> Path:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
    return path


def free_engine(llm: Any) -> None:
    """Drop an engine and give its memory back before the next arm builds one."""
    import gc

    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def figure(path: Path, title: str, xlabel: str, ylabel: str, series: dict[str, tuple[list, list]],
           logx: bool = True) -> Path | None:  # fmt: skip
    """A line per series; skipped (None) where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=label)
    if logx:
        ax.set_xscale("log", base=2)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
