"""``nanograph bench build``: time to build the prefill graphs of a ladder, per backend.

tc_piecewise is split into compile (dynamo + inductor: once for symbolic sizes, plus a
specialized compile or two, reused by the other shapes) and capture; full and breakable only
capture. Shapes are captured largest first into one pool, as at start-up.
"""

from __future__ import annotations

import argparse

from nanograph.bench.common import (
    STARTUP_CAPTURE,
    default_out,
    environment,
    free_engine,
    require_cuda,
    write,
)
from nanograph.cli import int_list, model_list

BACKENDS = ("full", "breakable", "tc_piecewise")


def measure(model: str, backend: str, chunk: int, tokens: tuple[int, ...] | None) -> dict:
    from nanograph import LLM

    llm = LLM(
        model, load_format="dummy", decode_cuda_graph="none", prefill_cuda_graph=backend,
        chunked_prefill_size=chunk, prefill_graph_tokens=tokens, max_num_seqs=2,
        max_model_len=chunk + 16, progress=False, **STARTUP_CAPTURE,
    )  # fmt: skip
    runner = llm.engine.runner.graph_runners["prefill"]
    compile_s = sum(g.stats.compile_s for g in runner.graphs.values())
    total_s = sum(r.capture_s for r in runner.records.values())
    result = {
        "shapes": len(runner.graphs),
        "total_s": total_s,
        "compile_s": compile_s,
        "capture_s": total_s - compile_s,
        "per_shape_s": {str(s): r.capture_s for s, r in sorted(runner.records.items())},
        "pool_bytes": runner.pool_bytes(),
        "segments": {str(s): g.stats.segments for s, g in sorted(runner.graphs.items())},
        "breaks": {str(s): g.stats.num_breaks for s, g in sorted(runner.graphs.items())},
    }
    free_engine(llm)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nanograph bench build", description=__doc__)
    parser.add_argument("--models", type=model_list, default="qwen3-0.6b")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--chunk", type=int, default=8192)
    parser.add_argument(
        "--tokens", type=int_list, default="", help="ladder override (default: ~40 buckets)"
    )
    parser.add_argument("--out", default=default_out("build.json"))
    args = parser.parse_args(argv)
    require_cuda("build")  # it times graph capture
    tokens = args.tokens or None
    report = {"bench": "build", "env": environment(), "config": vars(args), "models": {}}
    for model in args.models:
        entry = report["models"][model] = {}
        for backend in args.backends.split(","):
            entry[backend] = measure(model, backend, args.chunk, tokens)
            write(args.out, report)
            r = entry[backend]
            print(f"{model} {backend}: {r['shapes']} shapes in {r['total_s']:.1f} s "
                  f"(compile {r['compile_s']:.1f} s, capture {r['capture_s']:.1f} s), "
                  f"pool {r['pool_bytes'] / 2**20:.0f} MiB")  # fmt: skip
        if "tc_piecewise" in entry and "breakable" in entry:
            entry["breakable_speedup_over_tc"] = (
                entry["tc_piecewise"]["total_s"] / entry["breakable"]["total_s"]
            )
            print(f"{model}: breakable builds {entry['breakable_speedup_over_tc']:.1f}x faster")
    write(args.out, report)
    return 0
