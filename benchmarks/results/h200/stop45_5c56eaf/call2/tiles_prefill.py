"""Sustained 8k prefill (back to back, power-capped regime) with the long new-key tiles forced."""

import dataclasses
import os
import subprocess
import sys
import time

import torch

import nanograph.kernels.attention as A

variant = sys.argv[1]
length = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
model = sys.argv[3] if len(sys.argv) > 3 else "qwen3-0.6b"
VARIANTS = {  # rows, block_n, warps, stages, prefetch_pages
    "A": None,
    "B": (128, 128, 8, 2, True),
    "C": (128, 64, 8, 3, False),
    "D": (128, 64, 4, 2, False),
    "E": (64, 128, 4, 2, False),
    "F": (64, 32, 4, 4, False),
}
orig = A.choose_tiles.__wrapped__


@__import__("functools").lru_cache(maxsize=512)
def patched(device, num_tokens, num_seqs, nq, nkv, hd, mql, num_splits=None, exact=False):
    t = orig(device, num_tokens, num_seqs, nq, nkv, hd, mql, num_splits, exact)
    v = VARIANTS[variant]
    if (
        v is None
        or t.per_request
        or not t.new_keys
        or t.block_n != 64
        or t.block_q * t.group_pad != 64
    ):
        return t
    rows, bn, w, s, pf = v
    return dataclasses.replace(
        t, block_q=rows // t.group_pad, block_n=bn, num_warps=w, num_stages=s, prefetch_pages=pf
    )


A.choose_tiles = patched  # before the engine's modules bind launch_plan's global
from nanograph import LLM  # noqa: E402
from nanograph.bench.common import STARTUP_CAPTURE, sync  # noqa: E402
from nanograph.bench.floor import step_batch  # noqa: E402

out = os.environ.get("OUT", "/tmp")
llm = LLM(
    model,
    load_format="dummy",
    decode_cuda_graph="none",
    prefill_cuda_graph="full",
    prefill_graph_tokens=(length,),
    chunked_prefill_size=length,
    max_num_seqs=2,
    max_model_len=length + 16,
    progress=False,
    **STARTUP_CAPTURE,
)
plan = A.launch_plan(
    torch.device("cuda"),
    length,
    16,
    llm.engine.model_config.num_attention_heads,
    llm.engine.model_config.num_key_value_heads,
    128,
    length,
)
batch, pages = step_batch(llm, length)
runner = llm.engine.runner
for _ in range(10):
    runner.forward(batch)
sync()
smi = subprocess.Popen(
    [
        "nvidia-smi",
        "--query-gpu=clocks.sm,power.draw",
        "--format=csv,noheader,nounits",
        "-lms",
        "100",
    ],
    stdout=subprocess.PIPE,
    text=True,
)
res = []
for _rep in range(5):
    t = time.perf_counter()
    for _ in range(20):
        runner.forward(batch)
    sync()
    res.append((time.perf_counter() - t) / 20 * 1000)
smi.terminate()
clk = [line.split(",") for line in smi.stdout.read().strip().splitlines()]
mhz = sorted(float(c[0]) for c in clk if len(c) == 2)
w = sorted(float(c[1]) for c in clk if len(c) == 2)
# cool measurement: one forward after a pause, timed with events
time.sleep(1.0)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
cool = []
for _ in range(5):
    time.sleep(0.3)
    s.record()
    runner.forward(batch)
    e.record()
    sync()
    cool.append(s.elapsed_time(e))
print(
    f"{model} {length} variant {variant}: sustained ms/forward {[round(r, 2) for r in res]} "
    f"median {sorted(res)[2]:.2f}; cool {sorted(cool)[2]:.2f} ms; clocks median "
    f"{mhz[len(mhz) // 2]:.0f} MHz, power median {w[len(w) // 2]:.0f} W; long tiles "
    f"{plan[-1][0]}"
)
