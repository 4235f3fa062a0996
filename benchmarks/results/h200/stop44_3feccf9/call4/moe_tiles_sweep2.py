"""Stop 44: the pairwise MoE kernels' tiles swept inside a CUDA graph of 24 qwen3-30b-a3b-shaped
batch-1 layers (o GEMV, rmsnorm, router GEMV, routing, gate/up, down added into the stream: the
fused decode's kernels). One tile changed at a time against the defaults; medians of replays."""

import statistics
import sys

import torch

from nanograph.kernels import fused, gemv, moe
from nanograph.layers import ops

torch.manual_seed(0)
L, E, K, H, INTER, HQ = 24, 128, 8, 2048, 768, 4096
bf = dict(dtype=torch.bfloat16, device="cuda")
layers = [dict(o=torch.randn(H, HQ, **bf) * HQ**-0.5, nw=1 + 0.1 * torch.randn(H, **bf),
               router=torch.randn(E, H, **bf) * 0.05,
               w13=torch.randn(E, 2 * INTER, H, **bf) * H**-0.5,
               w2=torch.randn(E, H, INTER, **bf) * INTER**-0.5) for _ in range(L)]  # fmt: skip
attn = torch.randn(1, HQ, **bf)
stream0 = torch.randn(1, H, **bf)
DEFAULT = moe.choose_tiles(1, K, E, H, INTER, torch.device("cuda"))
print(f"default {DEFAULT}", flush=True)


def forward(stream, tiles):
    for w in layers:
        gemv.gemv(attn, w["o"], residual=stream)
        xn = fused.rmsnorm(stream, w["nw"], 1e-6)
        tw, ids = moe.route(ops.linear(xn, w["router"]), K, True, True)
        moe.fused_experts(xn, w["w13"], w["w2"], None, None, tw, ids, "silu", tiles=tiles,
                          out=stream, accumulate=True)  # fmt: skip


def timed(tiles, label):
    stream = stream0.clone()
    forward(stream, tiles)
    stream.copy_(stream0)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        forward(stream, tiles)
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
    print(f"{label}: {statistics.median(samples):.2f} us a layer", flush=True)
    return statistics.median(samples)


def with_gate_up(n, k, warps, stages):
    from dataclasses import replace

    return replace(DEFAULT, block_n=n, block_k=k, num_warps=warps, num_stages=stages)


def with_down(n, k, warps, stages):
    from dataclasses import replace

    return replace(DEFAULT, down=(n, k, warps, stages))


results = {}
timed(DEFAULT, "default")
for c in [(32, 256, 8, 4), (32, 256, 8, 3), (32, 256, 8, 6), (16, 256, 8, 4), (16, 256, 4, 6),
          (32, 256, 4, 4), (64, 256, 8, 4), (32, 128, 8, 6), (16, 256, 4, 3), (64, 128, 8, 4),
          (16, 256, 4, 4)]:  # fmt: skip
    try:
        results[c] = timed(with_gate_up(*c), f"gate/up {c}")
    except Exception as e:  # noqa: BLE001
        print(f"gate/up {c}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr, flush=True)
timed(DEFAULT, "default at the end")
best = min(results, key=results.get)
print(f"BEST {','.join(str(v) for v in best)}", flush=True)
