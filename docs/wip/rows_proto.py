"""Prototype (stop 39): few-row products (a speculative verify's k + 1 = 5 rows) that stream
the weight once, against cuBLAS and the one-row GEMV, at qwen3-8b's shapes on the H200.

Three kernel shapes, each swept over tiles:
- ``ew``: elementwise, a [M_PAD, BLOCK_N, BLOCK_K] fp32 accumulator (the one-row GEMV's
  arithmetic with the few rows in registers), reduced over K once at the end;
- ``wa``: ``tl.dot(w [BLOCK_N, BLOCK_K], x^T [BLOCK_K, 16])``: the weight as the MMA's A
  operand (swap-AB, as small-M GEMMs do), rows past M masked;
- ``xa``: ``tl.dot(x [16, BLOCK_K], w^T)``: the reverted gemm_rows (263082c) layout.
``silu_down`` takes x [M, 2K] and multiplies silu(gate) * up on load in every Triton arm;
cuBLAS's arm runs the activation kernel first (the engine's pair).

Run on the device: python3 docs/wip/rows_proto.py --rows 5 --out OUT.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from nanograph.bench.common import L2_FLUSH_BYTES, graphed_samples, median


@triton.jit
def _x_tile(x_ptrs, k, K, row_mask, SILU_MUL: tl.constexpr):
    """x[:, k] in x's dtype; with SILU_MUL silu(gate) * up rounded to x's dtype."""
    x = tl.load(x_ptrs + k, mask=row_mask & (k < K), other=0.0)
    if SILU_MUL:
        gate = x.to(tl.float32)
        up = tl.load(x_ptrs + K + k, mask=row_mask & (k < K), other=0.0).to(tl.float32)
        x = (gate * tl.sigmoid(gate) * up).to(x_ptrs.dtype.element_ty)
    return x


@triton.jit
def _rows_ew(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
             M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             SILU_MUL: tl.constexpr):  # fmt: skip
    offs_m = tl.arange(0, M_PAD)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + offs_n.to(tl.int64)[None, :, None] * stride_wn + offs_k[None, None, :]
    x_ptrs = x_ptr + offs_m[:, None, None] * stride_xm
    n_mask = (offs_n < N)[None, :, None]
    m_mask = (offs_m < M)[:, None, None]
    acc = tl.zeros([M_PAD, BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w = tl.load(w_ptrs + k0, mask=n_mask & (k0 + offs_k < K)[None, None, :], other=0.0,
                    eviction_policy="evict_first")  # fmt: skip
        x = _x_tile(x_ptrs, k0 + offs_k[None, None, :], K, m_mask, SILU_MUL)
        acc += w.to(tl.float32) * x.to(tl.float32)
    y = tl.sum(acc, 2)
    out = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(
        out, y.to(out_ptr.dtype.element_ty), mask=(offs_m < M)[:, None] & (offs_n < N)[None, :]
    )


@triton.jit
def _rows_wa(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SILU_MUL: tl.constexpr):  # fmt: skip
    M_PAD: tl.constexpr = 16
    offs_m = tl.arange(0, M_PAD)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm
    n_mask = (offs_n < N)[:, None]
    m_mask = (offs_m < M)[:, None]
    acc = tl.zeros([BLOCK_N, M_PAD], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w = tl.load(w_ptrs + k0, mask=n_mask & (k0 + offs_k < K)[None, :], other=0.0,
                    eviction_policy="evict_first")  # fmt: skip
        x = _x_tile(x_ptrs, k0 + offs_k[None, :], K, m_mask, SILU_MUL)
        acc = tl.dot(w, tl.trans(x), acc)
    out = out_ptr + offs_m[None, :] * stride_om + offs_n[:, None]
    tl.store(
        out, acc.to(out_ptr.dtype.element_ty), mask=(offs_m < M)[None, :] & (offs_n < N)[:, None]
    )


@triton.jit
def _rows_xa(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SILU_MUL: tl.constexpr):  # fmt: skip
    M_PAD: tl.constexpr = 16
    offs_m = tl.arange(0, M_PAD)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm
    n_mask = (offs_n < N)[:, None]
    m_mask = (offs_m < M)[:, None]
    acc = tl.zeros([M_PAD, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w = tl.load(w_ptrs + k0, mask=n_mask & (k0 + offs_k < K)[None, :], other=0.0,
                    eviction_policy="evict_first")  # fmt: skip
        x = _x_tile(x_ptrs, k0 + offs_k[None, :], K, m_mask, SILU_MUL)
        acc = tl.dot(x, tl.trans(w), acc)
    out = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(
        out, acc.to(out_ptr.dtype.element_ty), mask=(offs_m < M)[:, None] & (offs_n < N)[None, :]
    )


def launch(kind: str, x, w, out, tiles: dict, silu_mul: bool) -> None:
    m, (n, k) = x.shape[0], w.shape
    bn, bk, warps, stages = tiles["bn"], tiles["bk"], tiles["warps"], tiles["stages"]
    args = (x, w, out, m, n, k, x.stride(0), w.stride(0), out.stride(0))
    grid = (triton.cdiv(n, bn),)
    opts = dict(num_warps=warps, num_stages=stages)
    if kind == "ew":
        m_pad = max(triton.next_power_of_2(m), 1)
        _rows_ew[grid](*args, M_PAD=m_pad, BLOCK_N=bn, BLOCK_K=bk, SILU_MUL=silu_mul, **opts)
    elif kind == "wa":
        _rows_wa[grid](*args, BLOCK_N=bn, BLOCK_K=bk, SILU_MUL=silu_mul, **opts)
    else:
        _rows_xa[grid](*args, BLOCK_N=bn, BLOCK_K=bk, SILU_MUL=silu_mul, **opts)


SWEEP = {
    "ew": [
        dict(bn=bn, bk=bk, warps=w, stages=3)
        for bn, bk, w in itertools.product((4, 8, 16), (256, 512), (4, 8))
    ],
    "wa": [
        dict(bn=bn, bk=bk, warps=4, stages=s)
        for bn, bk, s in itertools.product((16, 32, 64), (64, 128, 256), (3, 5))
    ],
    "xa": [
        dict(bn=bn, bk=bk, warps=4, stages=4) for bn, bk in itertools.product((16, 32), (128, 256))
    ],
}
PRODUCTS = {  # qwen3-8b: name -> (N, K, per step)
    "qkv": (6144, 4096, 36),
    "o": (4096, 4096, 36),
    "gate_up": (24576, 4096, 36),
    "silu_down": (4096, 12288, 36),
}


def timed_us(product, weights, x, rep_ms) -> float:
    def run() -> None:
        for w in weights:
            product(x, w)

    return 1000 * median(graphed_samples(run, rep_ms)) / len(weights)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="5")
    p.add_argument("--kinds", default="ew,wa,xa")
    p.add_argument("--products", default=",".join(PRODUCTS))
    p.add_argument("--rep-ms", type=int, default=20)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    from nanograph.kernels import fused
    from nanograph.kernels.gemv import gemv

    report: dict = {"device": torch.cuda.get_device_name(), "results": {}}
    t0 = time.time()
    for rows in (int(r) for r in args.rows.split(",")):
        for name in args.products.split(","):
            n, k, times = PRODUCTS[name]
            silu = name == "silu_down"
            copies = max(2, min(64, -(-L2_FLUSH_BYTES // (n * k * 2))))
            weights = [
                torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)
            ]
            x = torch.randn(rows, 2 * k if silu else k, device="cuda", dtype=torch.bfloat16)
            x1 = x[:1].contiguous()

            def cublas(a, w, silu=silu):
                return F.linear(fused.silu_and_mul(a) if silu else a, w)

            ref = cublas(x, weights[0]).float()
            entry = report["results"].setdefault(str(rows), {}).setdefault(name, {})
            entry["cublas_us"] = timed_us(cublas, weights, x, args.rep_ms)
            entry["gemv1_us"] = timed_us(
                lambda a, w, s=silu: gemv(a, w, silu_mul=s), weights, x1, args.rep_ms
            )
            print(f"{rows} rows {name} {n}x{k}: cuBLAS {entry['cublas_us']:.2f} us, one-row GEMV "
                  f"{entry['gemv1_us']:.2f}", flush=True)  # fmt: skip
            out = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
            for kind in args.kinds.split(","):
                trials = []
                for tiles in SWEEP[kind]:
                    try:
                        launch(kind, x, weights[0], out, tiles, silu)
                        err = (out.float() - ref).abs().max().item()
                        us = timed_us(
                            lambda a, w, t=tiles, kd=kind, o=out, s=silu: launch(kd, a, w, o, t, s),
                            weights, x, args.rep_ms // 2,
                        )  # fmt: skip
                        trials.append({**tiles, "us": us, "err": err})
                    except Exception as e:  # noqa: BLE001 - out of resources
                        trials.append({**tiles, "error": str(e)[:200]})
                ok = sorted((t for t in trials if "us" in t), key=lambda t: t["us"])
                entry[kind] = ok[:8] + [t for t in trials if "us" not in t][:3]
                if ok:
                    b = ok[0]
                    gbps = n * k * 2 / b["us"] / 1e3
                    print(
                        f"  {kind}: best {b['us']:.2f} us ({gbps:.0f} GB/s) bn={b['bn']} "
                        f"bk={b['bk']} warps={b['warps']} stages={b['stages']} "
                        f"err={b['err']:.3g}  [{time.time() - t0:.0f} s]", flush=True,
                    )  # fmt: skip
            del weights
            torch.cuda.empty_cache()
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
