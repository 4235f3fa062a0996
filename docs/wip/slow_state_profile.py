# Stop 37's follow-up to sample_rows_view_diag.py (in git at 038f946), which found the slow state
# sticky: 20 forwards whose lm_head reads the graph's output buffer in place, through Triton or
# cuBLAS, leave qwen3-30b-a3b's decode graph at 2.55 ms until forwards that copy it first bring
# it back to 2.40. Which kernels of the graph slow down: all alike (a clock or memory state) or
# some (the data or addresses they touch)? Per-kernel GPU time of 20 replays under the profiler
# in each state, and the clocks after. Stop 37 found no kernel slower: the PDL GEMVs overlap
# less. With --no-pdl every kernel launches plainly (captured so): if both states then replay
# alike, the programmatic launches are what flips.
# PYTHONPATH=$PWD python3 /tmp/slow_state_profile.py [MODEL] [--no-pdl]
import collections
import subprocess
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from nanograph import LLM
from nanograph.bench.common import STARTUP_CAPTURE
from nanograph.bench.floor import graph_replay_ms, step_batch
from nanograph.kernels import pdl

args = [a for a in sys.argv[1:] if a != "--no-pdl"]
if "--no-pdl" in sys.argv:
    pdl.enabled = lambda t: False
model_name = args[0] if args else "qwen3-30b-a3b"
llm = LLM(
    model_name, load_format="dummy", decode_cuda_graph="full", prefill_cuda_graph="none",
    cuda_graph_bs=(1,), chunked_prefill_size=512, max_num_seqs=2, max_model_len=528,
    progress=False, **STARTUP_CAPTURE,
)  # fmt: skip
runner = llm.engine.runner
model = runner.model
graphs = runner.graph_runners["decode"]
torch.manual_seed(0)
batch, _ = step_batch(llm, 512, 1)


def forwards(kind: str) -> None:
    for _ in range(20):
        out = graphs.forward(batch, None)
        model.compute_logits(out[:1] if kind == "view" else out[:1].clone())
    torch.cuda.synchronize()


def kernel_us(replays: int = 20) -> dict[str, float]:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph_replay_ms(runner, batch, 1, replays)
    per = collections.Counter()
    for e in prof.key_averages():
        if e.device_time_total > 0:
            per[e.key] += e.device_time_total / replays
    return per


def clocks() -> str:
    q = "clocks.sm,clocks.mem,power.draw,temperature.gpu"
    return subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip


with torch.inference_mode():
    states = {}
    for kind in ["clone", "view", "clone", "view"]:
        forwards(kind)
        ms = graph_replay_ms(runner, batch, 1, 50)
        states[kind] = kernel_us()
        print(f"after 20 {kind:5s}: replay {ms:.3f} ms, kernels {sum(states[kind].values()):.1f} "
              f"us a replay; clocks {clocks()}", flush=True)  # fmt: skip
    fast, slow = states["clone"], states["view"]
    names = sorted(set(fast) | set(slow), key=lambda k: -abs(slow[k] - fast[k]))
    print("kernel (us a replay): fast / slow / slow - fast")
    for k in names[:25]:
        print(f"  {k[:90]:90s} {fast[k]:8.1f} {slow[k]:8.1f} {slow[k] - fast[k]:+7.1f}")
