"""Stop 50: one layer's torch_native experts at prefill sizes, the per-expert MLP loop before
this stop (five to eleven launches an expert) against models.moe.native_experts (two), on
random routing at qwen3-30b-a3b's and gpt-oss-20b's shapes. Wall time of a call with the
device synced after it (host-bound), median of 20 after 3 warm-ups; and whether both agree.
    PYTHONPATH=$PWD python3 docs/wip/native_moe_time.py"""

import statistics
import time

import torch

from nanograph.kernels import reference
from nanograph.layers import ops
from nanograph.models.moe import _ACTIVATIONS, native_experts


def before(x, w13, w2, b13, b2, weights, ids, activation, alpha, limit, out):
    num_experts, top_k = w13.shape[0], ids.shape[1]
    flat = ids.reshape(-1)
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    order = torch.argsort(flat, stable=True)
    rows = x[order // top_k]
    scales = weights.reshape(-1)[order].to(x.dtype)[:, None]
    down = torch.empty_like(rows)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        end = start + count
        gate_up = ops.linear(rows[start:end], w13[expert], None if b13 is None else b13[expert])
        act = reference.moe_activation(gate_up, _ACTIVATIONS[activation], alpha, limit)
        down[start:end] = ops.linear(act, w2[expert], None if b2 is None else b2[expert])
        start = end
    by_pair = torch.empty_like(down).index_copy_(0, order, down * scales)
    out.add_(by_pair.view(-1, top_k, by_pair.shape[1]).sum(dim=1, dtype=torch.float32))


def timed(fn, args, out):
    times = []
    for i in range(23):
        out.zero_()
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn(*args, out)
        torch.cuda.synchronize()
        if i >= 3:
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


SHAPES = {  # experts, top-k, hidden, expert FFN, biases, activation
    "qwen3-30b-a3b": (128, 8, 2048, 768, False, 0),
    "gpt-oss-20b": (32, 4, 2880, 2880, True, 1),
}
torch.manual_seed(0)
for name, (e, k, h, inter, bias, act) in SHAPES.items():
    dev, dt = "cuda", torch.bfloat16
    w13 = torch.randn(e, 2 * inter, h, device=dev, dtype=dt) * h**-0.5
    w2 = torch.randn(e, h, inter, device=dev, dtype=dt) * inter**-0.5
    b13 = torch.randn(e, 2 * inter, device=dev, dtype=dt) * 0.1 if bias else None
    b2 = torch.randn(e, h, device=dev, dtype=dt) * 0.1 if bias else None
    for tokens in (16, 256, 2048):
        x = torch.randn(tokens, h, device=dev, dtype=dt)
        ids = torch.stack([torch.randperm(e, device=dev)[:k] for _ in range(tokens)])
        weights = torch.softmax(torch.randn(tokens, k, device=dev), -1).to(dt)
        args = (x, w13, w2, b13, b2, weights, ids, act, 1.702, 7.0)
        outs = [torch.zeros(tokens, h, device=dev, dtype=dt) for _ in range(2)]
        ms = [timed(fn, args, o) for fn, o in ((before, outs[0]), (native_experts, outs[1]))]
        diff = (outs[0].float() - outs[1].float()).abs().max().item()
        print(
            f"{name} {tokens} tokens: before {ms[0]:.3f} ms, now {ms[1]:.3f} ms a layer "
            f"({ms[0] / ms[1]:.2f}x); max |diff| {diff:.3g}, equal {torch.equal(*outs)}"
        )
