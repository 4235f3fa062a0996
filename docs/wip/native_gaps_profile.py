"""Where gpt-oss-20b's breakable prefill with the native MoE spends its wall time (stop 76):
the GPU's idle gaps in one profiled prefill, by the kernels either side of them.

Stop 76 measured two changes to the native loop, each of which should have shortened the
breakable arm if the loop were bound by one side: the experts held for NN products (8% less
GPU time in the loop's products) and plain ``mm`` with the biases outside them (less host time
a product). Both left breakable level. This asks where the time goes instead: one engine per
prefill backend (eager, breakable), 255-token prompts, timed medians of 9 after warm-up, then
one prefill under the profiler; its CUDA kernels are walked in start order and each gap
between one kernel's end and the next one's start is charged to the pair of kinds around it:
``product`` (a cuBLAS/CUTLASS GEMM: the loop's products, and the graph's own projections) or
``other``. Gaps after a sync (the loop's ``counts.tolist()``) show as other -> product at the
first product of a layer; a host-bound loop as product -> product; the activation's eager
launches as product -> other -> ... -> product. Prints the wall from the first kernel's start
to the last one's end, the busy time, and the gaps by class (count, total, largest).
    PYTHONPATH=$PWD python3 docs/wip/native_gaps_profile.py [MODEL] [BACKENDS] > $OUT/gaps.log
(MODEL gpt-oss-20b, BACKENDS none,breakable; ``--check`` tests the gap walk on made-up
kernels, on any machine; on CPU, ``smollm2-135m none`` smoke-runs the engine part)."""

import re
import statistics
import sys
import time
from collections import defaultdict

PRODUCT = re.compile(r"gemm|cutlass|xmma|cublas|nvjet", re.IGNORECASE)


def kind(name: str) -> str:
    return "product" if PRODUCT.search(name) else "other"


def gaps_by_class(kernels: list[tuple[str, float, float]]) -> dict:
    """kernels: (name, start_us, end_us). Returns wall, busy, and per (before, after) class the
    count, total and largest of the idle gaps (overlapping kernels leave no gap)."""
    kernels = sorted(kernels, key=lambda k: k[1])
    classes: dict[str, list[float]] = defaultdict(list)
    busy, frontier, prev = 0.0, kernels[0][1], kernels[0][0]
    for name, start, end in kernels:
        if start > frontier:
            classes[f"{kind(prev)} -> {kind(name)}"].append(start - frontier)
        busy += max(0.0, end - max(start, frontier))
        if end > frontier:
            frontier, prev = end, name
    wall = frontier - kernels[0][1]
    summary = {
        cls: {"count": len(g), "total_us": sum(g), "max_us": max(g)} for cls, g in classes.items()
    }
    return {"wall_us": wall, "busy_us": busy, "gaps": summary}


def report(label: str, stats: dict) -> None:
    wall, busy = stats["wall_us"] / 1e3, stats["busy_us"] / 1e3
    print(f"-- {label}: wall {wall:.2f} ms, busy {busy:.2f} ms, idle {wall - busy:.2f} ms",
          flush=True)  # fmt: skip
    for cls, g in sorted(stats["gaps"].items(), key=lambda kv: -kv[1]["total_us"]):
        print(f"   {cls:22s} {g['count']:5d} gaps, {g['total_us'] / 1e3:7.3f} ms, "
              f"largest {g['max_us']:.1f} us", flush=True)  # fmt: skip


def check() -> None:
    made_up = [("gemm_a", 0, 10), ("elementwise", 12, 14), ("gemm_b", 20, 30),
               ("gemm_c", 25, 40), ("sort", 45, 50)]  # fmt: skip
    stats = gaps_by_class(made_up)
    assert stats["wall_us"] == 50 and stats["busy_us"] == 37, stats
    gaps = {cls: g["total_us"] for cls, g in stats["gaps"].items()}
    assert gaps == {"product -> other": 7, "other -> product": 6}, gaps
    print("gap walk checked")


def main() -> None:
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from nanograph import LLM, SamplingParams

    model = sys.argv[1] if len(sys.argv) > 1 else "gpt-oss-20b"
    backends = (sys.argv[2] if len(sys.argv) > 2 else "none,breakable").split(",")
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    cuda = torch.cuda.is_available()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    for backend in backends:
        llm = LLM(model, load_format="dummy" if cuda else "auto", prefill_cuda_graph=backend,
                  decode_cuda_graph="none", disable_prefix_caching=True, max_num_seqs=4,
                  progress=False, cuda_graph_capture="startup",
                  moe_backend="torch_native")  # fmt: skip
        g = torch.Generator().manual_seed(0)
        vocab = min(llm.engine.model_config.vocab_size, 32000)
        prompts = [torch.randint(100, vocab, (255,), generator=g).tolist() for _ in range(13)]
        for ids in prompts[:3]:
            llm.generate([ids], params)
        times = []
        for ids in prompts[3:12]:
            sync()
            start = time.perf_counter()
            llm.generate([ids], params)
            sync()
            times.append((time.perf_counter() - start) * 1e3)
        print(f"== {model} prefill {backend}: median {statistics.median(times):.2f} ms "
              f"({min(times):.2f}-{max(times):.2f})", flush=True)  # fmt: skip
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            llm.generate([prompts[12]], params)
            sync()
        kernels = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type == DeviceType.CUDA and "Memcpy" not in e.name
                   and "Memset" not in e.name]  # fmt: skip
        if not kernels:  # the CPU machine: a smoke run of the engine's arguments
            print("   no CUDA kernels", flush=True)
            continue
        report(f"{backend} ({len(kernels)} kernels)", gaps_by_class(kernels))
        products = [k[2] - k[1] for k in kernels if kind(k[0]) == "product"]
        print(f"   products: {len(products)}, {sum(products) / 1e3:.2f} ms, median "
              f"{statistics.median(products):.1f} us", flush=True)  # fmt: skip
        del llm
        sync()


if __name__ == "__main__":
    check() if "--check" in sys.argv else main()
