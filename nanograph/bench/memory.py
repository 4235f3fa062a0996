"""``nanograph bench memory``: graph memory, and memory above the no-graph baseline after one
prefill at exactly the chunk size, for several prefill capture ceilings (chunk 8192).

Every arm has the same KV pool (one sequence slot at the chunk's length), so differences are
graph pools and activation peaks. Capturing through the chunk size moves the eager activation
peak into resident graph memory; a ceiling below it adds graphs while the peak stays.
"""

from __future__ import annotations

import argparse

import torch

from nanograph.bench.common import (
    STARTUP_CAPTURE,
    default_out,
    environment,
    figure,
    figure_path,
    free_engine,
    generate,
    require_cuda,
    write,
)
from nanograph.cli import int_list, model_list
from nanograph.runners.shapes import prefill_token_buckets


def measure(model: str, backend: str, chunk: int, ceiling: int | None) -> dict:
    from nanograph import LLM, SamplingParams

    tokens = tuple(prefill_token_buckets(ceiling)) if ceiling else None
    torch.cuda.empty_cache()
    llm = LLM(
        model, load_format="dummy", decode_cuda_graph="none",
        prefill_cuda_graph=backend if ceiling else "none", chunked_prefill_size=chunk,
        prefill_graph_tokens=tokens, max_num_seqs=1, max_model_len=chunk + 16, progress=False,
        **STARTUP_CAPTURE,
    )  # fmt: skip
    prompt = torch.randint(0, 1000, (chunk,)).tolist()
    torch.cuda.synchronize()
    resident = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    generate(llm, [prompt], SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    runner = llm.engine.runner.graph_runners.get("prefill")
    result = {
        "ceiling": ceiling or 0,
        "shapes": len(runner.graphs) if runner else 0,
        "graph_pool_bytes": runner.pool_bytes() if runner else 0,
        "resident_bytes": resident,
        "peak_bytes": peak,
        "activation_peak_bytes": peak - resident,
        "replayed": bool(runner and runner.replays),
        "memory": llm.engine.memory.as_dict(),
    }
    free_engine(llm)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nanograph bench memory", description=__doc__)
    parser.add_argument("--models", type=model_list, default="qwen3-0.6b")
    parser.add_argument("--backend", default="breakable")
    parser.add_argument("--chunk", type=int, default=8192)
    parser.add_argument("--ceilings", type=int_list, default="1024,2048,4096,8192")
    parser.add_argument("--out", default=default_out("memory.json"))
    args = parser.parse_args(argv)
    require_cuda("memory")  # CUDA graph pools and the CUDA allocator's peak
    ceilings = list(args.ceilings)
    report = {"bench": "memory", "env": environment(), "config": vars(args), "models": {}}
    for model in args.models:
        baseline = measure(model, args.backend, args.chunk, None)
        entry = report["models"][model] = {"no_graph": baseline, "ceilings": {}}
        print(f"{model} no graphs: peak {baseline['peak_bytes'] / 2**30:.2f} GiB, activation "
              f"{baseline['activation_peak_bytes'] / 2**30:.3f} GiB")  # fmt: skip
        for ceiling in ceilings:
            r = measure(model, args.backend, args.chunk, ceiling)
            r["above_baseline_bytes"] = r["peak_bytes"] - baseline["peak_bytes"]
            entry["ceilings"][ceiling] = r
            write(args.out, report)
            print(f"{model} ceiling {ceiling}: {r['shapes']} shapes, pool "
                  f"{r['graph_pool_bytes'] / 2**30:.3f} GiB, activation "
                  f"{r['activation_peak_bytes'] / 2**30:.3f} GiB, peak vs no graphs "
                  f"{r['above_baseline_bytes'] / 2**30:+.3f} GiB")  # fmt: skip
        rows = [entry["ceilings"][c] for c in ceilings]
        gib = lambda key, rows=rows: [r[key] / 2**30 for r in rows]  # noqa: E731
        figure(figure_path(args.out, model),
               f"prefill graph memory at chunk {args.chunk}, {model}", "capture ceiling (tokens)",
               "GiB", {"graph pool": (ceilings, gib("graph_pool_bytes")),
                       "activation peak": (ceilings, gib("activation_peak_bytes")),
                       "peak above no-graph": (ceilings, gib("above_baseline_bytes"))})  # fmt: skip
    write(args.out, report)
    return 0
