"""Why does the draft loop's capture take longer than the target's? (stop 60; run on the device
from the repo root: ``python3 docs/wip/draft_capture_probe.py [target] [drafter]``).

Why: issue 16 asks the draft runners' capture to take no longer than the target's. Stop 41
measured 0.85x on the H200 (draft loop 0.100 s + draft-extend 0.133 against decode 0.116 +
verify 0.157, batch sizes 1 and 4). Stop 59's ``bench spec`` (qwen3-0.6b drafting for itself,
H100, bd9bd52) recorded draft 0.285 + draft_extend 0.057 s against decode 0.041 + verify 0.054
(3.6x), and stop 60's (qwen3-0.6b drafting for qwen3-8b) draft 0.481 + 0.116 against 0.109 +
0.137 (2.4x), while qwen3-8b drafting for itself captured its loop in 0.137 s. Here each
runner's capture is timed again after ``release()`` (every kernel compiled, every cache warm),
three times, and the draft loop's last capture is profiled (cProfile, top functions by
cumulative and by own time), to tell a one-time cost from the capture's own.
PREDICTED (H100, before any run): warm captures of the draft loop ~0.1 s for batch sizes 1 and
4 (three steps a graph: ~3x a decode shape's), so the start-up figure holds a one-time cost
(a compile or a module load at the loop's first capture).
MEASURED (stop 60, H100, ``h100/stop60_c25a30c/draft_capture/``): at 1ea7a55 start-up draft
0.488 + draft_extend 0.116 s against decode 0.128 + verify 0.153; captured again 0.074-0.080
+ 0.094-0.102 against 0.109-0.111 + 0.130-0.132 (the profiled third draft capture: 0.15 s,
all model forwards and launches, no compile). The one-time cost: the loop's input advance
compiled a variant per power of two of the slot count (and for one slot) at each shape's
first capture. At 286953c (one variant for every slot count) on a fresh machine: start-up
0.054 + 0.070 against 0.073 + 0.083 (0.80x), again 0.054-0.100 + 0.065-0.101.
"""

import cProfile
import io
import pstats
import sys
import time

import torch

from nanograph import LLM
from nanograph.bench.common import STARTUP_CAPTURE

TARGET = sys.argv[1] if len(sys.argv) > 1 else "qwen3-8b"
DRAFTER = sys.argv[2] if len(sys.argv) > 2 else "qwen3-0.6b"
llm = LLM(
    TARGET, load_format="dummy", prefill_cuda_graph="none", cuda_graph_bs=(1, 4), max_num_seqs=4,
    max_model_len=1024, disable_prefix_caching=True, speculative_algorithm="draft_model",
    speculative_num_draft_tokens=4, speculative_draft_model_path=DRAFTER, progress=False,
    **STARTUP_CAPTURE,
)  # fmt: skip
engine = llm.engine
runners = {**engine.runner.graph_runners, **engine.draft_runner.graph_runners}
print("start-up capture_s:", {p: round(sum(r.capture_s for r in g.records.values()), 4)
                              for p, g in runners.items()})  # fmt: skip
for attempt in range(3):
    times = {}
    for path, runner in runners.items():
        runner.release()
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        start = time.perf_counter()
        if attempt == 2 and path == "draft":
            profile = cProfile.Profile()
            profile.enable()
            runner.capture(progress=False)
            profile.disable()
        else:
            runner.capture(progress=False)
        torch.cuda.synchronize()
        recorded = sum(r.capture_s for r in runner.records.values())
        times[path] = f"{time.perf_counter() - start:.3f} s ({recorded:.3f} in backend.capture)"
    print(f"recapture {attempt}:", times, flush=True)
for order in ("cumulative", "tottime"):
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats(order).print_stats(25)
    print(f"--- draft loop capture by {order} ---")
    print("\n".join(line[:160] for line in out.getvalue().splitlines()[:45]), flush=True)
