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


def graphed_samples(fn: Callable[[], object], rep_ms: int) -> list[float]:
    """Samples (ms) of ``fn`` captured in a CUDA graph and replayed, as the engine runs it: a
    50 us kernel launched from Python would measure the launch path, not the kernel."""
    import triton.testing

    fn()  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return list(triton.testing.do_bench(graph.replay, warmup=25, rep=rep_ms, return_mode="all"))


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
