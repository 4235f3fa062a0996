"""``nanograph bench gemv``: the batch-1 decode GEMV against cuBLAS at a model's shapes.

For each product of a decode step (q/k/v, o, gate/up, the MLP's activation + down, lm_head)
both run as CUDA-graph replays over enough weight copies (>= 256 MiB together) that nothing
stays in the 50 MiB L2: decode streams every weight from HBM once per step, and so must the
measurement. ``silu_down`` is the engine's pair of kernels on the cuBLAS side (the activation
kernel, then the product) and one fused GEMV on the Triton side. Reported: microseconds per
product and weight GB/s, medians of graph-replay samples (``bench.common.graphed_samples``);
``--sweep`` also tries other tile shapes. What a step gains is the sum over its products
(``per_step_us``: each product times the layer count, plus lm_head once).

A MoE model's products are q/k/v, o, the router and lm_head, and its ``experts``: the fused
pairwise MoE of one token (gate/up GEMVs of its k experts, then the down projection that sums
them), cycling through routings that pick different experts so the weights come from HBM;
``--sweep`` tries the down projection's tiles there. gpt-oss' experts are also timed kept MXFP4
(``--quantization mxfp4``: random codes; ``mxfp4``, beside the bf16 ones in the same run), with
their difference to the same kernels on the dequantized weights.

``--rows 5,8`` times the same products over a few rows instead (a speculative verify: k + 1
rows a request), the few-row kernel (``kernels.rows``, up to 16 rows) against cuBLAS under each
BLAS library of ``--blas`` (torch's ``preferred_blas_library``: cuBLAS or cuBLASLt pick their
kernels with different heuristics). As the engine runs them: ``gate_up`` is the product and the
MLP's activation (cuBLAS: the activation kernel after it; Triton: in its epilogue), ``down`` the
plain product of the activation; ``--sweep`` tries other tiles of the few-row kernel.
qwen3-8b's 5-row o and down products ran at 2.6 and 3.0 TB/s under cuBLAS at d147c49, its
gate/up at 3.9.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import time

import torch
import torch.nn.functional as F
import triton

from nanograph.arith import ceil_div
from nanograph.bench.common import (
    L2_FLUSH_BYTES,
    default_out,
    environment,
    graphed_samples,
    median,
    require_cuda,
    write,
)
from nanograph.cli import int_list, model_list


def projections(c) -> dict[str, tuple[int, int, int]]:
    """name -> (N, K, times per decode step) of the products of a model config ``c``."""
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    layers = c.num_hidden_layers
    mlp = (
        {"router": (c.num_experts, c.hidden_size, layers)} if c.is_moe else {
            "gate_up": (2 * c.intermediate_size, c.hidden_size, layers),
            "silu_down": (c.hidden_size, c.intermediate_size, layers),
        }
    )  # fmt: skip
    return {
        "qkv": (q + 2 * kv, c.hidden_size, layers),
        "o": (c.hidden_size, q, layers),
        **mlp,
        "lm_head": (c.vocab_size, c.hidden_size, 1),
    }


def _weight_copies(n: int, k: int) -> list[torch.Tensor]:
    """Enough bf16 [n, k] weights (>= 256 MiB together, 2 to 64) that cycling through them
    streams each from HBM, not from the 50 MiB L2."""
    copies = max(2, min(64, ceil_div(L2_FLUSH_BYTES, n * k * 2)))
    return [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]


def _timed_us(product, weights: list[torch.Tensor], x: torch.Tensor, rep_ms: int) -> float:
    """Median microseconds of one product, cycling through ``weights`` inside one graph."""

    def run() -> None:
        for w in weights:
            product(x, w)

    return 1000 * median(graphed_samples(run, rep_ms)) / len(weights)


def measure(n: int, k: int, silu_mul: bool, sweep: bool, rep_ms: int) -> dict:
    from nanograph.kernels import fused
    from nanograph.kernels.gemv import GemvTiles, choose_tiles, gemv

    nbytes, weights = n * k * 2, _weight_copies(n, k)
    x = torch.randn(1, 2 * k if silu_mul else k, device="cuda", dtype=torch.bfloat16)

    def cublas(a, w):
        return F.linear(fused.silu_and_mul(a) if silu_mul else a, w)

    def triton_gemv(a, w, tiles=None):
        return gemv(a, w, silu_mul=silu_mul, tiles=tiles)

    expected = cublas(x, weights[0]).float()
    error = (triton_gemv(x, weights[0]).float() - expected).abs().max().item()
    default = choose_tiles(n, k, torch.cuda.current_device())
    result = {
        "n": n, "k": k, "silu_mul": silu_mul, "weight_bytes": nbytes, "copies": len(weights),
        "max_abs_diff_vs_cublas": error, "default_tiles": dataclasses.asdict(default),
        "cublas_us": _timed_us(cublas, weights, x, rep_ms),
        "triton_us": _timed_us(triton_gemv, weights, x, rep_ms),
    }  # fmt: skip
    for name in ("cublas", "triton"):
        result[f"{name}_gbps"] = nbytes / (result[f"{name}_us"] * 1e-6) / 1e9
    if sweep:
        candidates = [
            GemvTiles(block_n, block_k, warps, stages)
            for block_n, block_k, warps, stages in itertools.product(
                (4, 8, 16, 32), (256, 512, 1024), (4, 8), (2, 3, 4)
            )
        ]
        result["sweep"], result["best_us"] = _sweep(triton_gemv, candidates, weights, x, rep_ms)
    del weights
    torch.cuda.empty_cache()
    return result


def measure_rows(n: int, k: int, silu_out: bool, rows: int, sweep: bool, rep_ms: int) -> dict:
    """``rows`` rows through cuBLAS (whichever library torch prefers now) and the few-row
    kernel; with ``silu_out`` the product is the MLP's gate/up and its activation follows."""
    from nanograph.kernels import fused
    from nanograph.kernels.rows import RowsTiles, choose_tiles, gemm_rows

    nbytes, weights = n * k * 2, _weight_copies(n, k)
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)

    def cublas(a, w):
        return fused.silu_and_mul(F.linear(a, w)) if silu_out else F.linear(a, w)

    def triton_rows(a, w, tiles=None):
        return gemm_rows(a, w, silu_out=silu_out, tiles=tiles)

    error = (triton_rows(x, weights[0]).float() - cublas(x, weights[0]).float()).abs().max()
    default = choose_tiles(n, k, torch.cuda.current_device(), silu_out)
    result = {
        "n": n, "k": k, "rows": rows, "silu_out": silu_out,
        "max_abs_diff_vs_cublas": error.item(), "default_tiles": dataclasses.asdict(default),
        "cublas_us": _timed_us(cublas, weights, x, rep_ms),
        "triton_us": _timed_us(triton_rows, weights, x, rep_ms),
    }  # fmt: skip
    for name in ("cublas", "triton"):
        result[f"{name}_gbps"] = nbytes / (result[f"{name}_us"] * 1e-6) / 1e9
    if sweep:
        # the default's rows a program: other counts were within 3% (stops 39, 40); the
        # stages and K blocks, and the programs a weight tile's K range is split over
        candidates = [
            RowsTiles(default.block_n, block_k, 4, stages, split_k)
            for (block_k, stages), split_k in itertools.product(
                ((256, 5), (256, 4), (128, 4), (128, 3)), (1, 2, 4, 8, 16)
            )
        ]
        result["sweep"], result["best_us"] = _sweep(triton_rows, candidates, weights, x, rep_ms)
    del weights
    torch.cuda.empty_cache()
    return result


def _sweep(product, candidates: list, weights: list[torch.Tensor], x: torch.Tensor,
           rep_ms: int) -> tuple[list[dict], float | None]:  # fmt: skip
    """``product(a, w, tiles)`` timed in each candidate tile shape (a quarter of ``rep_ms``
    each): the trials fastest first, then those that failed to launch, and the best time."""
    trials = []
    for tiles in candidates:
        try:
            us = _timed_us(lambda a, w, t=tiles: product(a, w, t), weights, x, rep_ms // 4)
        except Exception as e:  # noqa: BLE001 - out of resources, etc.
            trials.append({"tiles": dataclasses.asdict(tiles), "error": str(e)})
            continue
        trials.append({"tiles": dataclasses.asdict(tiles), "us": us})
    ok = sorted((t for t in trials if "us" in t), key=lambda t: t["us"])
    return ok + [t for t in trials if "us" not in t], (ok[0]["us"] if ok else None)


def few_rows(args: argparse.Namespace, report: dict) -> None:
    """``--rows``: each model's products at each row count, cuBLAS under each BLAS library
    against the few-row kernel."""
    from nanograph.loader import resolve_model

    libraries = args.blas.split(",")
    before = torch.backends.cuda.preferred_blas_library()
    try:
        for model in args.models:
            config = resolve_model(model, "dummy").config
            if config.is_moe:
                raise SystemExit(f"--rows times dense products; {model} is a MoE model")
            entry = report["models"][model] = {"rows": {}}
            products = projections(config)
            products["down"] = products.pop("silu_down")  # the activation is gate/up's here
            for rows in args.rows:
                for library in libraries:
                    torch.backends.cuda.preferred_blas_library(library)
                    results, step = {}, {"cublas": 0.0, "triton": 0.0}
                    for name, (n, k, times) in products.items():
                        r = results[name] = measure_rows(
                            n, k, name == "gate_up", rows, args.sweep, args.rep_ms
                        )
                        for arm in step:
                            step[arm] += times * r[f"{arm}_us"]
                        best = f" | best swept {r['best_us']:7.1f} us" if args.sweep else ""
                        print(f"{model} {rows:3d} rows {library:8s} {name:8s} {n}x{k}: cuBLAS "
                              f"{r['cublas_us']:7.1f} us ({r['cublas_gbps']:5.0f} GB/s) | triton "
                              f"{r['triton_us']:7.1f} us ({r['triton_gbps']:5.0f} GB/s){best} | "
                              f"diff {r['max_abs_diff_vs_cublas']:.3g}")  # fmt: skip
                    entry["rows"].setdefault(str(rows), {})[library] = {
                        "products": results, "per_step_us": step,
                    }  # fmt: skip
                    print(f"{model} {rows} rows {library}: products per step cuBLAS "
                          f"{step['cublas'] / 1000:.3f} ms, triton {step['triton'] / 1000:.3f} "
                          "ms")  # fmt: skip
                    write(args.out, report)
    finally:
        torch.backends.cuda.preferred_blas_library(before)


def one_row(args: argparse.Namespace, report: dict) -> None:
    """Each model's one-row products: cuBLAS against the Triton GEMV (and the swept tiles)."""
    from nanograph.loader import resolve_model

    for model in args.models:
        entry = report["models"][model] = {"products": {}}
        step = {"cublas": 0.0, "triton": 0.0, "best": 0.0}
        config = resolve_model(model, "dummy").config
        for name, (n, k, times) in projections(config).items():
            r = measure(n, k, name == "silu_down", args.sweep, args.rep_ms)
            entry["products"][name] = r
            best = r.get("best_us") or r["triton_us"]
            step["cublas"] += times * r["cublas_us"]
            step["triton"] += times * r["triton_us"]
            step["best"] += times * min(best, r["cublas_us"])
            print(f"{model} {name:9s} {n}x{k}: cuBLAS {r['cublas_us']:7.1f} us "
                  f"({r['cublas_gbps']:5.0f} GB/s) | triton {r['triton_us']:7.1f} us "
                  f"({r['triton_gbps']:5.0f} GB/s) | best swept {best:7.1f} us | "
                  f"diff {r['max_abs_diff_vs_cublas']:.3g}")  # fmt: skip
            write(args.out, report)
        if config.is_moe:
            r = entry["experts"] = measure_experts(config, args.sweep, args.rep_ms)
            # no cuBLAS arm for the experts: every arm's step takes the Triton experts
            layers, best = config.num_hidden_layers, r.get("best_us") or r["triton_us"]
            step["cublas"] += layers * r["triton_us"]
            step["triton"] += layers * r["triton_us"]
            step["best"] += layers * best
            print(f"{model} experts   k={r['top_k']} of {r['experts']}: triton "
                  f"{r['triton_us']:7.1f} us ({r['triton_gbps']:5.0f} GB/s) | best swept "
                  f"{best:7.1f} us | diff {r['max_abs_diff_vs_fp32']:.3g}")  # fmt: skip
            if "mxfp4" in r:
                m = r["mxfp4"]
                print(f"{model} experts   MXFP4: triton {m['triton_us']:7.1f} us "
                      f"({m['triton_gbps']:5.0f} GB/s) | best swept "
                      f"{m.get('best_us') or m['triton_us']:7.1f} us | diff to dequantized "
                      f"{m['max_abs_diff_vs_dequantized']:.3g} of "
                      f"{m['dequantized_max_abs']:.3g}")  # fmt: skip
            write(args.out, report)
        entry["per_step_us"] = step
        print(f"{model}: products per decode step: cuBLAS {step['cublas'] / 1000:.3f} ms, "
              f"triton {step['triton'] / 1000:.3f} ms, best of both per shape "
              f"{step['best'] / 1000:.3f} ms")  # fmt: skip


def measure_experts(c, sweep: bool, rep_ms: int, device: str = "cuda") -> dict:
    """One token through a MoE layer's fused experts (``kernels.moe.fused_experts``, pairwise)
    of config ``c``, over ``ROUTINGS`` routings of distinct experts; with ``sweep``, every
    down-projection tile. gpt-oss: the same for its experts kept MXFP4, under ``mxfp4``."""
    from nanograph.kernels import moe, reference

    experts, top_k, hidden, inter = (
        c.num_experts, c.num_experts_per_tok, c.hidden_size, c.expert_intermediate_size
    )  # fmt: skip
    activation = c.moe_activation
    gpt_oss = activation == "clamped_swiglu"  # biases
    g = torch.Generator(device=device).manual_seed(0)
    w13 = torch.randn(experts, 2 * inter, hidden, device=device, dtype=torch.bfloat16,
                      generator=g) / hidden**0.5  # fmt: skip
    w2 = torch.randn(experts, hidden, inter, device=device, dtype=torch.bfloat16,
                     generator=g) / inter**0.5  # fmt: skip
    b13 = torch.zeros(experts, 2 * inter, device=device, dtype=torch.bfloat16) if gpt_oss else None
    b2 = torch.zeros(experts, hidden, device=device, dtype=torch.bfloat16) if gpt_oss else None
    routings = [
        (torch.full((1, top_k), 1 / top_k, device=device, dtype=torch.bfloat16),
         torch.randperm(experts, device=device, generator=g)[:top_k].view(1, top_k))
        for _ in range(ROUTINGS)
    ]  # fmt: skip
    x = torch.randn(1, hidden, device=device, dtype=torch.bfloat16, generator=g)
    out = torch.empty_like(x)

    def timer(w13, w2, **scales):
        def run(tiles: moe.MoeTiles) -> float:
            def step() -> None:
                for weights, ids in routings:
                    moe.fused_experts(x, w13, w2, b13, b2, weights, ids, activation,
                                      tiles=tiles, out=out, **scales)  # fmt: skip

            return 1000 * median(graphed_samples(step, rep_ms)) / len(routings)

        return run

    run = timer(w13, w2)
    default = moe.choose_tiles(1, top_k, experts, hidden, inter, x.device)
    weights, ids = routings[0]
    # the project's fp32 reference, from the same bf16 operands (it keeps gate/up and the
    # activation in fp32 where the kernels round them to bf16)
    expected = reference.fused_experts(x.float(), w13, w2, b13, b2, weights, ids, activation)
    fused = moe.fused_experts(x, w13, w2, b13, b2, weights, ids, activation, tiles=default)
    nbytes = top_k * 3 * inter * hidden * 2
    result = {
        "experts": experts, "top_k": top_k, "hidden": hidden, "inter": inter,
        "weight_bytes": nbytes, "routings": ROUTINGS,
        "max_abs_diff_vs_fp32": (fused.float() - expected).abs().max().item(),
        "default_tiles": dataclasses.asdict(default), "triton_us": run(default),
    }  # fmt: skip
    result["triton_gbps"] = nbytes / (result["triton_us"] * 1e-6) / 1e9
    if gpt_oss:
        result["mxfp4"] = _measure_mxfp4_experts(c, x, routings, b13, b2, timer, sweep, g)
    if sweep:
        result.update(_sweep_down(run, default, top_k))
    return result


# (block_n, block_k, warps, stages) of the experts' down projection that ``--sweep`` tries
DOWN_TILES = list(itertools.product((4, 8, 16), (128, 256, 512), (4, 8), (2, 3)))


def _sweep_down(run, default, top_k: int) -> dict:
    """Every down-projection tile (``run(tiles)`` -> us) under 32K elements: ``sweep`` (fastest
    first, failures last) and ``best_us``."""
    trials = []
    for block_n, block_k, warps, stages in DOWN_TILES:
        if triton.next_power_of_2(top_k) * block_n * block_k > 32768:
            continue
        tiles = dataclasses.replace(default, down=(block_n, block_k, warps, stages))
        try:
            trials.append({"down": tiles.down, "us": run(tiles)})
        except Exception as e:  # noqa: BLE001 - out of resources, etc.
            trials.append({"down": tiles.down, "error": str(e)})
    ok = sorted((t for t in trials if "us" in t), key=lambda t: t["us"])
    return {"sweep": ok + [t for t in trials if "us" not in t],
            "best_us": ok[0]["us"] if ok else None}  # fmt: skip


def _measure_mxfp4_experts(c, x, routings, b13, b2, timer, sweep: bool, g) -> dict:
    """``measure_experts``' token through gpt-oss experts kept MXFP4 (random codes under scales
    near 2^-7), against the same kernels on their dequantized bf16 weights."""
    from nanograph.kernels import moe
    from nanograph.loader.mxfp4 import Mxfp4Tensor

    experts, top_k, hidden, inter = (
        c.num_experts, c.num_experts_per_tok, c.hidden_size, c.expert_intermediate_size
    )  # fmt: skip

    def packed(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        codes = torch.randint(0, 256, (experts, n, k // 2), device=x.device, generator=g,
                              dtype=torch.uint8)  # fmt: skip
        scales = torch.randint(118, 123, (experts, n, k // 32), device=x.device, generator=g,
                               dtype=torch.uint8)  # fmt: skip
        pair = Mxfp4Tensor(codes.view(experts, n, k // 32, 16), scales)
        return codes, scales, pair.dequantize(x.device, torch.bfloat16).transpose(-1, -2)

    c13, s13, d13 = packed(2 * inter, hidden)
    c2, s2, d2 = packed(hidden, inter)
    run = timer(c13, c2, w13_scales=s13, w2_scales=s2)
    default = moe.choose_tiles(1, top_k, experts, hidden, inter, x.device)
    weights, ids = routings[0]
    args = (b13, b2, weights, ids, c.moe_activation)
    dense = moe.fused_experts(x, d13.contiguous(), d2.contiguous(), *args).float()
    mine = moe.fused_experts(x, c13, c2, *args, w13_scales=s13, w2_scales=s2).float()
    nbytes = top_k * 3 * inter * hidden * 17 / 32  # 4-bit codes, a byte of scale per 32
    result = {
        "weight_bytes": nbytes, "default_tiles": dataclasses.asdict(default),
        "max_abs_diff_vs_dequantized": (mine - dense).abs().max().item(),
        "dequantized_max_abs": dense.abs().max().item(), "triton_us": run(default),
    }  # fmt: skip
    result["triton_gbps"] = nbytes / (result["triton_us"] * 1e-6) / 1e9
    if sweep:
        result.update(_sweep_down(run, default, top_k))
    return result


# Routings cycled through by ``measure_experts``: a token reads k of E experts, so 32 random
# draws touch ~32 k experts' weights (qwen3-30b-a3b: ~300 MB), far past the 50 MiB L2.
ROUTINGS = 32


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nanograph bench gemv", description=__doc__)
    parser.add_argument("--models", type=model_list, default="qwen3-8b,qwen3-0.6b")
    parser.add_argument("--sweep", action="store_true", help="also try other tile shapes")
    parser.add_argument("--rep-ms", type=int, default=100, help="sampling time per measurement")
    parser.add_argument(
        "--rows", type=int_list, default=None, metavar="N,N",
        help="time these row counts (few-row kernel vs cuBLAS) instead of one row (e.g. 5,8)",
    )  # fmt: skip
    parser.add_argument(
        "--blas", default="cublas,cublaslt",
        help="with --rows: the BLAS libraries to prefer in turn (torch's preferred_blas_library)",
    )  # fmt: skip
    parser.add_argument("--out", default=default_out("gemv.json"))
    args = parser.parse_args(argv)
    require_cuda("gemv")
    report = {"bench": "gemv", "env": environment(), "config": vars(args), "models": {}}
    start = time.perf_counter()
    (few_rows if args.rows else one_row)(args, report)
    report["seconds"] = time.perf_counter() - start
    write(args.out, report)
    return 0
