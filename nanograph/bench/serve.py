"""``nanograph bench serve``: load-test an OpenAI-compatible server, as SGLang's
``bench_serving`` and ``vllm bench serve`` do.

Targets any base URL (``--base-url``), or ``--launch "ENGINE FLAGS"`` starts ``nanograph serve``
with those flags on a free port and stops it (SIGTERM) at the end. A run is a list of points;
``--dataset``, ``--request-rate``, ``--max-concurrency`` and ``--num-prompts`` each take one value
or one per point (comma-separated), so one server start covers a sweep. Arrivals are Poisson at
the request rate (``inf``: all at once), capped by the concurrency (0: no cap). Every request is
a streamed ``/v1/completions`` call with token-id prompts and ``ignore_eos`` (workloads:
``serve_workload``).

Per point: request throughput, input/output tokens/s, TTFT, TPOT (per request: time after the
first token over the tokens after it), ITL (time between streamed chunks) and end-to-end
latency (mean, median, p90, p99, in ms), failures and their first messages; for our server also
the graph replays and eager forwards per path during the point (from /metrics). The sweep draws
the latency-throughput curves (median TTFT and ITL against output tokens/s).

``--offline`` (with ``--launch``): once the server is stopped, the same engine flags build an
``LLM`` in this process, which runs the prompts of each saturation point (rate inf, no
concurrency cap; the last one per dataset and prompt count) through ``LLM.generate`` and
measures the batch-1 decode step (the first request of each concurrency-1 point, alone, median
of 3); the JSON compares them with the served numbers (``comparisons``: served / offline,
keyed ``DATASET_COUNT_...`` for saturation).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import shlex
import statistics
import time
from pathlib import Path

from nanograph.bench.common import default_out, environment, figure, generate, write
from nanograph.bench.serve_client import (
    LaunchedServer,
    forward_counts,
    run_point,
    served_model,
    summarize,
)
from nanograph.bench.serve_workload import Workload


def offline(flags: str, saturation: dict[str, tuple[list, list]], batch1: dict[str, tuple]) -> dict:
    """``LLM.generate`` throughput on each saturation point's prompts (after a warm-up on other
    prompts of the same shape: the same ones would hit the prefix cache), and the batch-1
    decode step (ms) of one request per workload, with the server's engine flags."""
    import dataclasses

    from nanograph import LLM, SamplingParams
    from nanograph.cli import build_parser, engine_config_from

    config = engine_config_from(build_parser().parse_args(["serve", *shlex.split(flags)]))
    llm = LLM(**dataclasses.asdict(config))
    params = lambda n: SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
    result: dict = {}
    for key, (requests, warm) in saturation.items():
        generate(llm, [p for p, _ in warm], params(8))  # warm-up at the full batch
        start = time.perf_counter()
        outs = generate(llm, [p for p, _ in requests], [params(n) for _, n in requests])
        seconds = time.perf_counter() - start
        tokens = sum(len(o.token_ids) for o in outs)
        result[f"{key}_generate"] = {
            "num_prompts": len(requests),
            "seconds": seconds,
            "output_throughput": tokens / seconds,
        }
    for dataset, (prompt, output_len) in batch1.items():
        generate(llm, [prompt], params(8))  # warm-up
        rates = [
            generate(llm, [prompt], params(output_len))[0].decode_tokens_per_s for _ in range(3)
        ]
        result[f"{dataset}_batch1_step_ms"] = 1000 / statistics.median(rates)
    return result


def _per_point(values: str, n: int, kind, name: str) -> list:
    items = [kind(v) for v in values.split(",")]
    if len(items) not in (1, n):
        raise SystemExit(f"--{name} needs 1 or {n} values, got {len(items)}")
    return items * n if len(items) == 1 else items


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="nanograph bench serve",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--launch", metavar="FLAGS", help="start `nanograph serve FLAGS` instead")
    parser.add_argument("--api-key")
    parser.add_argument("--model", help="model name to send [the server's first model]")
    parser.add_argument("--dataset", default="random", help="random | sharegpt, per point")
    parser.add_argument("--request-rate", default="inf", help="requests/s per point (inf: all)")
    parser.add_argument("--max-concurrency", default="0", help="per point; 0 = no cap")
    parser.add_argument("--num-prompts", default="200", help="per point")
    parser.add_argument("--input-len", type=int, default=1024, help="random: input tokens")
    parser.add_argument("--output-len", type=int, default=256, help="random: output tokens")
    parser.add_argument("--range-ratio", type=float, default=0.0, help="random: length spread")
    parser.add_argument("--max-input-len", type=int, default=2048, help="sharegpt: input cap")
    parser.add_argument("--max-output-len", type=int, default=1024, help="sharegpt: output cap")
    parser.add_argument("--vocab-size", type=int, default=20000, help="token ids drawn below it")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--warmup", type=int, default=4, help="untimed requests (8 tokens each) sent at once first"
    )
    parser.add_argument("--request-timeout", type=float, default=600.0)
    parser.add_argument("--startup-timeout", type=float, default=900.0)
    parser.add_argument("--offline", action="store_true", help="with --launch: LLM.generate too")
    parser.add_argument("--out", default=default_out("serve.json"))
    args = parser.parse_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    if args.offline and not args.launch:
        raise SystemExit("--offline needs --launch (the engine flags to build the LLM with)")
    datasets = args.dataset.split(",")
    n = len(datasets)
    for name in ("request_rate", "max_concurrency", "num_prompts"):
        n = max(n, len(getattr(args, name).split(",")))
    datasets = _per_point(args.dataset, n, str, "dataset")
    rates = _per_point(args.request_rate, n, float, "request-rate")
    caps = _per_point(args.max_concurrency, n, int, "max-concurrency")
    counts = _per_point(args.num_prompts, n, int, "num-prompts")
    workloads = {
        d: Workload(
            d,
            args.input_len,
            args.output_len,
            args.range_ratio,
            args.max_input_len,
            args.max_output_len,
            args.vocab_size,
        )
        for d in dict.fromkeys(datasets)
    }
    out = Path(args.out)
    report = {
        "bench": "serve",
        "env": environment(),
        "config": vars(args),
        "workloads": {d: w.describe() for d, w in workloads.items()},
        "points": [],
    }
    server = None
    if args.launch:
        out.parent.mkdir(parents=True, exist_ok=True)
        server = LaunchedServer(args.launch, out.with_suffix(".server.log"), args.startup_timeout)
    base_url = server.base_url if server else args.base_url.rstrip("/")
    saturation, batch1 = {}, {}
    try:
        model = args.model or served_model(base_url, args.api_key)
        for i, (dataset, rate, cap, count) in enumerate(zip(datasets, rates, caps, counts)):
            requests = workloads[dataset].requests(count, args.seed + i)
            if i == 0 and args.warmup:  # all at once: compiles what a full batch needs first
                warm = workloads[dataset].requests(args.warmup, args.seed + n)  # unused seed
                warm = [(p, min(o, 8)) for p, o in warm]
                asyncio.run(
                    run_point(
                        base_url, model, warm, math.inf, 0, 0, args.api_key, args.request_timeout
                    )
                )
            before = forward_counts(base_url)
            outcomes, duration = asyncio.run(
                run_point(
                    base_url,
                    model,
                    requests,
                    rate,
                    cap,
                    args.seed + i,
                    args.api_key,
                    args.request_timeout,
                )
            )
            after = forward_counts(base_url)
            point = {
                "dataset": dataset,
                "request_rate": rate,
                "max_concurrency": cap,
                "num_prompts": count,
                **summarize(outcomes, duration),
            }
            if before and after:
                point["forwards"] = {k: after[k] - before.get(k, 0) for k in after}
            report["points"].append(point)
            if math.isinf(rate) and cap == 0:
                warm = workloads[dataset].requests(count, args.seed + n + 1)  # unused seed
                saturation[f"{dataset}_{count}"] = (requests, warm)
            if cap == 1:  # its ITL is compared with the offline batch-1 step
                batch1.setdefault(dataset, requests[0])
            write(out, report)
            _print_point(point)
    finally:
        if server is not None:
            report["server_exit_code"] = server.stop()
            write(out, report)
    if args.offline:
        report["offline"] = offline(args.launch, saturation, batch1)
        report["comparisons"] = _compare(report)
        write(out, report)
        print(json.dumps(report["comparisons"], indent=1))
    _figures(out, report)
    print(f"wrote {out}")
    return 0 if all(p["failed"] == 0 for p in report["points"]) else 1


def _compare(report: dict) -> dict:
    """The issue's aims: ITL at concurrency 1 against the offline batch-1 step, and the
    saturation output throughput against ``LLM.generate`` on the same prompts."""
    result, offline = {}, report["offline"]
    for p in report["points"]:
        d = p["dataset"]
        step = offline.get(f"{d}_batch1_step_ms")
        if p["max_concurrency"] == 1 and p["itl_ms"] and step:
            result[f"{d}_c1_itl_mean_over_batch1_step"] = p["itl_ms"]["mean"] / step
        key = f"{d}_{p['num_prompts']}"
        generate = offline.get(f"{key}_generate")
        if math.isinf(p["request_rate"]) and p["max_concurrency"] == 0 and generate:
            result[f"{key}_saturation_over_generate"] = (
                p["output_throughput"] / generate["output_throughput"]
            )
    return result


def _print_point(p: dict) -> None:
    med = lambda key, q="median": f"{p[key][q]:.1f}" if p[key] else "-"
    print(
        f"{p['dataset']:>8} rate={p['request_rate']:<5g} c={p['max_concurrency']:<3d} "
        f"n={p['num_prompts']:<4d} ok={p['completed']} fail={p['failed']} "
        f"req/s={p['request_throughput']:.2f} out tok/s={p['output_throughput']:.0f} "
        f"TTFT med/p99={med('ttft_ms')}/{med('ttft_ms', 'p99')} ms "
        f"ITL med/p99={med('itl_ms')}/{med('itl_ms', 'p99')} ms TPOT med={med('tpot_ms')} ms "
        f"e2e med={med('e2e_ms')} ms",
        flush=True,
    )


def _figures(out: Path, report: dict) -> None:
    """Latency against output throughput, one line per dataset (uncapped points only)."""
    for metric in ("ttft_ms", "itl_ms"):
        series = {}
        for d in report["workloads"]:
            points = sorted(
                (p["output_throughput"], p[metric]["median"])
                for p in report["points"]
                if p["dataset"] == d and p[metric] and p["max_concurrency"] == 0
            )
            if points:
                series[d] = ([x for x, _ in points], [y for _, y in points])
        if series:
            figure(
                out.with_name(f"{out.stem}_{metric}.png"),
                f"median {metric[:-3].upper()} vs throughput ({report['env']['device']})",
                "output tokens/s",
                f"median {metric[:-3].upper()} (ms)",
                series,
                logx=False,
            )
