"""GPU time of the native MoE loop's per-expert products (models.moe._products) at prefill
shapes, by weight layout and BLAS choice: is cuBLAS's small-M efficiency (stop 70's profile:
gpt-oss-20b's 64 addmm a layer at 12.8 us each, ~60% of the bandwidth) a layout or a library
choice the native loop could make? Each variant's loop over all experts (the rows of a
256-token prefill, spread evenly) is captured in a CUDA graph and replayed, so the figure is
GPU time, not the loop's host cost; ``eager_ms`` is the same loop launched eagerly and synced
(wall time: the larger of the host's launches and the GPU's work, so whether the break's loop
is host- or GPU-bound). Medians of 20 (graph: replays of 5).
    PYTHONPATH=$PWD python3 docs/wip/native_products_probe.py [out.json]"""

import json
import statistics
import sys
import time

import torch

SHAPES = {  # name: experts, hidden, expert FFN, top-k, bias
    "gpt-oss-20b": (32, 2880, 2880, 4, True),
    "qwen3-30b-a3b": (128, 2048, 768, 8, False),
}
TOKENS = 256


def loop(rows, experts, sizes, weights, biases, out, nn):
    for e, xs, outs in zip(experts, rows.split(sizes), out.split(sizes)):
        w = weights[e] if nn else weights[e].t()
        if biases is None:
            torch.mm(xs, w, out=outs)
        else:
            torch.addmm(biases[e], xs, w, out=outs)


def time_graph(*args):
    def fn():
        loop(*args)

    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 5)
    return statistics.median(times)


def time_eager(*args):
    times = []
    for _ in range(23):
        torch.cuda.synchronize()
        start = time.perf_counter()
        loop(*args)
        torch.cuda.synchronize()
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times[3:])


def main():
    torch.manual_seed(0)
    dev = torch.device("cuda")
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for name, (num_experts, hidden, ffn, top_k, bias) in SHAPES.items():
        pairs = TOKENS * top_k
        sizes = [pairs // num_experts] * num_experts
        experts = list(range(num_experts))
        x = torch.randn(pairs, hidden, device=dev, dtype=torch.bfloat16)
        for product, (n, k) in (("gate_up", (2 * ffn, hidden)), ("down", (hidden, ffn))):
            xin = x if k == hidden else torch.randn(pairs, k, device=dev, dtype=torch.bfloat16)
            w_nk = torch.randn(num_experts, n, k, device=dev, dtype=torch.bfloat16) / k**0.5
            w_kn = w_nk.transpose(1, 2).contiguous()
            b = torch.randn(num_experts, n, device=dev, dtype=torch.bfloat16) if bias else None
            out = torch.empty(pairs, n, device=dev, dtype=torch.bfloat16)
            bytes_ = w_nk.numel() * 2
            for label, weights, nn in (("TN [N,K] (.t())", w_nk, False), ("NN [K,N]", w_kn, True)):
                for lib in ("cublas", "cublaslt"):
                    torch.backends.cuda.preferred_blas_library(lib)
                    ms = time_graph(xin, experts, sizes, weights, b, out, nn)
                    eager_ms = time_eager(xin, experts, sizes, weights, b, out, nn)
                    key = f"{name} {product} {label} {lib}"
                    us, tbs = 1000 * ms / num_experts, bytes_ / ms / 1e9
                    results[key] = {
                        "ms": ms,
                        "eager_ms": eager_ms,
                        "us_per_product": us,
                        "TB_s": tbs,
                    }
                    print(f"{key}: {ms:.3f} ms, {us:.1f} us a product, {tbs:.2f} TB/s; "
                          f"eager {eager_ms:.3f} ms", flush=True)  # fmt: skip
            del w_nk, w_kn
            torch.cuda.empty_cache()
        torch.backends.cuda.preferred_blas_library("cublas")
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
