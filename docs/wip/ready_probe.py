"""Seconds from importing nanograph to LLM(model) returning, start-up capture, dummy weights:
python3 docs/wip/ready_probe.py MODEL LABEL (stop 66's GC-paused start-up A/B)."""

import sys
import time

start = time.perf_counter()
from nanograph import LLM  # noqa: E402  (the import is part of what is timed)

llm = LLM(sys.argv[1], load_format="dummy", cuda_graph_capture="startup")
print(f"READY {sys.argv[2]} {time.perf_counter() - start:.2f} s", flush=True)
