"""Does taking the RMSNorms into the few-row products keep the room that
``norms_upper_bound_probe.py`` measured? (stop 60, rewritten in stop 61 for the form that
landed in d3eef07. On the device from the repo root: ``bash docs/wip/stop61_calls.sh chain
$OUT/f``.)

Why: batch 2-8 decode graphs without their norm kernels were 10-11% shorter on qwen3-0.6b and
2-3% on qwen3-8b (H100, stop 60). The few-row kernel (``kernels/rows.py``) has ``next_norm``
(the product added into the stream in its epilogue, which also writes the updated stream times
the next norm's weight and its rows' sums of squares in parts: ``gemm_rows_normed``) and
``norm`` (the next product over that, each output row scaled by the stream's 1/rms). Here a
chain of a model's layer products at M rows, 28 (0.6b) or 36 (8b) layers of distinct weights,
no attention (q/k/v's first columns stand in for its output):
- ``unfused``: the engine's batch 2-8 decode before stop 61 (``set_fused_rows("off")``):
  add_rmsnorm, q/k/v, o, add_rmsnorm, gate/up with the activation, down; a final add_rmsnorm;
- ``fused``: the first layer's input rmsnorm and q/k/v on their own, then o readying the
  post-attention norm, gate/up with it and the activation, down readying the next layer's
  input norm, q/k/v with it...; the last down a plain residual add; a final rmsnorm.
Random weights of the model's shapes (~unit gain). Graph replays (``graphed_samples``, the L2
flushed by a read before each), two rounds each arm first once, and the two chains' final
rows compared (bf16: the fused chain rounds elsewhere, so a tolerance, not equality).
Stop 60's first form (each normalising program summed the raw rows' squares over the whole K
before its weight stream) was 3.4-12% slower than unfused (H100); stop 61's second (the sums
of squares as an MMA of the raw rows in the weight loop) 1-7% faster here but slower in the
engine (``decode_breakdown.py``: gate/up 5.8 -> 9.3 us at qwen3-0.6b batch 2).
PREDICTED for this form (H100, before its run): fused 6-9% under unfused on qwen3-0.6b, 2-3%
on qwen3-8b; final rows within ~3% of the largest. MEASURED (H100, 352adf9 with the patch that
became d3eef07; ``benchmarks/results/h100/stop61_f27e490/``): -17.6 / -17.6 / -17.9% on
qwen3-0.6b at 2 / 4 / 8 rows, -1.4 / -1.1 / -2.1% on qwen3-8b; final rows within 0.021-0.028.
"""

import sys

import torch

from nanograph.bench.common import graphed_samples, median
from nanograph.kernels import fused
from nanograph.kernels.rows import gemm_rows, gemm_rows_normed
from nanograph.loader import resolve_model

MODELS = sys.argv[1].split(",") if len(sys.argv) > 1 else ["qwen3-0.6b", "qwen3-8b"]
ROWS = [int(m) for m in sys.argv[2].split(",")] if len(sys.argv) > 2 else [2, 4, 8]
EPS = 1e-6


def weights(c, layers: int) -> list[dict[str, torch.Tensor]]:
    """Per layer: the four products' weights (bf16, ~unit-gain) and the two norms' weights."""
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


def fused_chain(stream: torch.Tensor, layers, ao: int, final: torch.Tensor) -> torch.Tensor:
    normed = None  # the first layer's input norm runs on its own
    for i, w in enumerate(layers):
        if normed is None:
            qkv = gemm_rows(fused.rmsnorm(stream, w["norm_in"], EPS), w["qkv"])
        else:
            qkv = gemm_rows(normed.scaled, w["qkv"], norm=normed)
        post = gemm_rows_normed(qkv[:, :ao], w["o"], stream, (w["norm_post"], EPS))
        act = gemm_rows(post.scaled, w["gate_up"], silu_out=True, norm=post)
        if i + 1 < len(layers):
            normed = gemm_rows_normed(act, w["down"], stream, (layers[i + 1]["norm_in"], EPS))
        else:
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
        b = fused_chain(start.clone(), layers, ao, final).float()
        err = ((a - b).abs().max() / a.abs().max()).item()
        times = {"unfused": [], "fused": []}
        arms = (("unfused", unfused), ("fused", fused_chain))
        for order in (arms, arms[::-1]):  # two rounds, each arm first once
            for name, chain in order:
                scratch = start.clone()  # the chains update it in place: values drift
                samples = graphed_samples(lambda f=chain, s=scratch: f(s, layers, ao, final), 200)
                times[name].append(1000 * median(samples) / n)
        a, b = (sum(times[k]) / 2 for k in ("unfused", "fused"))
        rounds = ", ".join(f"{u:.2f}/{f:.2f}" for u, f in zip(times["unfused"], times["fused"]))
        print(f"{model} {m} rows: unfused {a:.2f} us a layer, fused {b:.2f} "
              f"({100 * (b / a - 1):+.1f}%; rounds {rounds}); final rows differ by {err:.2g} "
              "of the largest", flush=True)  # fmt: skip


for model in MODELS:
    measure(model)
    torch.cuda.empty_cache()
