"""What every engine benchmark shares: environment record, arm names, device checks, measured
copy bandwidth, medians, JSON + figure output.

Invariants:
- The eager arm is called ``eager`` in every bench and every JSON; ``none`` (what the engine's
  ``--decode-cuda-graph`` / ``--prefill-cuda-graph`` flags call the eager path) is accepted as
  an alias on input and reported as ``eager``.
- Without CUDA, graph arms and CUDA-only benches are refused with ``Unavailable`` (a
  ``ValueError``: the CLI prints it as one line and exits 2), before any model is loaded.
- Default outputs go under ``bench-out/`` in the working directory (git-ignored); results land
  in the committed ``benchmarks/results/`` only when ``--out`` says so.
- Rooflines divide by the copy bandwidth measured on the device the bench runs on.
"""

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
    env: dict[str, Any] = {
        "torch": torch.__version__, "commit": os.environ.get("NANOGRAPH_COMMIT") or git_commit(),
        "time": time.ctime(),
        "command": "nanograph " + " ".join(sys.argv[1:]),
    }  # fmt: skip
    if torch.cuda.is_available():
        import triton

        env["device"] = torch.cuda.get_device_name()
        env["triton"] = triton.__version__
    else:
        env["device"] = "cpu"
    # CPU results move with the host: its model, the threads torch uses, and how busy it was
    env["cpu"] = _cpu_model()
    env["threads"] = torch.get_num_threads()
    env["load_average"] = load_average()
    return env


def git_commit() -> str:
    """HEAD's short hash, with ``+dirty`` where tracked files differ from it (a copied tree
    over a stale .git, as on the device, must not pass for that commit); "unknown" without git."""
    try:
        commit = _git("rev-parse", "--short", "HEAD")
        return commit + ("+dirty" if _git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()


def load_average() -> tuple[float, float, float] | None:
    """The host's 1/5/15-minute load: on a shared machine, how much else was running."""
    return os.getloadavg() if hasattr(os, "getloadavg") else None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown"


DEFAULT_OUT_DIR = Path("bench-out")  # git-ignored; committed results need an explicit --out
EAGER = "eager"
GRAPH_ARMS = ("full", "breakable", "tc_piecewise")
ARMS = (EAGER, *GRAPH_ARMS)
ARM_ALIASES = {"none": EAGER}  # the engine's graph flags call the eager path "none"
# Engine arguments of every bench that times graphs from its first call on: start-up capture.
# On CUDA the engine's default is background capture, which serves (eagerly) before its graphs
# exist. The capture-mode comparison (bench startup --capture-modes) picks its modes itself.
STARTUP_CAPTURE = {"cuda_graph_capture": "startup"}


class Unavailable(ValueError):
    """A bench, or an arm of it, cannot run on this machine; the message says what to do."""


def default_out(filename: str) -> str:
    return str(DEFAULT_OUT_DIR / filename)


def require_cuda(bench: str) -> None:
    if not torch.cuda.is_available():
        raise Unavailable(f"nanograph bench {bench} needs a CUDA device and this machine has none")


def parse_arms(
    bench: str, text: str, modifiers: tuple[str, ...] = (), flag: str = "--arms"
) -> list[str]:
    """Comma-separated arms, each a backend of ``ARMS`` (or an alias) optionally followed by
    ``:modifier``s, as canonical names (``none`` -> ``eager``). Unknown names raise a
    ``ValueError``; graph arms without CUDA raise ``Unavailable``."""
    arms = []
    for item in text.split(","):
        backend, *mods = item.strip().split(":")
        backend = ARM_ALIASES.get(backend, backend)
        if backend not in ARMS or not set(mods) <= set(modifiers):
            extra = f", then optionally {' '.join(':' + m for m in modifiers)}" if modifiers else ""
            raise ValueError(
                f"unknown arm {item!r} for bench {bench}: one of {', '.join(ARMS)} "
                f"('none' is an alias of eager){extra}"
            )
        arms.append(":".join([backend, *mods]))
    graph = [a for a in arms if a.split(":")[0] in GRAPH_ARMS]
    if graph and not torch.cuda.is_available():
        raise Unavailable(
            f"bench {bench}: arms {', '.join(graph)} capture CUDA graphs and this machine has no "
            f"CUDA device; run {flag} {EAGER} here"
        )
    return arms


# arm modifiers that shard the model over N GPUs (tensor parallelism), e.g. ``full:tp2``
TP_MODIFIERS = ("tp2", "tp4", "tp8")


def tensor_parallel_size(arm: str) -> int:
    """The ``tensor_parallel_size`` of an arm: N for a ``tpN`` modifier, else 1."""
    sizes = [int(m[2:]) for m in arm.split(":")[1:] if m in TP_MODIFIERS]
    return sizes[0] if sizes else 1


def graph_flag(arm: str) -> str:
    """The engine's ``--*-cuda-graph`` value of an arm (its modifiers dropped)."""
    backend = arm.split(":")[0]
    return "none" if backend == EAGER else backend


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def measure_copy_bandwidth(dev: torch.device, repeats: int = 7) -> float:
    """Bytes/s of a large device-to-device copy on ``dev`` (read + write counted), the median
    of ``repeats`` after one warm-up. 1 GiB on CUDA (eager: a captured copy becomes a memcpy
    node, ~2.7 TB/s against ~4.2 for the copy kernel on the H200), 256 MiB on CPU (far beyond
    any cache)."""
    nbytes = (1 << 30) if dev.type == "cuda" else (256 << 20)
    seconds = _copy_seconds(nbytes, dev, repeats)
    if dev.type == "cuda":
        torch.cuda.empty_cache()  # an engine built next sizes its KV pool from free memory
    return 2 * nbytes / median(seconds)


def _copy_seconds(nbytes: int, dev: torch.device, repeats: int) -> list[float]:
    """Seconds per copy; 10 copies per sample on CUDA, so the host sync is ~0.4% of it."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    inner = 10 if dev.type == "cuda" else 1

    def copies() -> None:
        for _ in range(inner):
            dst.copy_(src)

    return [s / inner for s in timed(copies, repeats, warmup=1)]


def generate(llm: Any, prompts: list, params: Any) -> list:
    """``llm.generate``, raising where a request failed: a bench must never time a rejection
    (a prompt at the model's context length, a KV pool too small) as if it were work."""
    outs = llm.generate(prompts, params, use_tqdm=False)
    failed = [o.error for o in outs if not o.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(outs)} requests failed, first: {failed[0]}")
    return outs


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


def byte_tokenizer() -> Any:
    """A Hugging Face tokenizer of one token a byte (ids 0-255) and ``<|end|>`` (256), for
    models without a tokenizer (dummy presets) where a bench needs text: a form of N
    characters is then N steps."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Backend(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|end|>")


def median(samples: list[float]) -> float:
    return statistics.median(samples)


def write(out: str | Path, report: dict[str, Any]) -> Path:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
    return path


def free_engine(llm: Any) -> None:
    """Close an engine and give its memory back before the next arm builds one. The caller's
    own names keep the engine alive through this call: a loop that builds the next engine
    closes this one, deletes every name holding it (the engine, its runners, closures over
    it), then calls ``free_engine(None)``, or the old weights sit beside the new ones (stop 51:
    gpt-oss-20b's breakable arm ran out of an H100's memory for this)."""
    import gc

    if llm is not None:
        llm.close()  # stops its tensor-parallel workers (a no-op with one rank)
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def figure_path(out: str | Path, model: str) -> Path:
    """``<out stem>_<model name>.png`` next to ``out`` (a model given as a path: its last part)."""
    return Path(out).with_name(f"{Path(out).stem}_{Path(model).name}.png")


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
