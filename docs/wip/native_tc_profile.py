"""Why does tc_piecewise prefill qwen3-30b-a3b's native MoE slower than eager (stop 66's
coverage: 0.69x, where breakable is 1.34x and gpt-oss-20b's native under tc_piecewise 2.59x)?
One engine per prefill backend, 255-token prompts (the prefix cache off), timed medians of
9 after warm-up, then one prefill under the profiler: host time by op and GPU kernel counts,
so a piece that replays eagerly, a copy a layer or a slow Inductor kernel shows up.
PYTHONPATH=$PWD python3 docs/wip/native_tc_profile.py [MODEL] [BACKENDS] > $OUT/tc.log
(MODEL qwen3-30b-a3b, BACKENDS none,breakable,tc_piecewise; on CPU: smollm2-135m,none).

Stop 76 added the GPU's idle gaps of that prefill, by the kinds of kernel either side of each
(``product``: a cuBLAS/CUTLASS GEMM, the native loop's products among them; ``other``): for
gpt-oss-20b's breakable prefill, where neither the NN layout (less GPU time a product) nor
plain ``mm`` (less host time a product) moved it. A sync bubble shows as other -> product at
a layer's first product, a host-bound loop as product -> product, the activation's eager
launches as product -> other and other -> other. ``--check`` tests the gap walk on made-up
kernels, on any machine."""

import re
import statistics
import sys
import time
from collections import defaultdict

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

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


def report_gaps(label: str, stats: dict) -> None:
    wall, busy = stats["wall_us"] / 1e3, stats["busy_us"] / 1e3
    print(f"-- {label} gaps: wall {wall:.2f} ms, busy {busy:.2f} ms, idle {wall - busy:.2f} ms",
          flush=True)  # fmt: skip
    for cls, g in sorted(stats["gaps"].items(), key=lambda kv: -kv[1]["total_us"]):
        print(f"   {cls:22s} {g['count']:5d} gaps, {g['total_us'] / 1e3:7.3f} ms, "
              f"largest {g['max_us']:.1f} us", flush=True)  # fmt: skip


if "--check" in sys.argv:
    made_up = [("gemm_a", 0, 10), ("elementwise", 12, 14), ("gemm_b", 20, 30),
               ("gemm_c", 25, 40), ("sort", 45, 50)]  # fmt: skip
    stats = gaps_by_class(made_up)
    assert stats["wall_us"] == 50 and stats["busy_us"] == 37, stats
    gaps = {cls: g["total_us"] for cls, g in stats["gaps"].items()}
    assert gaps == {"product -> other": 7, "other -> product": 6}, gaps
    print("gap walk checked")
    sys.exit(0)

from nanograph import LLM, SamplingParams  # noqa: E402

model = sys.argv[1] if len(sys.argv) > 1 else "qwen3-30b-a3b"
backends = (sys.argv[2] if len(sys.argv) > 2 else "none,breakable,tc_piecewise").split(",")
cuda = torch.cuda.is_available()
params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)


def sync() -> None:
    if cuda:
        torch.cuda.synchronize()


for backend in backends:
    extra = {"moe_backend": "torch_native"} if "a3b" in model or "oss" in model else {}
    llm = LLM(model, load_format="dummy" if cuda else "auto", prefill_cuda_graph=backend,
              decode_cuda_graph="none", disable_prefix_caching=True, max_num_seqs=4,
              progress=False, cuda_graph_capture="startup", **extra)  # fmt: skip
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
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        llm.generate([prompts[12]], params)
        sync()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22)
    print(table, flush=True)
    if cuda:
        kernels = [e for e in prof.key_averages() if e.device_time_total > 0]
        launches = sum(e.count for e in kernels)
        gpu_ms = sum(e.self_device_time_total for e in kernels) / 1e3
        print(f"-- {backend}: {launches} GPU ops, {gpu_ms:.2f} ms GPU time", flush=True)
        timeline = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                    if e.device_type == DeviceType.CUDA and "Memcpy" not in e.name
                    and "Memset" not in e.name]  # fmt: skip
        report_gaps(f"{backend} ({len(timeline)} kernels)", gaps_by_class(timeline))
        products = [end - start for name, start, end in timeline if kind(name) == "product"]
        if products:
            print(f"   products: {len(products)}, {sum(products) / 1e3:.2f} ms, median "
                  f"{statistics.median(products):.1f} us", flush=True)  # fmt: skip
    del llm
    sync()
