"""Stop 44: qwen3-8b's unfused MLP GEMVs (gate/up, then down with the activation on load) swept
inside a CUDA graph of 36 batch-1 layers (add_rmsnorm, gate/up, down: the decode graph's
kernels between attention halves). One product's tiles changed at a time; medians."""

import statistics
import sys

import torch

from nanograph.kernels import fused, gemv

torch.manual_seed(0)
L, H, INTER = 36, 4096, 12288
bf = dict(dtype=torch.bfloat16, device="cuda")
layers = [dict(nw=1 + 0.1 * torch.randn(H, **bf), gu=torch.randn(2 * INTER, H, **bf) * H**-0.5,
               down=torch.randn(H, INTER, **bf) * INTER**-0.5) for _ in range(L)]  # fmt: skip
stream0 = torch.randn(1, H, **bf)
GU = gemv.choose_tiles(2 * INTER, H, 0)
DOWN = gemv.choose_tiles(H, INTER, 0)
print(f"defaults: gate/up {GU}, down {DOWN}", flush=True)


def forward(stream, gu_tiles, down_tiles):
    x = stream
    for w in layers:
        xn, _ = fused.add_rmsnorm(x, stream, w["nw"], 1e-6)
        act = gemv.gemv(xn, w["gu"], tiles=gu_tiles)
        x = gemv.gemv(act, w["down"], silu_mul=True, tiles=down_tiles)


def timed(gu_tiles, down_tiles, label):
    stream = stream0.clone()
    forward(stream, gu_tiles, down_tiles)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        forward(stream, gu_tiles, down_tiles)
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


T = gemv.GemvTiles
timed(GU, DOWN, "default")
for c in [T(8, 512, 8, 4), T(4, 1024, 8, 4), T(8, 1024, 8, 3), T(8, 512, 8, 6), T(16, 512, 8, 4),
          T(4, 512, 4, 4), T(8, 256, 4, 6)]:  # fmt: skip
    try:
        timed(GU, c, f"down {c}")
    except Exception as e:  # noqa: BLE001
        print(f"down {c}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr, flush=True)
timed(GU, DOWN, "default again")
for c in [T(16, 512, 8, 3), T(16, 512, 8, 6), T(32, 512, 8, 4), T(16, 1024, 8, 3), T(8, 512, 8, 4)]:
    try:
        timed(c, DOWN, f"gate/up {c}")
    except Exception as e:  # noqa: BLE001
        print(f"gate/up {c}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr, flush=True)
timed(GU, DOWN, "default at the end")
