"""``nanograph bench gemv``: the decode GEMV against cuBLAS at a model's projection shapes.

For each projection (q/k/v, o, gate/up, down, lm_head) and row count, both run as CUDA-graph
replays over enough weight copies (>= 256 MiB together) that nothing stays in the 50 MiB L2:
decode streams every weight from HBM once per step, and so must the measurement. Reported:
microseconds per product and weight GB/s, medians of ``do_bench`` samples; ``--sweep`` also
tries other tile shapes. What the engine would gain at batch 1 is the sum over a step's
products (``per_step_us``: each projection times the layer count, plus lm_head once).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch
import torch.nn.functional as F

from nanograph.bench.common import environment, graphed_samples, median, write

L2_FLUSH_BYTES = 256 * 2**20


def projections(model: str) -> dict[str, tuple[int, int, int]]:
    """name -> (N, K, times per decode step) of a preset's products."""
    from nanograph.loader import resolve_model

    c = resolve_model(model, "dummy").config
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    layers = c.num_hidden_layers
    return {
        "qkv": (q + 2 * kv, c.hidden_size, layers),
        "o": (c.hidden_size, q, layers),
        "gate_up": (2 * c.intermediate_size, c.hidden_size, layers),
        "down": (c.hidden_size, c.intermediate_size, layers),
        "lm_head": (c.vocab_size, c.hidden_size, 1),
    }


def _timed_us(product, weights: list[torch.Tensor], x: torch.Tensor, rep_ms: int) -> float:
    """Median microseconds of one product, cycling through ``weights`` inside one graph."""

    def run() -> None:
        for w in weights:
            product(x, w)

    return 1000 * median(graphed_samples(run, rep_ms)) / len(weights)


def measure(n: int, k: int, rows: int, sweep: bool, rep_ms: int) -> dict:
    from nanograph.kernels.gemv import GemvTiles, choose_tiles, gemv

    nbytes = n * k * 2
    copies = max(2, min(64, -(-L2_FLUSH_BYTES // nbytes)))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    expected = F.linear(x.float(), weights[0].float())
    error = (gemv(x, weights[0]).float() - expected).abs().max().item()
    default = choose_tiles(rows, n, k, torch.cuda.current_device())
    result = {
        "n": n, "k": k, "rows": rows, "weight_bytes": nbytes, "copies": copies,
        "max_abs_error_vs_fp32": error, "default_tiles": dataclasses.asdict(default),
        "cublas_us": _timed_us(F.linear, weights, x, rep_ms),
        "triton_us": _timed_us(gemv, weights, x, rep_ms),
    }  # fmt: skip
    for name in ("cublas", "triton"):
        result[f"{name}_gbps"] = nbytes / (result[f"{name}_us"] * 1e-6) / 1e9
    if sweep:
        trials = []
        for block_n in (4, 8, 16, 32):
            for block_k in (128, 256, 512):
                for warps in (4, 8):
                    for stages in (2, 3, 4, 5):
                        tiles = GemvTiles(block_n, block_k, warps, stages)
                        try:
                            us = _timed_us(
                                lambda a, w, t=tiles: gemv(a, w, tiles=t), weights, x, rep_ms // 4
                            )
                        except Exception as e:  # noqa: BLE001 - out of resources, etc.
                            trials.append({"tiles": dataclasses.asdict(tiles), "error": str(e)})
                            continue
                        trials.append({"tiles": dataclasses.asdict(tiles), "us": us})
        ok = [t for t in trials if "us" in t]
        result["sweep"] = sorted(ok, key=lambda t: t["us"]) + [t for t in trials if "us" not in t]
        result["best_us"] = min((t["us"] for t in ok), default=None)
    del weights
    torch.cuda.empty_cache()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nanograph bench gemv", description=__doc__)
    parser.add_argument("--models", default="qwen3-8b,qwen3-0.6b")
    parser.add_argument("--rows", default="1,2,4", help="rows of x (decode batch sizes)")
    parser.add_argument("--sweep", action="store_true", help="also try other tile shapes")
    parser.add_argument("--sweep-rows", default="1", help="row counts the sweep covers")
    parser.add_argument("--rep-ms", type=int, default=100, help="do_bench time per measurement")
    parser.add_argument("--out", default="benchmarks/results/gemv.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("nanograph bench gemv needs a CUDA device")
    rows_list = [int(r) for r in args.rows.split(",")]
    sweep_rows = {int(r) for r in args.sweep_rows.split(",")}
    report = {"bench": "gemv", "env": environment(), "config": vars(args), "models": {}}
    start = time.perf_counter()
    for model in args.models.split(","):
        entry = report["models"][model] = {"products": {}, "per_step_us": {}}
        shapes = projections(model)
        for rows in rows_list:
            step = {"cublas": 0.0, "triton": 0.0, "best": 0.0}
            for name, (n, k, times) in shapes.items():
                r = measure(n, k, rows, args.sweep and rows in sweep_rows, args.rep_ms)
                entry["products"][f"{name}_rows{rows}"] = r
                best = r.get("best_us") or r["triton_us"]
                step["cublas"] += times * r["cublas_us"]
                step["triton"] += times * r["triton_us"]
                step["best"] += times * min(best, r["cublas_us"])
                print(f"{model} {name:8s} {n}x{k} rows={rows}: cuBLAS {r['cublas_us']:7.1f} us "
                      f"({r['cublas_gbps']:5.0f} GB/s) | triton {r['triton_us']:7.1f} us "
                      f"({r['triton_gbps']:5.0f} GB/s) | best swept {best:7.1f} us | "
                      f"err {r['max_abs_error_vs_fp32']:.3g}")  # fmt: skip
                write(args.out, report)
            entry["per_step_us"][rows] = step
            print(f"{model} rows={rows}: products per decode step: cuBLAS "
                  f"{step['cublas'] / 1000:.3f} ms, triton {step['triton'] / 1000:.3f} ms, "
                  f"best of both per shape {step['best'] / 1000:.3f} ms")  # fmt: skip
    report["seconds"] = time.perf_counter() - start
    write(args.out, report)
    return 0
