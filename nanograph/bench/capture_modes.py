"""``nanograph bench startup --capture-modes ...``: the capture modes side by side under a steady
request stream, each in a fresh process.

Per arm (``eager``, ``startup``, ``background``, ``lazy``, each with the engine's default
ladder for that mode; ``MODE:auto`` asks for the learned ladder, ``MODE:default`` for the
configured one): time from process start to a ready engine; then a closed-loop stream of
``--concurrency`` requests (random prompts of ``--short``..``--long`` tokens, ``--new-tokens``
each, greedy, ignore_eos) for ``--duration`` seconds, started the moment the engine is ready.
An untimed start-up with start-up capture first fills the kernel caches, graph variants
included (``--no-warm-cache`` skips it), so every arm starts with the same warm caches.
Recorded: the first request's TTFT, generated tokens after every step (a tokens/s curve over
time since process start, in the figure), when background capture finished, graph memory and
the ladders at the end. Derived (the issue's aims): ready time against ``eager``; steady-state
tokens/s (median of the last third of the bins); when each arm first reaches 95% of the
``startup`` arm's steady state, against the time ``startup`` spent before serving; graph
memory of each learned-ladder arm against the configured-ladder arm of its mode and against
``startup``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

from nanograph.bench.common import Unavailable, environment, figure, write

CHILD_FLAG = "--capture-child"
BIN_S = 1.0  # seconds per point of the tokens/s curve


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("capture modes (--capture-modes replaces the cache comparison)")
    g.add_argument(
        "--capture-modes", default=None,
        help="comma-separated arms: eager, startup, background, lazy (each with the engine's "
        "default ladder: learned under background); MODE:auto learns the ladder, MODE:default "
        "captures the configured one (e.g. eager,startup,background,background:default,lazy)",
    )  # fmt: skip
    g.add_argument("--duration", type=float, default=30.0, help="seconds of stream per arm")
    g.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    g.add_argument(
        "--capture-repeats", type=int, default=1,
        help="runs per arm, interleaved (arm A, B, ..., A, B, ...); an arm reports the median "
        "of its runs' ready times and steady states, and the curve of its median-ready run",
    )  # fmt: skip
    g.add_argument("--graph-memory", default=None, help="--cuda-graph-memory of live arms")
    g.add_argument(
        "--no-warm-cache", action="store_true",
        help="skip the untimed start-up that first fills the kernel caches (without it, the "
        "first arm pays every Triton compile and the others load the kernels from disk)",
    )  # fmt: skip
    g.add_argument(CHILD_FLAG, action="store_true", help=argparse.SUPPRESS)


def engine_args(arm: str, args: argparse.Namespace) -> dict:
    mode, _, ladder = arm.partition(":")
    # default max_num_seqs and ladders: the stream's concurrency, not the config, bounds the batch
    out = {"load_format": args.load_format, "dtype": args.dtypes.split(",")[0],
           "disable_prefix_caching": True}  # fmt: skip
    if args.mem_fraction is not None:
        out["mem_fraction"] = args.mem_fraction
    if mode == "eager":
        return out | {"decode_cuda_graph": "none", "prefill_cuda_graph": "none"}
    if mode not in ("startup", "background", "lazy"):
        raise ValueError(f"unknown capture arm {arm!r}: eager, startup, background or lazy")
    out["cuda_graph_capture"] = mode
    if ladder:
        out["cuda_graph_ladder"] = ladder
    if args.graph_memory and mode != "startup":
        out["cuda_graph_memory"] = args.graph_memory
    return out


def child(args: argparse.Namespace) -> None:
    """Runs in the measured process: prints one JSON line."""
    start = time.perf_counter()
    from nanograph import LLM, SamplingParams
    from nanograph.engine.request import Status

    llm = LLM(args.model, progress=False, **json.loads(args.engine_args))
    engine = llm.engine
    ready = time.perf_counter()
    vocab = engine.model_config.vocab_size
    rng = random.Random(0)
    params = SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
    alive, finished_tokens, samples = [], 0, []
    first = first_submit = capture_done = None
    while (now := time.perf_counter()) - ready < args.duration:
        while len(alive) < args.concurrency:
            n = rng.randint(args.short, args.long)
            alive.append(engine.add_request([rng.randrange(vocab) for _ in range(n)], params))
            if first is None:
                first, first_submit = alive[-1], time.perf_counter()
        engine.step()
        now = time.perf_counter()
        finished_tokens += sum(len(r.output_ids) for r in alive if r.status is Status.FINISHED)
        alive = [r for r in alive if r.status is not Status.FINISHED]
        samples.append((now - start, finished_tokens + sum(len(r.output_ids) for r in alive)))
        if capture_done is None and engine.live_capture and engine.wait_for_graphs(0):
            capture_done = now - start
    engine.close()
    report = engine.memory_report()
    stats = engine.graph_capture_stats()
    print(json.dumps({
        "ready_s": ready - start, "load_s": engine.load_seconds,
        "phases": engine.startup_phases, "ttft_first_s": (first.first_token_time - first_submit
                         if first is not None and first.first_token_time else None),
        "capture_done_s": capture_done, "samples": samples,
        "graph_bytes": sum(report.graph_pools.values()), "graph_pools": report.graph_pools,
        "graph_budget": report.graph_reserve, "kv_pool_bytes": report.kv_pool,
        "ladder_mode": engine.config.ladder_mode if engine.live_capture else None,
        "ladders": {p: s["ladder"] for p, s in stats.get("paths", {}).items()},
        "evictions": stats.get("budget", {}).get("evictions", 0),
        "forward_counts": engine.runner.forward_counts(),
    }))  # fmt: skip


def curve(samples: list[tuple[float, int]]) -> tuple[list[float], list[float]]:
    """Tokens/s per BIN_S bin, at each bin's end (seconds since process start)."""
    if not samples:
        return [], []
    xs, ys = [], []
    t0, n0 = samples[0]
    for t, n in samples[1:]:
        if t - t0 >= BIN_S:
            xs.append(t)
            ys.append((n - n0) / (t - t0))
            t0, n0 = t, n
    return xs, ys


def run_arm(args: argparse.Namespace, arm: str, duration: float | None = None) -> dict:
    duration = args.duration if duration is None else duration
    cmd = [
        sys.executable, "-m", "nanograph.bench.startup", CHILD_FLAG, "--model", args.model,
        "--engine-args", json.dumps(engine_args(arm, args)), "--short", str(args.short),
        "--long", str(args.long), "--new-tokens", str(args.new_tokens), "--duration",
        str(duration), "--concurrency", str(args.concurrency),
    ]  # fmt: skip
    try:
        done = subprocess.run(
            cmd, env=dict(os.environ), capture_output=True, text=True, timeout=args.timeout
        )
    except subprocess.TimeoutExpired:
        return {"error": [f"not done after {args.timeout} s"]}
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-3:] or ["failed"]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    xs, ys = curve(result["samples"])
    tail = ys[len(ys) * 2 // 3 :]
    result["curve"] = {"t_s": xs, "tokens_per_s": ys}
    result["steady_tokens_per_s"] = statistics.median(tail) if tail else None
    return result


def median_run(runs: list[dict]) -> dict:
    """One arm's runs as one: the run of median ready time, with the median ready time and
    steady state of all runs and every run's figures under ``runs``."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[-1]
    middle = sorted(ok, key=lambda r: r["ready_s"])[(len(ok) - 1) // 2]
    steady = [r["steady_tokens_per_s"] for r in ok if r["steady_tokens_per_s"]]
    keep = ("ready_s", "load_s", "phases", "ttft_first_s", "capture_done_s",
            "steady_tokens_per_s", "graph_bytes")  # fmt: skip
    return middle | {
        "ready_s": statistics.median(r["ready_s"] for r in ok),
        "steady_tokens_per_s": statistics.median(steady) if steady else None,
        "failed_runs": len(runs) - len(ok),
        "runs": [{k: r.get(k) for k in keep} if "error" not in r else r for r in runs],
    }


def compare(arms: dict[str, dict]) -> dict:
    """The issue's aims, from the arms that ran."""
    out: dict = {}
    ok = {name: arm for name, arm in arms.items() if "error" not in arm}
    if "eager" in ok:
        out["ready_over_eager"] = {n: a["ready_s"] / ok["eager"]["ready_s"] for n, a in ok.items()}
    if "startup" in ok and ok["startup"]["steady_tokens_per_s"]:
        target = 0.95 * ok["startup"]["steady_tokens_per_s"]
        out["startup_ready_s"] = ok["startup"]["ready_s"]
        out["reach_95pct_of_startup_s"] = {
            n: next((t for t, y in zip(*a["curve"].values()) if y >= target), None)
            for n, a in ok.items()
        }
    # a learned ladder against the configured one: the same mode's, and startup's (complete;
    # a background arm may still be capturing when its stream ends)
    for name, arm in ok.items():
        if arm.get("ladder_mode") != "auto":
            continue
        mode = name.partition(":")[0]
        refs = [r for r, a in ok.items() if r == "startup" or (
            r.partition(":")[0] == mode and a.get("ladder_mode") == "default")]  # fmt: skip
        for ref in refs:
            if ok[ref]["graph_bytes"]:
                out[f"graph_bytes_{name}_over_{ref}"] = arm["graph_bytes"] / ok[ref]["graph_bytes"]
    return out


def main(args: argparse.Namespace) -> int:
    if args.capture_child:
        child(args)
        return 0
    report = {"bench": "startup/capture-modes", "env": environment(), "config": vars(args),
              "arms": {}}  # fmt: skip
    arms = args.capture_modes.split(",")
    for arm in arms:
        engine_args(arm, args)  # refuse a bad arm name before any run
    import torch

    if not torch.cuda.is_available() and arms != ["eager"]:
        raise Unavailable("capture-mode arms need CUDA (nothing is captured on CPU); use eager")
    if not args.no_warm_cache:  # every arm then starts with the same (warm) kernel cache
        # a start-up capture compiles what graphs launch too (an eager start-up left the graph
        # variants to the timed `startup` arm: 23.2 s ready on qwen3-0.6b at b04ff55)
        cuda = torch.cuda.is_available()
        warm = run_arm(args, "startup" if cuda else "eager", duration=0.0)
        report["cache_warmup"] = warm.get("error") or {"ready_s": warm["ready_s"]}
        print(f"kernel caches warmed by an untimed start-up: {report['cache_warmup']}", flush=True)
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    for repeat in range(args.capture_repeats):
        for arm in arms:  # interleaved: a drifting machine shifts every arm alike
            runs[arm].append(result := run_arm(args, arm))
            report["arms"][arm] = median_run(runs[arm])
            write(args.out, report)
            print(f"[{repeat + 1}/{args.capture_repeats}] " + _line(arm, result), flush=True)
    for arm in arms:
        print("median " + _line(arm, report["arms"][arm]), flush=True)
    report["compare"] = compare(report["arms"])
    print(json.dumps(report["compare"], indent=1), flush=True)
    series = {
        name: (arm["curve"]["t_s"], arm["curve"]["tokens_per_s"])
        for name, arm in report["arms"].items() if "error" not in arm
    }  # fmt: skip
    figure(write(args.out, report).with_suffix(".png"), f"tokens/s from process start, "
           f"{args.model}, {args.concurrency} requests in flight", "seconds since process start",
           "generated tokens/s", series, logx=False)  # fmt: skip
    return 0


def _line(name: str, arm: dict) -> str:
    if "error" in arm:
        return f"{name:<18} failed: {arm['error']}"
    done, ttft = arm["capture_done_s"], arm["ttft_first_s"] or 0.0
    phases = ", ".join(f"{k} {v:.1f}" for k, v in arm["phases"].items())
    return (
        f"{name:<18} ready {arm['ready_s']:6.1f} s ({phases})  first TTFT {ttft * 1e3:7.0f} ms"
        f"  steady {arm['steady_tokens_per_s'] or 0:8.0f} tok/s  graphs "
        f"{arm['graph_bytes'] / 2**20:7.0f} MiB"
        + (f"  capture done at {done:6.1f} s" if done is not None else "")
    )
