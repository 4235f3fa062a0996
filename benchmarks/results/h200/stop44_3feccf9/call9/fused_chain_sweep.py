"""Stop 44 (call 9): qwen3-0.6b's fused batch-1 decode GEMVs (q/k/v with the norm prologue, o
with the residual epilogue, gate/up with norm and SiLU, down with the residual) swept inside a
CUDA graph of 28 layers (attention left out: the o GEMV reads a fixed row). One product's tiles
changed at a time against choose_tiles'; medians of replays, per layer."""

import dataclasses
import statistics
import sys

import torch

from nanograph.kernels import gemv

torch.manual_seed(0)
L, H, QKV, HQ, INTER = 28, 1024, 4096, 2048, 3072
bf = dict(dtype=torch.bfloat16, device="cuda")
layers = [dict(n1=1 + 0.1 * torch.randn(H, **bf), qkv=torch.randn(QKV, H, **bf) * H**-0.5,
               o=torch.randn(H, HQ, **bf) * HQ**-0.5, n2=1 + 0.1 * torch.randn(H, **bf),
               gu=torch.randn(2 * INTER, H, **bf) * H**-0.5,
               down=torch.randn(H, INTER, **bf) * INTER**-0.5) for _ in range(L)]  # fmt: skip
attn = torch.randn(1, HQ, **bf)
stream0 = torch.randn(1, H, **bf)
DEFAULTS = dict(
    qkv=gemv.choose_tiles(QKV, H, 0),
    o=gemv.choose_tiles(H, HQ, 0),
    gu=dataclasses.replace(
        gemv.choose_tiles(2 * INTER, H, 0), block_n=gemv.choose_tiles(2 * INTER, H, 0).block_n // 2
    ),
    down=gemv.choose_tiles(H, INTER, 0),
)  # gate/up: rows a stream (gemv halves them)
print(f"defaults {DEFAULTS}", flush=True)


def forward(stream, t):
    for w in layers:
        gemv.gemv(stream, w["qkv"], norm_weight=w["n1"], tiles=t["qkv"])
        gemv.gemv(attn, w["o"], residual=stream, tiles=t["o"])
        act = gemv.gemv(stream, w["gu"], norm_weight=w["n2"], silu_out=True, tiles=t["gu"])
        gemv.gemv(act, w["down"], residual=stream, tiles=t["down"])


def timed(t, label):
    stream = stream0.clone()
    forward(stream, t)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        forward(stream, t)
    for _ in range(5):
        g.replay()
    samples = []
    for _ in range(15):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(20):
            g.replay()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) / 20 / L * 1000)
    print(f"{label}: {statistics.median(samples):.3f} us a layer", flush=True)


T = gemv.GemvTiles
timed(DEFAULTS, "default")
for product in ("qkv", "o", "gu", "down"):
    for c in [T(8, 512, 8, 4), T(4, 1024, 8, 4), T(16, 512, 8, 3), T(8, 256, 4, 4),
              T(16, 256, 4, 3), T(4, 512, 4, 4), T(8, 1024, 4, 3)]:  # fmt: skip
        if c == DEFAULTS[product]:
            continue
        try:
            timed(dict(DEFAULTS, **{product: c}), f"{product} {c}")
        except Exception as e:  # noqa: BLE001
            print(f"{product} {c}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr, flush=True)
    timed(DEFAULTS, "default again")
