"""Does folding the RMSNorms into the few-row products keep the room that
``norms_upper_bound_probe.py`` measured? (stop 60; not run yet. On the device from the repo
root: ``git apply docs/wip/rows_norm_fold.patch && python3 docs/wip/rows_norm_chain_probe.py``.)

Why: batch 2-8 decode graphs without their norm kernels were 10-11% shorter on qwen3-0.6b and
2-3% on qwen3-8b (H100, stop 60). ``rows_norm_fold.patch`` gives the few-row kernel
(``kernels/rows.py``) ``norm_eps`` (each program sums its rows' squares over the whole K from
the L2, multiplies the raw rows, scales each output row by its 1/rms) and ``residual`` (the
product added into the stream in its epilogue), for weights whose columns already carry the
norm's weight. Here a chain of a model's layer products at M rows, 28 (0.6b) or 36 (8b) layers of
distinct weights, no attention (q/k/v's first columns stand in for its output):
- ``unfused``: the engine's batch 2-8 decode today: add_rmsnorm, q/k/v, o, add_rmsnorm, gate/up
  with the activation, down; a final add_rmsnorm;
- ``folded``: q/k/v over the raw stream with ``norm_eps`` (its weight times the input norm's),
  o with ``residual``, gate/up with ``norm_eps`` and the activation (weight times the
  post-attention norm's), down with ``residual``; a final rmsnorm.
Graph replays (``graphed_samples``, the L2 flushed by a read before each) and the two chains'
final rows compared (bf16: the folded chain rounds elsewhere, so a tolerance, not equality).
PREDICTED (H100, before any run): folded 4-7% under unfused on qwen3-0.6b at 2-8 rows (of the
10-11% room, ~0.7 us of each normalising product's prologue on the critical path), 1-2% on
qwen3-8b; final rows within ~2% of the largest.
"""

import sys

import torch

from nanograph.bench.common import graphed_samples, median
from nanograph.kernels import fused
from nanograph.kernels.rows import gemm_rows
from nanograph.loader import resolve_model

MODELS = sys.argv[1].split(",") if len(sys.argv) > 1 else ["qwen3-0.6b", "qwen3-8b"]
ROWS = [int(m) for m in sys.argv[2].split(",")] if len(sys.argv) > 2 else [2, 4, 8]
EPS = 1e-6


def weights(c, layers: int) -> list[dict[str, torch.Tensor]]:
    """Per layer: the four products' weights (bf16, ~unit-gain), the two norms' weights, and
    q/k/v and gate/up with their norm's weight folded into their columns."""
    hidden, inter = c.hidden_size, c.intermediate_size
    qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
    out = []
    for _ in range(layers):
        w = {
            "qkv": torch.randn(qkv, hidden, device="cuda") / hidden**0.5,
            "o": torch.randn(hidden, c.num_attention_heads * c.head_dim, device="cuda")
            * 0.25
            / hidden**0.5,
            "gate_up": torch.randn(2 * inter, hidden, device="cuda") / hidden**0.5,
            "down": torch.randn(hidden, inter, device="cuda") * 0.25 / inter**0.5,
            "norm_in": 1 + 0.1 * torch.randn(hidden, device="cuda"),
            "norm_post": 1 + 0.1 * torch.randn(hidden, device="cuda"),
        }
        w["qkv_folded"] = w["qkv"] * w["norm_in"][None, :]
        w["gate_up_folded"] = w["gate_up"] * w["norm_post"][None, :]
        out.append({k: v.to(torch.bfloat16) for k, v in w.items()})
    return out


def unfused(stream: torch.Tensor, layers, ao: int, final: torch.Tensor) -> torch.Tensor:
    residual = stream
    h = fused.rmsnorm(residual, layers[0]["norm_in"], EPS)
    down = None
    for i, w in enumerate(layers):
        if i:
            h, residual = fused.add_rmsnorm(down, residual, w["norm_in"], EPS)
        qkv = gemm_rows(h, w["qkv"])
        o = gemm_rows(qkv[:, :ao], w["o"])
        h2, residual = fused.add_rmsnorm(o, residual, w["norm_post"], EPS)
        down = gemm_rows(gemm_rows(h2, w["gate_up"], silu_out=True), w["down"])
    return fused.add_rmsnorm(down, residual, final, EPS)[0]


def folded(stream: torch.Tensor, layers, ao: int, final: torch.Tensor) -> torch.Tensor:
    for w in layers:
        qkv = gemm_rows(stream, w["qkv_folded"], norm_eps=EPS)
        gemm_rows(qkv[:, :ao], w["o"], residual=stream)
        act = gemm_rows(stream, w["gate_up_folded"], silu_out=True, norm_eps=EPS)
        gemm_rows(act, w["down"], residual=stream)
    return fused.rmsnorm(stream, final, EPS)


def measure(model: str) -> None:
    c = resolve_model(model, "dummy").config
    n = c.num_hidden_layers
    layers = weights(c, n)
    final = (1 + 0.1 * torch.randn(c.hidden_size, device="cuda")).to(torch.bfloat16)
    ao = c.num_attention_heads * c.head_dim
    for m in ROWS:
        start = torch.randn(m, c.hidden_size, device="cuda").to(torch.bfloat16)
        a = unfused(start.clone(), layers, ao, final).float()
        b = folded(start.clone(), layers, ao, final).float()
        err = ((a - b).abs().max() / a.abs().max()).item()
        times = {}
        for name, chain in (("unfused", unfused), ("folded", folded)):
            scratch = start.clone()  # the chains update it in place: values drift, shapes not
            samples = graphed_samples(lambda f=chain, s=scratch: f(s, layers, ao, final), 200)
            times[name] = 1000 * median(samples) / n
        print(f"{model} {m} rows: unfused {times['unfused']:.2f} us a layer, folded "
              f"{times['folded']:.2f} ({100 * (times['folded'] / times['unfused'] - 1):+.1f}%); "
              f"final rows differ by {err:.2g} of the largest", flush=True)  # fmt: skip


for model in MODELS:
    measure(model)
    torch.cuda.empty_cache()
