"""What the host waits on before a graph's first kernel (stop 41's open question; run on the
device from the repo root: ``python3 docs/wip/prof_host_gap.py``).

Stop 41's ``prof_gaps.py`` (benchmarks/results/h200/stop41_ca8b1ec/) found 33-80 us of GPU idle
a forward between the inputs' host-to-device copy and the graph's first kernel, in forwards
issued back to back, where the host should run two forwards ahead. This times, per forward of
the same loop, the host's time in the steps that may block (``StaticInputs.copy_from``'s mirror
wait, the graph launch, the sampled rows' copy) and how far ahead of the GPU the host is when
each forward starts (an event recorded at the start of each forward, queried by the next)."""

import sys
import time

import torch

from nanograph import LLM
from nanograph.bench.common import STARTUP_CAPTURE
from nanograph.bench.spec import scratch_batch
from nanograph.runners import static_inputs

MODEL = sys.argv[1] if len(sys.argv) > 1 else "qwen3-8b"
llm = LLM(
    MODEL, load_format="dummy", prefill_cuda_graph="none", cuda_graph_bs=(1, 4),
    max_num_seqs=4, max_model_len=700, disable_prefix_caching=True, progress=False,
    **STARTUP_CAPTURE,
)  # fmt: skip
runner, page = llm.engine.runner, llm.engine.config.page_size
spent: dict[str, float] = {}


def timed(owner, name: str, label: str) -> None:
    real = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            spent[label] = spent.get(label, 0.0) + time.perf_counter() - start

    setattr(owner, name, wrapper)


timed(static_inputs._HostMirror, "wait", "mirror wait")
timed(torch.cuda.CUDAGraph, "replay", "graph launch")
timed(static_inputs.StaticInputs, "copy_from", "copy_from (all)")
N = 20
for bs in (1, 4):
    batch = scratch_batch(bs, 1, 512, page, False)
    for _ in range(5):
        runner.forward(batch).argmax(-1)
    torch.cuda.synchronize()
    spent.clear()
    behind = []  # forwards the GPU has not finished when the host starts the next
    events: list[torch.cuda.Event] = []
    start = time.perf_counter()
    for _ in range(N):
        behind.append(sum(not e.query() for e in events[-4:]))
        runner.forward(batch).argmax(-1)
        events.append(torch.cuda.Event())
        events[-1].record()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    total = time.perf_counter() - start
    print(f"{MODEL} decode batch {bs}: host {host / N * 1e3:.3f} ms a forward,"
          f" all {total / N * 1e3:.3f}; forwards in flight at each start {behind}")  # fmt: skip
    for label, seconds in spent.items():
        print(f"  {label}: {seconds / N * 1e6:.1f} us a forward")
