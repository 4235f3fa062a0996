"""Why does tc_piecewise prefill qwen3-30b-a3b's native MoE slower than eager (stop 66's
coverage: 0.69x, where breakable is 1.34x and gpt-oss-20b's native under tc_piecewise 2.59x)?
One engine per prefill backend, 255-token prompts (the prefix cache off), timed medians of
9 after warm-up, then one prefill under the profiler: host time by op and GPU kernel counts,
so a piece that replays eagerly, a copy a layer or a slow Inductor kernel shows up.
PYTHONPATH=$PWD python3 docs/wip/native_tc_profile.py [MODEL] [BACKENDS] > $OUT/tc.log
(MODEL qwen3-30b-a3b, BACKENDS none,breakable,tc_piecewise; on CPU: smollm2-135m,none)."""

import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from nanograph import LLM, SamplingParams

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
    del llm
    sync()
