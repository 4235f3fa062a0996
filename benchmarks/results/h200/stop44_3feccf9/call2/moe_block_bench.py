"""Stop 44: the batch-1 MoE block (one persistent launch) against the five kernels it replaces,
in a CUDA graph of 24 qwen3-30b-a3b-shaped layers, each behind its o projection's GEMV (the
PDL kernel before it in the fused decode). Medians of replays; per layer."""

import statistics
import sys

import torch

from nanograph.kernels import fused, gemv, moe, moe_block
from nanograph.layers import ops

torch.manual_seed(0)
L, E, K, H, INTER, HQ = 24, 128, 8, 2048, 768, 4096
bf = dict(dtype=torch.bfloat16, device="cuda")
layers = []
for _ in range(L):
    layers.append(
        dict(
            o=torch.randn(H, HQ, **bf) * HQ**-0.5,
            nw=1 + 0.1 * torch.randn(H, **bf),
            router=torch.randn(E, H, **bf) * 0.05,
            w13=torch.randn(E, 2 * INTER, H, **bf) * H**-0.5,
            w2=torch.randn(E, H, INTER, **bf) * INTER**-0.5,
        )
    )
attn = torch.randn(1, HQ, **bf)
stream0 = torch.randn(1, H, **bf)


def old_layer(stream, w):
    gemv.gemv(attn, w["o"], residual=stream)
    xn = fused.rmsnorm(stream, w["nw"], 1e-6)
    logits = ops.linear(xn, w["router"])
    tw, ids = moe.route(logits, K, True, True)
    moe.fused_experts(
        xn, w["w13"], w["w2"], None, None, tw, ids, "silu", out=stream, accumulate=True
    )


def new_layer(stream, w, tiles):
    gemv.gemv(attn, w["o"], residual=stream)
    moe_block.moe_block(
        stream,
        w["nw"],
        1e-6,
        w["router"],
        None,
        w["w13"],
        w["w2"],
        None,
        None,
        K,
        True,
        True,
        "silu",
        tiles=tiles,
    )


def timed(fn, label):
    stream = stream0.clone()
    fn(stream)  # compile
    stream.copy_(stream0)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(stream)
    stream.copy_(stream0)
    g.replay()
    torch.cuda.synchronize()
    result = stream.clone()
    for _ in range(5):
        g.replay()
    samples = []
    for _ in range(15):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(10):
            g.replay()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) / 10 / L * 1000)
    print(f"{label}: {statistics.median(samples):.2f} us a layer (o GEMV + MoE)", flush=True)
    return result


def run_all(stream):
    for w in layers:
        old_layer(stream, w)


ref = timed(run_all, "old: rmsnorm, router, route, pairwise gate/up, down")
T = moe_block.BlockTiles
variants = {
    "default": None,
    "down 4 rows": T(down=(4, 256)),
    "stages 4": T(num_stages=4),
    "16 warps": T(num_warps=16),
    "gate/up 8 rows 1024 K, down 4": T(gate_up=(8, 1024), down=(4, 256)),
}
for name, tiles in variants.items():
    try:
        out = timed(lambda s, t=tiles: [new_layer(s, w, t) for w in layers], f"block {name}")
        grids = {k[2]: v for k, v in moe_block._GRIDS.items()}
        err = (out.float() - ref.float()).abs().max().item()
        print(
            f"   grid {list(moe_block._GRIDS.values())[-1]} programs; max |new - old| after "
            f"{L} layers {err:.4f} (|old| max {ref.float().abs().max().item():.2f})",
            flush=True,
        )
    except Exception as e:  # noqa: BLE001
        print(f"block {name}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
ref2 = timed(run_all, "old again")
