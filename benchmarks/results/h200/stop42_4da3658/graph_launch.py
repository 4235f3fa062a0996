"""Per-node cost of launching a CUDA graph: host time of replay() and device time per replay,
for graphs of n tiny kernels, with and without a pinned H2D copy before each replay."""

import time

import torch

dev = "cuda"
x = torch.zeros(256, device=dev)
dst = torch.zeros(4096, dtype=torch.uint8, device=dev)
src = torch.zeros(4096, dtype=torch.uint8).pin_memory()


def make(n):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(n):
            x.add_(1)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            x.add_(1)
    g.replay()
    torch.cuda.synchronize()
    return g


def timed(fn, reps=50):
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(2e8))  # keep the GPU busy so the host runs ahead
    e0.record()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    host = (time.perf_counter() - t) / reps
    e1.record()
    torch.cuda.synchronize()
    return host * 1e6, e0.elapsed_time(e1) / reps * 1e3


def synced(fn, reps=50):
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2] * 1e6


for n in (25, 50, 100, 200, 400, 800):
    g = make(n)
    for _ in range(3):
        timed(g.replay)
    h, d = timed(g.replay)
    hc, dc = timed(lambda g=g: (dst.copy_(src, non_blocking=True), g.replay()))
    s = synced(g.replay)
    print(
        f"n={n:4d}: replay host {h:7.1f} us, device {d:7.1f} us/replay ({d / n:.2f} us/node);"
        f" copy+replay host {hc:7.1f} device {dc:7.1f}; synced replay {s:7.1f} us",
        flush=True,
    )
