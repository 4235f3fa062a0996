"""One layer's torch_native experts at prefill sizes: the per-expert MLP loop before stop 50
(five to eleven launches an expert), stop 50's two-launch loop (each expert's views indexed
one by one) and models.moe.native_moe (stop 52: the views from one split / unbind; stop 64:
the work around the loop outside the split op, one call here), on
random routing at qwen3-30b-a3b's and gpt-oss-20b's shapes. Wall time of a call with the
device synced after it (host-bound), median of 20 after 3 warm-ups; and whether they agree.
    PYTHONPATH=$PWD python3 docs/wip/native_moe_time.py"""

import itertools
import statistics
import time

import torch

from nanograph.kernels import reference
from nanograph.layers import ops
from nanograph.models.moe import _ACTIVATIONS, native_moe


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


def stop50(x, w13, w2, b13, b2, weights, ids, activation, alpha, limit, out):
    num_experts, top_k = w13.shape[0], ids.shape[1]
    flat = ids.reshape(-1)
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    order = torch.argsort(flat, stable=True)
    rows = x[order // top_k]
    scales = weights.reshape(-1)[order].to(x.dtype)[:, None]
    starts = itertools.accumulate(counts, initial=0)
    spans = [(e, start, c) for e, (start, c) in enumerate(zip(starts, counts)) if c]

    def products(x, w, b):
        out = x.new_empty(x.shape[0], w.shape[1])
        for expert, start, count in spans:
            r = slice(start, start + count)
            if b is None:
                torch.mm(x[r], w[expert].t(), out=out[r])
            else:
                torch.addmm(b[expert], x[r], w[expert].t(), out=out[r])
        return out

    gate_up = products(rows, w13, b13)
    act = reference.moe_activation(gate_up, _ACTIVATIONS[activation], alpha, limit)
    down = products(act, w2, b2)
    by_pair = torch.empty_like(down).index_copy_(0, order, down * scales)
    out.add_(by_pair.view(-1, top_k, by_pair.shape[1]).sum(dim=1, dtype=torch.float32))


def now(*args):
    *inputs, out = args
    out.add_(native_moe(*inputs))


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
        fns = (before, stop50, now)
        outs = [torch.zeros(tokens, h, device=dev, dtype=dt) for _ in fns]
        ms = [timed(fn, args, o) for fn, o in zip(fns, outs)]
        diff = (outs[0].float() - outs[2].float()).abs().max().item()
        print(
            f"{name} {tokens} tokens: before {ms[0]:.3f} ms, stop 50 {ms[1]:.3f}, now "
            f"{ms[2]:.3f} ms a layer ({ms[1] / ms[2]:.2f}x stop 50); max |diff| before/now "
            f"{diff:.3g}, stop 50 == now {torch.equal(outs[1], outs[2])}"
        )
