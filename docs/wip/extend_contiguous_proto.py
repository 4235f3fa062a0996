"""Prototype (stop 38, issue 18): how much of the long-prompt extend attention's gap to cuDNN is
the paged cache? A causal prefill without a cached prefix reads every key from this forward's
own k/v rows, which are contiguous ([N, Hkv, D], as SGLang's extend kernel reads its new
tokens); this kernel does that, with plain pointer loads or with TMA descriptors, in the same
tile layout as ``paged_attention`` (a tile is BLOCK_Q tokens x the padded GQA group of one kv
head; unmasked key blocks, then the diagonal ones masked). Timed side by side with
``paged_attention`` over a paged batch (random page order, page 16) and SDPA's cuDNN backend.

    python3 docs/wip/extend_contiguous_proto.py --out OUT.json       # GPU
    TRITON_INTERPRET=1 python3 docs/wip/extend_contiguous_proto.py --check  # CPU, tiny sizes
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def _keys(
    acc, m_i, l_i, q, tok, lo, hi, k_ptr, v_ptr, k_desc, v_desc, kvh, n_tokens, stride_kt,
    qk_scale, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, USE_DESC: tl.constexpr,
    MASKED: tl.constexpr,
):  # fmt: skip
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for start in range(lo, hi, BLOCK_N):
        kv = start + offs_n
        if USE_DESC:
            k = k_desc.load([start, kvh * HEAD_DIM])
        else:
            kp = k_ptr + kv[:, None].to(tl.int64) * stride_kt + kvh * HEAD_DIM + offs_d[None, :]
            if MASKED:
                k = tl.load(kp, mask=kv[:, None] < n_tokens, other=0.0)
            else:
                k = tl.load(kp)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        if MASKED:
            s = tl.where(kv[None, :] <= tok[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        if USE_DESC:
            v = v_desc.load([start, kvh * HEAD_DIM])
        else:
            vp = v_ptr + kv[:, None].to(tl.int64) * stride_kt + kvh * HEAD_DIM + offs_d[None, :]
            if MASKED:
                v = tl.load(vp, mask=kv[:, None] < n_tokens, other=0.0)
            else:
                v = tl.load(vp)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _extend_contiguous(
    q_ptr, k_ptr, v_ptr, o_ptr, k_desc, v_desc, n_tokens, qk_scale, stride_qt, stride_kt,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, USE_DESC: tl.constexpr,
):  # fmt: skip
    qb = tl.cdiv(n_tokens, BLOCK_Q) - 1 - tl.program_id(0)  # longest tiles first
    kvh = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    tok = qb * BLOCK_Q + offs_m // GROUP_PAD
    head = kvh * GROUP + offs_m % GROUP_PAD
    valid = (tok < n_tokens) & (offs_m % GROUP_PAD < GROUP)
    rows = tok[:, None].to(tl.int64) * stride_qt + head[:, None] * HEAD_DIM + offs_d[None, :]
    q = tl.load(q_ptr + rows, mask=valid[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    q_lo = qb * BLOCK_Q
    q_hi = tl.minimum(q_lo + BLOCK_Q, n_tokens)
    full_end = (q_lo // BLOCK_N) * BLOCK_N
    acc, m_i, l_i = _keys(acc, m_i, l_i, q, tok, 0, full_end, k_ptr, v_ptr, k_desc, v_desc, kvh,
                          n_tokens, stride_kt, qk_scale, BLOCK_N, HEAD_DIM, USE_DESC,
                          False)  # fmt: skip
    acc, m_i, l_i = _keys(acc, m_i, l_i, q, tok, full_end, q_hi, k_ptr, v_ptr, k_desc, v_desc,
                          kvh, n_tokens, stride_kt, qk_scale, BLOCK_N, HEAD_DIM, USE_DESC,
                          True)  # fmt: skip
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(o_ptr + rows, out.to(o_ptr.dtype.element_ty), mask=valid[:, None])


def extend_contiguous(q, k, v, block_q, block_n, num_warps, num_stages, use_desc):
    n, hq, d = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    group_pad = triton.next_power_of_2(group)
    out = torch.empty_like(q)
    k2, v2 = k.view(n, hkv * d), v.view(n, hkv * d)
    k_desc = TensorDescriptor.from_tensor(k2, [block_n, d])
    v_desc = TensorDescriptor.from_tensor(v2, [block_n, d])
    grid = (triton.cdiv(n, block_q), hkv)
    kernel = _extend_contiguous[grid](
        q, k2, v2, out, k_desc, v_desc, n, d**-0.5 * math.log2(math.e), q.stride(0), k.stride(0),
        group, group_pad, block_q, block_q * group_pad, block_n, d, use_desc,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    extend_contiguous.resources = (
        getattr(kernel, "n_regs", None),
        getattr(kernel, "n_spills", None),
    )
    return out


def _reference(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    group = q.shape[1] // k.shape[1]
    qh, kh, vh = (x.transpose(0, 1).float() for x in (q, k, v))
    kh, vh = kh.repeat_interleave(group, 0), vh.repeat_interleave(group, 0)
    # not the math backend on a GPU: at 32k its score matrix does not fit (stop 38, call 2)
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
    return out.transpose(0, 1)


def _time_ms(fn, rep_ms):
    return triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")


LAYOUTS = {"qwen3-0.6b": (16, 8, 128), "qwen3-8b": (32, 8, 128)}
# (block_q, block_n, num_warps, num_stages): the paged kernel's long tiles first
CONFIGS = {
    "qwen3-0.6b": [(64, 128, 8, 3), (64, 128, 8, 2), (128, 128, 8, 2), (64, 64, 4, 3)],
    "qwen3-8b": [(64, 128, 8, 2), (32, 128, 8, 3), (32, 64, 4, 3)],
}


def _measure(dev, length, name, hq, hkv, d, rep_ms) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from nanograph.kernels.attention import paged_attention
    from nanograph.kernels.attention_tiles import choose_tiles
    from nanograph.kernels.testing import make_paged_batch

    batch = make_paged_batch([0], [length], num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                             page_size=16, dtype=torch.bfloat16, device=dev)  # fmt: skip
    g = torch.Generator(device=dev).manual_seed(length)
    k = torch.randn(length, hkv, d, device=dev, generator=g).bfloat16()
    v = torch.randn(length, hkv, d, device=dev, generator=g).bfloat16()
    batch.k_cache[batch.slot_mapping] = k
    batch.v_cache[batch.slot_mapping] = v
    q = batch.q
    flops = 4 * length * length / 2 * d * hq
    want = _reference(q, k, v)
    row = {"length": length, "layout": name, "arms": {}}

    def paged():
        return paged_attention(q, batch.k_cache, batch.v_cache, *batch.metadata(),
                               batch.page_size, d**-0.5)  # fmt: skip

    err = (paged().float() - want).abs().max().item()
    ms = _time_ms(paged, rep_ms)
    tiles = choose_tiles(dev, length, 1, hq, hkv, d, None)
    row["arms"]["paged"] = {"ms": ms, "tflops": flops / ms / 1e9, "err": err, "tiles": str(tiles)}
    qh, kh, vh = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(
                qh, kh, vh, is_causal=True, enable_gqa=True
            )

    try:
        ms = _time_ms(cudnn, rep_ms)
        row["arms"]["cudnn"] = {"ms": ms, "tflops": flops / ms / 1e9}
    except RuntimeError as exc:
        row["arms"]["cudnn"] = {"error": str(exc)[:200]}
    for cfg in CONFIGS[name] if length <= 8192 else CONFIGS[name][:1]:
        for use_desc in (False, True):
            label = f"contig{'_tma' if use_desc else ''} q{cfg[0]} n{cfg[1]} w{cfg[2]} s{cfg[3]}"

            def run(cfg=cfg, use_desc=use_desc):
                return extend_contiguous(q, k, v, *cfg, use_desc)

            try:
                t0 = time.time()
                err = (run().float() - want).abs().max().item()
                compile_s = time.time() - t0
                regs, spills = extend_contiguous.resources
                ms = _time_ms(run, rep_ms)
                row["arms"][label] = {"ms": ms, "tflops": flops / ms / 1e9, "err": err,
                                      "compile_s": compile_s, "regs": regs,
                                      "spills": spills}  # fmt: skip
            except Exception as exc:  # a config out of shared memory, say
                row["arms"][label] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    for label, arm in row["arms"].items():
        shown = {key: (round(val, 4) if isinstance(val, float) else val)
                 for key, val in arm.items() if key != "tiles"}  # fmt: skip
        print(f"{length} {name} {label}: {shown}", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--check", action="store_true", help="tiny sizes, float16 (interpreter)")
    ap.add_argument("--lengths", default="8192,32768")
    ap.add_argument("--rep-ms", type=int, default=100)
    args = ap.parse_args()
    if args.check:
        for use_desc in (False, True):
            for n, (hq, hkv, d), cfg in [(37, (4, 2, 16), (16, 16, 4, 1)),
                                         (64, (6, 2, 32), (8, 32, 4, 1))]:  # fmt: skip
                g = torch.Generator().manual_seed(n)
                q, k, v = (torch.randn(n, h, d, generator=g).half() for h in (hq, hkv, hkv))
                got = extend_contiguous(q, k, v, *cfg, use_desc)
                err = (got.float() - _reference(q, k, v)).abs().max().item()
                print(f"check n={n} heads={hq}/{hkv} d={d} desc={use_desc}: max err {err:.2e}")
                assert err < 2e-2
        return

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device=dev))  # fmt: skip
    results = []
    for length in (int(x) for x in args.lengths.split(",")):
        for name, heads in LAYOUTS.items():
            results.append(_measure(dev, length, name, *heads, args.rep_ms))
            torch.cuda.empty_cache()
    if args.out:
        env = {"device": torch.cuda.get_device_name(), "triton": triton.__version__,
               "torch": torch.__version__,
               "commit": os.environ.get("NANOGRAPH_COMMIT")}  # fmt: skip
        with open(args.out, "w") as f:
            json.dump({"env": env, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
