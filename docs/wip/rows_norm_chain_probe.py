"""Does taking the RMSNorms into the few-row products keep the room that
``norms_upper_bound_probe.py`` measured? (stop 60; not run yet. On the device from the repo
root: ``bash docs/wip/stop60_calls.sh fold $OUT/f``, which applies ``rows_norm_fold.patch``.)

Why: batch 2-8 decode graphs without their norm kernels were 10-11% shorter on qwen3-0.6b and
2-3% on qwen3-8b (H100, stop 60). ``rows_norm_fold.patch`` gives the few-row kernel
(``kernels/rows.py``) ``norm_eps`` / ``norm_rows`` (each program sums the raw stream rows'
squares over the whole K from the L2 and scales each output row by its 1/rms; x is the stream
times the norm's weight) and ``residual`` / ``scaled`` (the product added into the stream in
its epilogue, which also writes the updated stream times the next norm's weight: the next
normalising product's x). Here a chain of a model's layer products at M rows, 28 (0.6b) or 36
(8b) layers of distinct weights, no attention (q/k/v's first columns stand in for its output):
- ``unfused``: the engine's batch 2-8 decode today: add_rmsnorm, q/k/v, o, add_rmsnorm, gate/up
  with the activation, down; a final add_rmsnorm;
- ``fused``: the stream times the first input norm's weight (one elementwise kernel a
  forward), then a layer: q/k/v with ``norm_eps`` over that, o with ``residual`` and ``scaled``
  (the stream times the post-attention norm's weight), gate/up with ``norm_eps`` and the
  activation over that, down with ``residual`` and ``scaled`` (times the next layer's input
  norm's weight); a final rmsnorm. The checkpoint's weights, untouched.
Graph replays (``graphed_samples``, the L2 flushed by a read before each) and the two chains'
final rows compared (bf16: the fused chain rounds elsewhere, so a tolerance, not equality).
PREDICTED (H100, before any run): fused 4-7% under unfused on qwen3-0.6b at 2-8 rows (of the
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
    scaled_in = (stream.float() * layers[0]["norm_in"].float()).to(stream.dtype)
    scaled_post = torch.empty_like(stream)
    for i, w in enumerate(layers):
        qkv = gemm_rows(scaled_in, w["qkv"], norm_eps=EPS, norm_rows=stream)
        gemm_rows(qkv[:, :ao], w["o"], residual=stream, scaled=(scaled_post, w["norm_post"]))
        act = gemm_rows(scaled_post, w["gate_up"], silu_out=True, norm_eps=EPS, norm_rows=stream)
        following = layers[i + 1]["norm_in"] if i + 1 < len(layers) else final
        gemm_rows(act, w["down"], residual=stream, scaled=(scaled_in, following))
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
        times = {}
        for name, chain in (("unfused", unfused), ("fused", fused_chain)):
            scratch = start.clone()  # the chains update it in place: values drift, shapes not
            samples = graphed_samples(lambda f=chain, s=scratch: f(s, layers, ao, final), 200)
            times[name] = 1000 * median(samples) / n
        print(f"{model} {m} rows: unfused {times['unfused']:.2f} us a layer, fused "
              f"{times['fused']:.2f} ({100 * (times['fused'] / times['unfused'] - 1):+.1f}%); "
              f"final rows differ by {err:.2g} of the largest", flush=True)  # fmt: skip


for model in MODELS:
    measure(model)
    torch.cuda.empty_cache()
