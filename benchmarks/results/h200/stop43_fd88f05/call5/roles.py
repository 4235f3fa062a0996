"""Per-kernel durations of call 5's traces by launch shape (grid, block): which kernel of the
layer each is (qwen3-8b: grid 1536 = gate/up, 512 = o and down, 384 = q/k/v). Durations of
programmatic dependent launches include their wait. Run: python3 roles.py (in this folder)."""

import collections
import gzip
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 9  # the profiled generate of 8 + 1 tokens

for mode in ("auto", "always"):
    with gzip.open(f"{HERE}/trace_{mode}.json.gz") as f:
        events = json.load(f)["traceEvents"]
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    roles = collections.defaultdict(list)
    for e in kernels:
        args = e.get("args", {})
        roles[(e["name"][:24], tuple(args.get("grid", [])))].append(e["dur"])
    print(mode)
    for (name, grid), durs in sorted(roles.items(), key=lambda kv: -sum(kv[1])):
        if len(durs) >= 36:
            mid = sorted(durs)[len(durs) // 2]
            print(f"  {name:24s} grid {grid}: n={len(durs)} median {mid:.2f} us, "
                  f"{sum(durs) / STEPS / 1000:.3f} ms a step")  # fmt: skip
