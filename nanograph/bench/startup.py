"""``nanograph bench startup``: time to ready and the first requests' latency, per arm, each arm in
a fresh process, with a cold or a warm kernel cache.

What it shows: whether a request pays for compilation. Each arm starts an engine (process start
to ``LLM`` ready), then runs three requests one after another: a short prompt, a long one, and
the short one again. A kernel compiled on a request's path shows up as the difference between
the first short request and its repeat. Graph arms capture at start-up, so that difference is
not also a graph arriving between the two.
"Cold" points Triton's and Inductor's caches at empty folders (a fresh machine); "warm" runs
again over the caches the cold run filled.
With ``--capture-modes`` it compares the graph capture modes under a steady request stream
instead (capture_modes.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from nanograph.bench import capture_modes
from nanograph.bench.common import (
    STARTUP_CAPTURE,
    default_out,
    environment,
    figure,
    generate,
    graph_flag,
    parse_arms,
    write,
)
from nanograph.bench.compiles import triton_compiles

CHILD_FLAG = "--child"
REQUESTS = ("short", "long", "short_again")


def child(args: argparse.Namespace) -> None:
    """Runs in the measured process: prints one JSON line."""
    start = time.perf_counter()
    with triton_compiles(echo=sys.stderr) as compiles:
        result = _measure(args, start)
    ready = result["ready_s"] - (compiles.started - start)  # on the log's clock
    result["compiles_to_ready"] = compiles.summary(until_s=ready)
    result["compiles_after_ready"] = compiles.summary(after_s=ready)
    print(json.dumps(result))


def _measure(args: argparse.Namespace, start: float) -> dict:
    from nanograph import LLM, SamplingParams

    engine_args = json.loads(args.engine_args)
    llm = LLM(args.model, progress=False, **engine_args)
    ready = time.perf_counter() - start
    vocab = llm.engine.model_config.vocab_size
    params = SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
    requests = {}
    for name, length in (("short", args.short), ("long", args.long), ("short_again", args.short)):
        prompt = [(7 * i + 3) % vocab for i in range(length)]
        t0 = time.perf_counter()
        out = generate(llm, [prompt], params)[0]
        requests[name] = {"tokens": length, "latency_s": time.perf_counter() - t0,
                          "ttft_s": out.ttft_s}  # fmt: skip
    engine = llm.engine
    return {"ready_s": ready, "load_s": engine.load_seconds, "phases": engine.startup_phases,
            "requests": requests}  # fmt: skip


def run_arm(args: argparse.Namespace, engine_args: dict, caches: dict[str, str]) -> dict:
    env = dict(os.environ, **caches)
    cmd = [
        sys.executable, "-m", "nanograph.bench.startup", CHILD_FLAG, "--model", args.model,
        "--engine-args", json.dumps(engine_args), "--short", str(args.short), "--long",
        str(args.long), "--new-tokens", str(args.new_tokens),
    ]  # fmt: skip
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired as e:
        # what compiled before the timeout (the child prints a line per compile)
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        compiled = [line for line in err.splitlines() if line.startswith("compiled ")]
        return {"error": [f"not done after {args.timeout} s"], "compiles_seen": compiled}
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:] or ["failed"]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - start
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nanograph bench startup", description=__doc__)
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument(
        "--graphs",
        default="auto,eager",
        help="decode and prefill graph backend per arm (auto = the defaults; eager, alias none; "
        "graph backends need CUDA)",
    )
    parser.add_argument("--short", type=int, default=64, help="tokens of the short prompt")
    parser.add_argument("--long", type=int, default=900, help="tokens of the long prompt")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--timeout", type=int, default=600, help="seconds per arm")
    parser.add_argument(
        "--mem-fraction", type=float, default=None,
        help="each engine's --mem-fraction (lower it to run several benches on one GPU)",
    )  # fmt: skip
    parser.add_argument("--out", default=default_out("startup.json"))
    parser.add_argument(CHILD_FLAG, action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--engine-args", default="{}", help=argparse.SUPPRESS)
    capture_modes.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.capture_modes or args.capture_child:
        return capture_modes.main(args)
    if args.child:
        child(args)
        return 0
    arms = [g if g == "auto" else parse_arms("startup", g, flag="--graphs")[0]
            for g in args.graphs.split(",")]  # fmt: skip
    report = {"bench": "startup", "env": environment(), "config": vars(args), "arms": {}}
    for dtype in args.dtypes.split(","):
        for graphs in arms:
            flag = graphs if graphs == "auto" else graph_flag(graphs)
            # no prefix caching: the repeated short prompt must be computed again; start-up
            # capture (the module's docstring says why)
            engine_args = {"load_format": args.load_format, "dtype": dtype,
                           "decode_cuda_graph": flag, "prefill_cuda_graph": flag,
                           "disable_prefix_caching": True, **STARTUP_CAPTURE}  # fmt: skip
            if args.mem_fraction is not None:
                engine_args["mem_fraction"] = args.mem_fraction
            with tempfile.TemporaryDirectory() as cache:
                caches = {"TRITON_CACHE_DIR": f"{cache}/triton",
                          "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor"}  # fmt: skip
                for state in ("cold", "warm"):
                    name = f"{dtype}/{graphs}/{state}"
                    arm = report["arms"][name] = run_arm(args, engine_args, caches)
                    write(args.out, report)
                    print(_line(name, arm), flush=True)
    series = {
        name: ([1, 2, 3], [arm["requests"][r]["latency_s"] * 1e3 for r in REQUESTS])
        for name, arm in report["arms"].items() if "error" not in arm
    }  # fmt: skip
    figure(write(args.out, report).with_suffix(".png"), f"first requests after start-up, "
           f"{args.model}", "request (1 short, 2 long, 3 short again)", "latency (ms)", series,
           logx=False)  # fmt: skip
    return 0


def _line(name: str, arm: dict) -> str:
    if "error" in arm:
        seen = arm.get("compiles_seen", [])
        return f"{name:<26} failed: {arm['error']}" + (
            f"; {len(seen)} Triton compiles before it, the last: {seen[-3:]}" if seen else ""
        )
    r = arm["requests"]
    phases = ", ".join(f"{k} {v:.1f}" for k, v in arm["phases"].items())
    before, after = arm["compiles_to_ready"], arm["compiles_after_ready"]
    slowest = ", ".join(f"{t['kernel']} {t['seconds']:.1f} s" for t in before["top"][:3])
    return (
        f"{name:<26} ready {arm['ready_s']:6.1f} s ({phases})"
        f"  first short {r['short']['latency_s'] * 1e3:7.0f} ms, long "
        f"{r['long']['latency_s'] * 1e3:7.0f} ms, short again "
        f"{r['short_again']['latency_s'] * 1e3:7.0f} ms\n"
        f"{'':<26} Triton compiles: {before['compiled']} to ready ({before['compile_s']:.1f} s; "
        f"{slowest or 'none'}), {after['compiled']} after"
    )


if __name__ == "__main__":
    raise SystemExit(main())
