"""Where the 8k prefill's attention time goes in the engine (per launch), and the clocks."""

import gzip
import json
import os
import subprocess
import sys
import time

from torch.profiler import ProfilerActivity, profile

from nanograph import LLM
from nanograph.bench.common import STARTUP_CAPTURE, sync
from nanograph.bench.floor import step_batch

out = os.environ["OUT"]
length = int(sys.argv[1])
graph = sys.argv[2] if len(sys.argv) > 2 else "full"
llm = LLM(
    "qwen3-0.6b",
    load_format="dummy",
    decode_cuda_graph="none",
    prefill_cuda_graph=graph,
    prefill_graph_tokens=(length,),
    chunked_prefill_size=length,
    max_num_seqs=2,
    max_model_len=length + 16,
    progress=False,
    **STARTUP_CAPTURE,
)
batch, pages = step_batch(llm, length)
runner = llm.engine.runner
for _ in range(5):
    runner.forward(batch)
sync()
smi = subprocess.Popen(
    [
        "nvidia-smi",
        "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,"
        "temperature.gpu,clocks_throttle_reasons.active",
        "--format=csv",
        "-lms",
        "50",
    ],
    stdout=open(f"{out}/smi_{graph}_{length}.csv", "w"),
)
time.sleep(0.5)
t = time.perf_counter()
n = 100
for _ in range(n):
    runner.forward(batch)
sync()
ms = (time.perf_counter() - t) / n * 1000
print(f"{graph} {length}: {n} forwards back to back {ms:.3f} ms each")
time.sleep(0.3)
smi.terminate()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(3):
        runner.forward(batch)
    sync()
path = f"/tmp/trace_{graph}_{length}.json"
prof.export_chrome_trace(path)
ev = [e for e in json.load(open(path))["traceEvents"] if e.get("cat") == "kernel"]
ev.sort(key=lambda e: e["ts"])
per = len(ev) // 3
first = ev[per : 2 * per]
agg = {}
for e in first:
    a = e.get("args", {})
    key = (
        e["name"][:40],
        str(a.get("grid")),
        str(a.get("block")),
        a.get("registers per thread"),
        a.get("shared memory"),
    )
    agg.setdefault(key, []).append(e["dur"])
for key, d in sorted(agg.items(), key=lambda kv: -sum(kv[1])):
    print(
        f"{sum(d) / 1000:8.3f} ms  n={len(d):3d} mean={sum(d) / len(d):8.1f} us min={min(d):7.1f} "
        f"max={max(d):7.1f}  {key}"
    )
span = (first[-1]["ts"] + first[-1]["dur"] - first[0]["ts"]) / 1000
print(f"forward span {span:.3f} ms, kernels {len(first)}")
with gzip.open(f"{out}/trace_{graph}_{length}.json.gz", "wt") as f:
    json.dump(first, f)
