"""Stop 43's batch-1 decode A/B as one figure: tok/s of each run, fd88f05 against 42c35b5's tree
(the runs alternated within each call). Run from the repo root:
python3 benchmarks/results/h200/stop43_fd88f05/ab_figure.py"""

import glob
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ("qwen3-0.6b", "qwen3-8b", "qwen3-30b-a3b")


def runs(model: str, tree: str) -> list[float]:
    files = sorted(glob.glob(f"{HERE}/call*/dec_{model}_{tree}_*.json"))
    return [json.load(open(f))["models"][model]["arms"]["full"]["median_tok_s"]["1"]
            for f in files]  # fmt: skip


fig, axes = plt.subplots(1, len(MODELS), figsize=(12, 3.6))
for ax, model in zip(axes, MODELS):
    for x, (tree, label) in enumerate((("main", "fd88f05"), ("new", "42c35b5"))):
        values = runs(model, tree)
        ax.scatter([x] * len(values), values, label=label)
    ax.set_xticks([0, 1], ["fd88f05", "42c35b5"])
    ax.set_title(f"{model}, batch 1")
    ax.set_ylabel("decode tok/s (median of 3)")
fig.suptitle("H200, bench decode --arms full --batches 1: each point one run")
fig.tight_layout()
fig.savefig(f"{HERE}/decode_ab.png", dpi=110)
