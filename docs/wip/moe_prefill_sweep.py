"""The sorted (prefill) regime of ``kernels.moe.fused_experts`` over a few Hopper tiles, on the
device (stop 48): its tiles (``choose_tiles``: 64 x 64 x 64, 4 warps, 3 stages once experts
see > 64 rows) were never swept. gpt-oss-20b's 2048-token prefill took 100 ms under full graphs
in bf16 (300 with MXFP4 experts), where its ~11 TFLOP would take ~20 ms at 550 TFLOP/s: the
experts' GEMMs are the suspects. Per case (model, expert form, tokens): one MoE layer's
experts, random routing, each tile's time (median of graph replays), TFLOP/s, its output's
distance from the default tiles', and cuBLAS on the same rows unsorted (gate/up and down as
two plain GEMMs of T*k rows: the ceiling a grouped GEMM approaches).

    git apply docs/wip/moe_prefill.patch  # MoeTiles.act_apart and .scaled_dot
    python3 docs/wip/moe_prefill_sweep.py [--tokens 2048,8192] [--out sweep.json]

Each tile runs as main runs it, then with ``act_apart`` (the activation in a pass of its own:
the down GEMM's operand load recomputes it in each of its N / BLOCK_N programs a row block,
45x for gpt-oss-20b), and for MXFP4 also with ``scaled_dot`` (``tl.dot_scaled``, which Triton
lowers on Hopper to its own e2m1 upcast before wgmma). sm_90 SASS with Triton 3.6 (with
``tests/sm90_compile.py`` specializing unit strides as a launch does, stop 48), instructions
a K step of the loop, 64 x 64 x 64 in 4 warps: bf16 gate/up 98, down 954 (act fused) -> 98
(apart); MXFP4 ours 367 / 1273 -> 367, dot_scaled 350 / 1303. A K step's wgmma is ~128 cycles
of the SM's tensor cores; its loop issues ~instructions x 4 warps / 4 schedulers cycles.

Predicted, gpt-oss-20b, one layer's experts at 2048 tokens: bf16 ~1.6 ms as main runs it (the
down GEMM issue-bound at ~1.1 ms, gate/up ~0.45 at ~600 TFLOP/s), ~0.75 ms with the activation
apart (down ~0.23 + ~0.04 for the pass), i.e. ~20 ms off the 100 ms prefill; MXFP4 gains more
from 128-row tiles (a decoded weight tile feeds twice the MMAs: 363 instructions a step in 8
warps against 512 tensor cycles) than bf16 does; dot_scaled ~ our decode (350 against 367).
"""

from __future__ import annotations

import argparse
import json

import torch

from nanograph.bench.common import graphed_samples, median
from nanograph.kernels import moe

# (block_m, block_n, block_k, num_warps, num_stages)
TILES = [
    (64, 64, 64, 4, 3),  # the default
    (64, 128, 64, 4, 4),
    (128, 64, 64, 4, 3),
    (128, 128, 64, 8, 3),
    (64, 256, 64, 8, 3),
    (128, 256, 64, 8, 3),
]

MODELS = {  # experts, top_k, hidden, inter, activation
    "gpt-oss-20b": (32, 4, 2880, 2880, "clamped_swiglu"),
    "qwen3-30b-a3b": (128, 8, 2048, 768, "silu"),
}


def _case(model: str, mxfp4: bool, tokens: int, g: torch.Generator) -> dict:
    experts, top_k, hidden, inter, activation = MODELS[model]
    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(tokens, hidden, device=dev, dtype=bf, generator=g)
    logits = torch.randn(tokens, experts, device=dev, generator=g)
    weights, ids = torch.topk(logits.softmax(-1), top_k, dim=-1)
    weights = (weights / weights.sum(-1, keepdim=True)).to(bf)
    gpt_oss = activation == "clamped_swiglu"
    b13 = torch.zeros(experts, 2 * inter, device=dev, dtype=bf) if gpt_oss else None
    b2 = torch.zeros(experts, hidden, device=dev, dtype=bf) if gpt_oss else None
    if mxfp4:
        w13 = torch.randint(0, 256, (experts, 2 * inter, hidden // 2), device=dev,
                            dtype=torch.uint8, generator=g)  # fmt: skip
        w2 = torch.randint(0, 256, (experts, hidden, inter // 2), device=dev,
                           dtype=torch.uint8, generator=g)  # fmt: skip
        s13 = torch.randint(118, 123, (experts, 2 * inter, hidden // 32), device=dev,
                            dtype=torch.uint8, generator=g)  # fmt: skip
        s2 = torch.randint(118, 123, (experts, hidden, inter // 32), device=dev,
                           dtype=torch.uint8, generator=g)  # fmt: skip
        scales = dict(w13_scales=s13, w2_scales=s2)
    else:
        w13 = torch.randn(experts, 2 * inter, hidden, device=dev, dtype=bf, generator=g)
        w13 /= hidden**0.5
        w2 = torch.randn(experts, hidden, inter, device=dev, dtype=bf, generator=g) / inter**0.5
        scales = {}
    out = torch.empty_like(x)
    flops = 2 * tokens * top_k * 3 * inter * hidden
    default = moe.choose_tiles(tokens, top_k, experts, hidden, inter, x.device)
    reference = moe.fused_experts(x, w13, w2, b13, b2, weights, ids, activation, tiles=default,
                                  **scales).float()  # fmt: skip
    rows = []
    # (tiles, act_apart, scaled_dot): dot_scaled only with the activation apart (the down
    # GEMM's fused activation costs ~10x its loop either way)
    forms = [(False, False), (True, False)] + ([(True, True)] if mxfp4 else [])
    variants = [(t, apart, sd) for t in TILES for apart, sd in forms]
    for (bm, bn, bk, warps, stages), act_apart, scaled_dot in variants:
        tiles = moe.MoeTiles(bm, bn, bk, warps, stages, scaled_dot=scaled_dot,
                             act_apart=act_apart)  # fmt: skip
        try:
            got = moe.fused_experts(x, w13, w2, b13, b2, weights, ids, activation, tiles=tiles,
                                    **scales).float()  # fmt: skip
            diff = ((got - reference).norm() / reference.norm()).item()

            def step(tiles=tiles) -> None:
                moe.fused_experts(x, w13, w2, b13, b2, weights, ids, activation, tiles=tiles,
                                  out=out, **scales)  # fmt: skip

            ms = median(graphed_samples(step, 200))
            rows.append(dict(tiles=[bm, bn, bk, warps, stages], ms=ms, rel_diff=diff,
                             tflops=flops / ms / 1e9))  # fmt: skip
        except Exception as e:  # noqa: BLE001 - a tile the device refuses is a result too
            rows.append(dict(tiles=[bm, bn, bk, warps, stages], error=f"{type(e).__name__}: {e}"))
        rows[-1].update(scaled_dot=scaled_dot, act_apart=act_apart)
        r = rows[-1]
        said = (f"{r['ms']:.3f} ms {r['tflops']:.0f} TFLOP/s rel {r['rel_diff']:.1e}"
                if "ms" in r else r["error"][:160])  # fmt: skip
        print(f"  {r['tiles']}{_form(r)}: {said}", flush=True)
    # cuBLAS on the same rows, unsorted: the ceiling of the two grouped GEMMs
    a = torch.randn(tokens * top_k, hidden, device=dev, dtype=bf, generator=g)
    wa = torch.randn(hidden, 2 * inter, device=dev, dtype=bf, generator=g)
    h = torch.randn(tokens * top_k, inter, device=dev, dtype=bf, generator=g)
    wb = torch.randn(inter, hidden, device=dev, dtype=bf, generator=g)
    cublas = median(graphed_samples(lambda: (a @ wa, h @ wb), 200))
    return dict(model=model, mxfp4=mxfp4, tokens=tokens, default=list(_tiles_tuple(default)),
                rows=rows, cublas_ms=cublas, cublas_tflops=flops / cublas / 1e9)  # fmt: skip


def _form(row: dict) -> str:
    return (" act_apart" if row["act_apart"] else "") + (" dot_scaled" if row["scaled_dot"] else "")


def _tiles_tuple(t: moe.MoeTiles) -> tuple:
    return (t.block_m, t.block_n, t.block_k, t.num_warps, t.num_stages)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", default="2048,8192")
    p.add_argument("--cases", default="gpt-oss-20b:bf16,gpt-oss-20b:mxfp4,qwen3-30b-a3b:bf16")
    p.add_argument("--out", default="moe_prefill_sweep.json")
    args = p.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    results = []
    for case in args.cases.split(","):
        model, form = case.split(":")
        for tokens in map(int, args.tokens.split(",")):
            print(f"{model} {form} T={tokens}", flush=True)
            r = _case(model, form == "mxfp4", tokens, g)
            ok = [x for x in r["rows"] if "ms" in x]
            best = min(ok, key=lambda x: x["ms"])
            print(f"  default {ok[0]['ms']:.3f} ms, best {best['tiles']}{_form(best)} "
                  f"{best['ms']:.3f} ms "
                  f"({ok[0]['ms'] / best['ms']:.2f}x), cuBLAS unsorted {r['cublas_ms']:.3f} ms "
                  f"({r['cublas_tflops']:.0f} TFLOP/s)", flush=True)  # fmt: skip
            results.append(r)
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
