"""Prototype (stop 46, issue 18): can a Triton GEMM carry the glue around qwen3-0.6b's prefill
GEMMs? Stop 45's profile of the 8k prefill: cuBLAS 9.8 ms at 731-792 TFLOP/s, and beside it
rope + KV store 1.2 ms, SiLU-and-mul 1.0, RMSNorm 0.9: a tenth of the forward in elementwise
kernels that re-read what a GEMM just wrote. Fusing them into GEMM epilogues needs our own GEMM
(cuBLAS has no SwiGLU epilogue), and it pays only if that GEMM stays near cuBLAS. First probe:
the gate/up product with SiLU-and-mul in its epilogue (two accumulators a program: the gate
columns and the matching up columns of ``w13 [2I, H]``; gate and up rounded to the dtype first,
as the unfused path rounds them), against cuBLAS's gate/up plus our SiLU kernel; and the plain
GEMM against cuBLAS at every product of the layer.

    python3 docs/wip/prefill_gemm_proto.py --out OUT.json            # GPU: timings
    PYTHONPATH=/tmp/t36 python3 docs/wip/prefill_gemm_proto.py --sass DIR   # CPU: sm_90 SASS
    TRITON_INTERPRET=1 python3 docs/wip/prefill_gemm_proto.py --check  # CPU: against torch

Decision rule, per token count M: the fused gate/up pays iff its time is under cuBLAS's gate/up
plus the SiLU kernel's (predicted at M = 8192: 0.136 + 0.036 ms, so the fused kernel needs
>= ~600 TFLOP/s counting gate/up FLOPs). The plain GEMM's ratio to cuBLAS at the other shapes
says whether the q/k/v epilogue (norm, rope, KV store: 1.2 ms of rope kernels and part of 0.9
of norms) is worth writing next.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

# qwen3-0.6b: hidden 1024, 16 q / 8 kv heads of 128, FFN 3072. (name, N, K) of C = A W^T
PRODUCTS = [("qkv", 4096, 1024), ("o", 1024, 2048), ("gate_up", 6144, 1024), ("down", 1024, 3072)]
# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps)
CONFIGS = [(128, 128, 64, 4, 8), (128, 256, 64, 3, 8), (128, 128, 128, 3, 8), (128, 64, 64, 4, 4),
           (64, 128, 64, 4, 4)]  # fmt: skip
# two accumulators: 128 x 256 tiles spill (Triton 3.6, sm_90: 255 registers, 1,032-byte stack)
SILU_CONFIGS = [c for c in CONFIGS if c[1] <= 128]


@triton.jit
def _gemm(a_desc, w_desc, c_desc, M, N, K, inter, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
          BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
          SILU_MUL: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):  # fmt: skip
    """Persistent: program p takes output tiles p, p + NUM_PROGRAMS, ... (grouped along M so
    consecutive tiles share weight columns in the L2). SILU_MUL: the output is [M, inter] =
    silu(A Wg^T) * (A Wu^T) with Wg = w[:inter], Wu = w[inter:]."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(inter if SILU_MUL else N, BLOCK_N)
    tiles = num_m * num_n
    per_group = GROUP_M * num_n
    for tile in tl.range(tl.program_id(0), tiles, NUM_PROGRAMS, flatten=True,
                         warp_specialize=WARP_SPECIALIZE):  # fmt: skip
        group = tile // per_group
        first_m = group * GROUP_M
        size_m = tl.minimum(num_m - first_m, GROUP_M)
        m0 = (first_m + tile % size_m) * BLOCK_M
        n0 = (tile % per_group) // size_m * BLOCK_N
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        if SILU_MUL:
            up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            a = a_desc.load([m0, k0])
            acc = tl.dot(a, w_desc.load([n0, k0]).T, acc)
            if SILU_MUL:
                up = tl.dot(a, w_desc.load([inter + n0, k0]).T, up)
        if SILU_MUL:  # as the unfused path: gate and up rounded to the dtype, then fp32
            gate = acc.to(c_desc.dtype).to(tl.float32)
            up = up.to(c_desc.dtype).to(tl.float32)
            acc = gate * tl.sigmoid(gate) * up
        c_desc.store([m0, n0], acc.to(c_desc.dtype))


def gemm(a, w, *, silu_mul=False, config=CONFIGS[0], warp_specialize=False, programs=None):
    """``a [M, K] @ w [N, K]^T``, or with ``silu_mul`` silu(gate) * up of it ([M, N / 2])."""
    m, k = a.shape
    n = w.shape[0]
    block_m, block_n, block_k, stages, warps = config
    inter = n // 2
    c = torch.empty(m, inter if silu_mul else n, dtype=a.dtype, device=a.device)
    a_desc = TensorDescriptor.from_tensor(a, [block_m, block_k])
    w_desc = TensorDescriptor.from_tensor(w, [block_n, block_k])
    c_desc = TensorDescriptor.from_tensor(c, [block_m, block_n])
    if programs is None:
        programs = torch.cuda.get_device_properties(a.device).multi_processor_count
    _gemm[(programs,)](a_desc, w_desc, c_desc, m, n, k, inter, block_m, block_n, block_k, 8,
                       programs, silu_mul, warp_specialize, num_warps=warps,
                       num_stages=stages)  # fmt: skip
    return c


def unfused_silu_mul(a, w):
    from nanograph.kernels import fused, reference

    x = torch.nn.functional.linear(a, w)
    return (fused if a.is_cuda else reference).silu_and_mul(x)


def check() -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(96, 64, generator=g)
    w = torch.randn(256, 64, generator=g) / 8
    for config in ((32, 32, 32, 2, 4), (32, 64, 32, 2, 4)):
        got = gemm(a, w, config=config, programs=3)
        torch.testing.assert_close(got, a @ w.T, atol=1e-4, rtol=1e-4)
        got = gemm(a, w, silu_mul=True, config=config, programs=3)
        torch.testing.assert_close(got, unfused_silu_mul(a, w), atol=1e-4, rtol=1e-4)
    print("plain and silu_mul GEMMs match torch (float32, interpreter)")


def sass(folder: str) -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    os.makedirs(folder, exist_ok=True)
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")  # fmt: skip
    for silu_mul in (False, True):
        for config in CONFIGS[:3] if not silu_mul else SILU_CONFIGS[:3]:
            block_m, block_n, block_k, stages, warps = config
            signature = {
                "a_desc": f"tensordesc<bf16[{block_m},{block_k}]>",
                "w_desc": f"tensordesc<bf16[{block_n},{block_k}]>",
                "c_desc": f"tensordesc<bf16[{block_m},{block_n}]>",
                "M": "i32", "N": "i32", "K": "i32", "inter": "i32",
            }  # fmt: skip
            constexprs = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k,
                          "GROUP_M": 8, "NUM_PROGRAMS": 132, "SILU_MUL": silu_mul,
                          "WARP_SPECIALIZE": False}  # fmt: skip
            signature |= dict.fromkeys(constexprs, "constexpr")
            names = list(signature)
            source = ASTSource(
                fn=_gemm,
                signature=signature,
                constexprs={(names.index(k),): v for k, v in constexprs.items()},
            )
            compiled = triton.compile(
                source,
                target=GPUTarget("cuda", 90, 32),
                options={"num_warps": warps, "num_stages": stages},
            )
            path = os.path.join(folder, f"gemm_{'silu' if silu_mul else 'plain'}_"
                                        + "_".join(map(str, config)))  # fmt: skip
            with open(path + ".cubin", "wb") as f:
                f.write(compiled.asm["cubin"])
            usage = subprocess.run([tool, "-res-usage", path + ".cubin"], capture_output=True,
                                   text=True, check=True).stdout  # fmt: skip
            text = subprocess.run([tool, "-sass", path + ".cubin"], capture_output=True,
                                  text=True, check=True).stdout  # fmt: skip
            with open(path + ".sass", "w") as f:
                f.write(re.sub(r"/\*[0-9a-f]{4}\*/", "", text))
            regs = " ".join(re.findall(r"(REG:\d+|STACK:\d+)", usage))
            print(f"{os.path.basename(path)}: {regs}, {text.count('HGMMA')} HGMMA")


def measure(out: str) -> None:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for m in (2048, 8192):
        a = {k: torch.randn(m, k, device=dev, generator=g).bfloat16() for k in (1024, 2048, 3072)}
        for name, n, k in PRODUCTS:
            w = (torch.randn(n, k, device=dev, generator=g) / k**0.5).bfloat16()
            flops = 2 * m * n * k
            row = {"M": m, "product": name, "N": n, "K": k, "arms": {}}
            want = torch.nn.functional.linear(a[k], w)
            arms = {"cublas": lambda a=a[k], w=w: torch.nn.functional.linear(a, w)}
            for config in CONFIGS:
                for ws in (False, True):
                    arms[f"triton {config} ws={ws}"] = lambda a=a[k], w=w, c=config, ws=ws: gemm(
                        a, w, config=c, warp_specialize=ws
                    )
            if name == "gate_up":
                want_silu = unfused_silu_mul(a[k], w)
                arms["cublas + silu kernel"] = lambda a=a[k], w=w: unfused_silu_mul(a, w)
                for config in CONFIGS:
                    arms[f"triton silu {config}"] = lambda a=a[k], w=w, c=config: gemm(
                        a, w, silu_mul=True, config=c
                    )
            for label, fn in arms.items():
                try:
                    got = fn().float()
                    ref = want_silu if "silu" in label else want
                    err = (got - ref.float()).abs().max().item()
                    ms = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
                except Exception as exc:  # a configuration out of shared memory, say
                    row["arms"][label] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
                    continue
                row["arms"][label] = {"ms": ms, "tflops": flops / ms / 1e9, "err": err}
            best = min((v["ms"], k) for k, v in row["arms"].items()
                       if "ms" in v and "silu" not in k and k != "cublas")  # fmt: skip
            print(f"M={m} {name}: cuBLAS {row['arms']['cublas']['ms']:.4f} ms, best Triton "
                  f"{best[0]:.4f} ({best[1]})")  # fmt: skip
            if name == "gate_up":
                fused = min((v["ms"], k) for k, v in row["arms"].items()
                            if "ms" in v and k.startswith("triton silu"))  # fmt: skip
                print(f"  gate/up + SiLU: cuBLAS + kernel "
                      f"{row['arms']['cublas + silu kernel']['ms']:.4f} ms, fused {fused[0]:.4f}"
                      f" ({fused[1]})")  # fmt: skip
            rows.append(row)
    with open(out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--sass")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.check:
        check()
    if args.sass:
        sass(args.sass)
    if args.out:
        measure(args.out)
