"""What the few-row paths' RMSNorm kernels cost inside a decode graph: the most that folding the
norms into the products could save (stop 60; run on the device from the repo root:
``python3 docs/wip/norms_upper_bound_probe.py [models] [batches]``).

Why: batch 2-8 decode (and a verify, and issue 16's 2-token draft-extend) runs two norm kernels
a layer around the few-row products (eagerly ~1.7 us each at 2 rows on qwen3-0.6b, stop 59),
where the batch-1 path takes them into its GEMVs. The few-row kernel cannot normalise its rows
on load cheaply (rows through registers break its copy pipeline), but each norm's weight could
be folded into the next products' weight columns at load time, so the product takes the raw
residual rows and scales each output row by that row's 1/rms in its epilogue, the o and down
products adding into the residual there too. Before building that: the decode graph of each
batch with the norms replaced by nothing (``ops.rmsnorm`` returns x, ``ops.add_rmsnorm`` returns
(x, residual): the wrong numbers, the same other kernels) against the real one. Not wired in.
PREDICTED (H100, before any run): qwen3-0.6b -6 to -9% of the graph at batch 2 to 8 (two
~1.5-2 us kernels a layer, 28 layers, against 0.9-1.1 ms); qwen3-8b -1 to -2%.
MEASURED (stop 60, H100, ``h100/stop60_c25a30c/norms/``, two passes within 0.3%): qwen3-0.6b
**-10.2 / -11.0 / -10.9%** at batch 2 / 4 / 8 (0.918 -> 0.825, 0.971 -> 0.865, 1.067 -> 0.950
ms: ~3.3 us a layer, the two kernels' whole eager duration: PDL hides none of it); qwen3-8b
-2.2 / -1.8 / -2.8%. The upper bound is above the prediction. What a fused version keeps of it
depends on what replaces the kernels inside each product: each program of the next product
needs its rows' 1/rms (a pass over the rows from the L2 before its first MMA, ~0.6-1 us on the
critical path), and the norm weight must reach x before the MMA (the weight folded into the
next products' columns at load time) or through a normalised copy of the rows (each program
writing the same copy: the norm kernel's work on every program's path).
"""

import sys

import torch

from nanograph import LLM
from nanograph.bench.common import STARTUP_CAPTURE
from nanograph.bench.floor import graph_replay_ms, step_batch
from nanograph.layers import ops

MODELS = sys.argv[1].split(",") if len(sys.argv) > 1 else ["qwen3-0.6b", "qwen3-8b"]
BATCHES = [int(b) for b in sys.argv[2].split(",")] if len(sys.argv) > 2 else [2, 4, 8]
real = ops.rmsnorm, ops.add_rmsnorm


def replays(model: str) -> dict[int, float]:
    llm = LLM(model, load_format="dummy", prefill_cuda_graph="none", cuda_graph_bs=tuple(BATCHES),
              max_num_seqs=max(BATCHES), max_model_len=1024, disable_prefix_caching=True,
              progress=False, **STARTUP_CAPTURE)  # fmt: skip
    out = {}
    for bs in BATCHES:
        batch, pages = step_batch(llm, 512, bs)
        with torch.inference_mode():
            runs = [graph_replay_ms(llm.engine.runner, batch, bs, 300) for _ in range(3)]
        out[bs] = sorted(runs)[1]
        for p in pages:
            llm.engine.kv_cache.allocator.free(p)
    del llm
    torch.cuda.empty_cache()
    return out


for model in MODELS:
    for attempt in range(2):
        ops.rmsnorm, ops.add_rmsnorm = real
        with_norms = replays(model)
        ops.rmsnorm = lambda x, weight, eps: x
        ops.add_rmsnorm = lambda x, residual, weight, eps: (x, residual)
        without = replays(model)
        ops.rmsnorm, ops.add_rmsnorm = real
        for bs in BATCHES:
            a, b = with_norms[bs], without[bs]
            print(f"{model} batch {bs} pass {attempt}: graph {a:.4f} ms with the norms, "
                  f"{b:.4f} without ({100 * (b / a - 1):+.1f}%)", flush=True)  # fmt: skip
