"""Prototype (stop 46, issue 18): can a Triton GEMM carry the glue around qwen3-0.6b's prefill
GEMMs? Stop 45's profile of the 8k prefill: cuBLAS 9.8 ms at 731-792 TFLOP/s, and beside it
rope + KV store 1.2 ms, SiLU-and-mul 1.0, RMSNorm 0.9: a tenth of the forward in elementwise
kernels that re-read what a GEMM just wrote. Fusing them into GEMM epilogues needs our own GEMM
(cuBLAS has no SwiGLU epilogue), and it pays only if that GEMM stays near cuBLAS. First probe:
the gate/up product with SiLU-and-mul in its epilogue (two accumulators a program: the gate
columns and the matching up columns of ``w13 [2I, H]``; gate and up rounded to the dtype first,
as the unfused path rounds them), against cuBLAS's gate/up plus our SiLU kernel; the q/k/v
product with ``rope_store_kv``'s work (q/k norm, rope, KV store) in its epilogue, against
cuBLAS plus our rope kernel; and the plain GEMM against cuBLAS at every product of the layer.

    python3 docs/wip/prefill_gemm_proto.py --out OUT.json            # GPU: timings
    PYTHONPATH=/tmp/t36 python3 docs/wip/prefill_gemm_proto.py --sass DIR   # CPU: sm_90 SASS
    TRITON_INTERPRET=1 python3 docs/wip/prefill_gemm_proto.py --check  # CPU: against torch

It then times the whole layer but attention both ways (``unfused_layer``: the engine's nine
kernels, rmsnorm / q/k/v / rope / o / add_rmsnorm / gate/up / SiLU / down / add; ``fused_layer``:
four, with the input norms' weights folded into copies of the q/k/v and gate/up weights and
the rows scaled by 1/rms in the epilogues, the residual adds in the o and down epilogues),
each fused kernel in its best tiles, and prints what 28 layers would save a forward.
``--dry`` runs all of it on the CPU at tiny sizes (interpreter, float32) to catch a broken
script before it costs device time; ``--check`` compares every kernel and the fused layer
with the engine's path. With Triton 3.6 the norm + gate/up + SiLU kernel compiles at 255
registers (no stack) when it sums the squares in its K loop, 168-175 when a pre-pass kernel
(``row_inv_rms``) gives it 1/rms: the layer is timed both ways.

Decision rule, per token count M: the fused gate/up pays iff its time is under cuBLAS's gate/up
plus the SiLU kernel's (predicted at M = 8192: 0.136 + 0.036 ms, so the fused kernel needs
>= ~600 TFLOP/s counting gate/up FLOPs). The plain GEMM's ratio to cuBLAS at the other shapes
says whether the q/k/v epilogue (norm, rope, KV store: 1.2 ms of rope kernels and part of 0.9
of norms) is worth writing next.
"""

from __future__ import annotations

import argparse
import functools
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
# the q/k/v epilogue (BLOCK_N = head_dim, as two products of its rotary halves)
QKV_CONFIGS = [(64, 128, 64, 4, 4), (64, 128, 64, 4, 8), (64, 128, 128, 3, 4), (128, 128, 64, 4, 8)]


@triton.jit
def _gemm(a_desc, w_desc, c_desc, rms_ptr, M, N, K, inter, eps, BLOCK_M: tl.constexpr,
          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
          NUM_PROGRAMS: tl.constexpr, SILU_MUL: tl.constexpr, NORM: tl.constexpr,
          RESIDUAL: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):  # fmt: skip
    """Persistent: program p takes output tiles p, p + NUM_PROGRAMS, ... (grouped along M so
    consecutive tiles share weight columns in the L2). SILU_MUL: the output is [M, inter] =
    silu(A Wg^T) * (A Wu^T) with Wg = w[:inter], Wu = w[inter:]. NORM: A is RMS-normed first,
    the products' rows scaled by 1/rms (the norm's weight folded into w's columns by the
    caller): 1, from sums of squares accumulated over the K loop; 2, read from ``rms_ptr``
    (``row_inv_rms``'s pre-pass). RESIDUAL: C += the product (the residual stream's add, in
    place)."""
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
        if NORM == 1:
            squares = tl.zeros([BLOCK_M], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            a = a_desc.load([m0, k0])
            acc = tl.dot(a, w_desc.load([n0, k0]).T, acc)
            if SILU_MUL:
                up = tl.dot(a, w_desc.load([inter + n0, k0]).T, up)
            if NORM == 1:
                squares += tl.sum(a.to(tl.float32) * a.to(tl.float32), 1)
        if NORM != 0:
            if NORM == 1:
                inv_rms = tl.rsqrt(squares / K + eps)
            else:
                inv_rms = tl.load(rms_ptr + m0 + tl.arange(0, BLOCK_M))
            acc = acc * inv_rms[:, None]
            if SILU_MUL:
                up = up * inv_rms[:, None]
        if RESIDUAL:  # as the unfused path: the product rounded, then added in fp32
            acc = acc.to(c_desc.dtype).to(tl.float32) + c_desc.load([m0, n0]).to(tl.float32)
        if SILU_MUL:  # as the unfused path: gate and up rounded to the dtype, then fp32
            gate = acc.to(c_desc.dtype).to(tl.float32)
            up = up.to(c_desc.dtype).to(tl.float32)
            acc = gate * tl.sigmoid(gate) * up
        c_desc.store([m0, n0], acc.to(c_desc.dtype))


@triton.jit
def _qkv_rope(a_desc, w_desc, c_desc, positions_ptr, cos_sin_ptr, q_norm_ptr, k_norm_ptr,
              slot_ptr, k_cache_ptr, v_cache_ptr, M, K, stride_cos_sin, stride_slot,
              stride_head, eps, NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
              BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_K: tl.constexpr,
              GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr, NORM: tl.constexpr):  # fmt: skip
    """The q/k/v product, one head a tile (BLOCK_N = HEAD_DIM), with ``rope_store_kv``'s work
    in its epilogue: q and k heads RMS-normed (q/k norm) and rotated, written to the output
    as rope_store_kv leaves them; k and v rows also stored in the cache at their slots. NORM:
    the layer's input RMSNorm too, as in ``_gemm``."""
    HALF: tl.constexpr = HEAD_DIM // 2
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = NUM_Q_HEADS + 2 * NUM_KV_HEADS
    per_group = GROUP_M * num_n
    offs_d = tl.arange(0, HALF)
    # not flatten=True: Triton 3.6's loop fusion fails on this epilogue's branches (an scf.if
    # region edge mismatch in tritongpu-fuse-nested-loops)
    for tile in tl.range(tl.program_id(0), num_m * num_n, NUM_PROGRAMS):
        group = tile // per_group
        first_m = group * GROUP_M
        size_m = tl.minimum(num_m - first_m, GROUP_M)
        m0 = (first_m + tile % size_m) * BLOCK_M
        head = (tile % per_group) // size_m
        # the head's two rotary halves as two products: no register shuffle to pair them
        x1 = tl.zeros([BLOCK_M, HALF], tl.float32)
        x2 = tl.zeros([BLOCK_M, HALF], tl.float32)
        if NORM:
            squares = tl.zeros([BLOCK_M], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            a = a_desc.load([m0, k0])
            x1 = tl.dot(a, w_desc.load([head * HEAD_DIM, k0]).T, x1)
            x2 = tl.dot(a, w_desc.load([head * HEAD_DIM + HALF, k0]).T, x2)
            if NORM:
                squares += tl.sum(a.to(tl.float32) * a.to(tl.float32), 1)
        if NORM:
            inv_rms_in = tl.rsqrt(squares / K + eps)
            x1 = x1 * inv_rms_in[:, None]
            x2 = x2 * inv_rms_in[:, None]
        x1 = x1.to(c_desc.dtype).to(tl.float32)  # what the GEMM would have written
        x2 = x2.to(c_desc.dtype).to(tl.float32)
        rows = m0 + tl.arange(0, BLOCK_M)
        if head < NUM_Q_HEADS + NUM_KV_HEADS:  # q or k: norm, then rotate the two halves
            norm_ptr = q_norm_ptr if head < NUM_Q_HEADS else k_norm_ptr
            inv_rms = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / HEAD_DIM + eps)
            x1 = x1 * inv_rms[:, None] * tl.load(norm_ptr + offs_d)[None, :].to(tl.float32)
            x2 = x2 * inv_rms[:, None] * tl.load(norm_ptr + HALF + offs_d)[None, :].to(tl.float32)
            table = (
                cos_sin_ptr + tl.load(positions_ptr + rows).to(tl.int64)[:, None] * stride_cos_sin
            )
            cos = tl.load(table + offs_d[None, :])
            sin = tl.load(table + HALF + offs_d[None, :])
            x1, x2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        y1 = x1.to(c_desc.dtype)
        y2 = x2.to(c_desc.dtype)
        c_desc.store([m0, head * HEAD_DIM], y1)
        c_desc.store([m0, head * HEAD_DIM + HALF], y2)
        if head >= NUM_Q_HEADS:  # k or v: also into the cache (slot -1: a padded row)
            kv_head = (head - NUM_Q_HEADS) % NUM_KV_HEADS
            cache = k_cache_ptr if head < NUM_Q_HEADS + NUM_KV_HEADS else v_cache_ptr
            slot = tl.load(slot_ptr + rows).to(tl.int64)
            ptrs = cache + slot[:, None] * stride_slot + kv_head * stride_head + offs_d[None, :]
            keep = (slot >= 0)[:, None]
            tl.store(ptrs, y1, mask=keep)
            tl.store(ptrs + HALF, y2, mask=keep)


def qkv_rope(a, w, rope, *, config=QKV_CONFIGS[1], programs=None, norm_eps=None):
    """``rope_store_kv``'s inputs after the q/k/v GEMM, in one kernel; ``rope`` is the dict
    ``make_rope`` returns (positions, table, norms, cache, slots, head counts)."""
    m, k = a.shape
    block_m, _, block_k, stages, warps = config
    d = rope["head_dim"]
    c = torch.empty(m, w.shape[0], dtype=a.dtype, device=a.device)
    a_desc = TensorDescriptor.from_tensor(a, [block_m, block_k])
    w_desc = TensorDescriptor.from_tensor(w, [d // 2, block_k])
    c_desc = TensorDescriptor.from_tensor(c, [block_m, d // 2])
    if programs is None:
        programs = torch.cuda.get_device_properties(a.device).multi_processor_count
    cache = rope["k_cache"]
    _qkv_rope[(programs,)](
        a_desc, w_desc, c_desc, rope["positions"], rope["cos_sin"], rope["q_norm"],
        rope["k_norm"], rope["slots"], cache, rope["v_cache"], m, k, rope["cos_sin"].stride(0),
        cache.stride(0), cache.stride(1), norm_eps or 1e-6, rope["heads"], rope["kv_heads"],
        block_m, d, block_k, 8, programs, norm_eps is not None, num_warps=warps,
        num_stages=stages,
    )  # fmt: skip
    return c


def make_rope(m, heads, kv_heads, d, device, generator, dtype=torch.bfloat16):
    """Inputs of ``rope_store_kv`` for m tokens: positions, a cos/sin table, q/k norm weights,
    and a cache whose slots are a permutation (a prefill's pages in no order)."""
    positions = torch.arange(m, device=device)
    inv = 1e6 ** -(torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
    angles = positions[:, None].float() * inv[None, :]
    cos_sin = torch.cat((angles.cos(), angles.sin()), 1).contiguous()
    norm = (1 + 0.1 * torch.randn(2, d, device=device, generator=generator)).to(dtype)
    cache = torch.zeros(2, m, kv_heads, d, dtype=dtype, device=device)
    slots = torch.randperm(m, device=device, generator=generator)
    return dict(positions=positions, cos_sin=cos_sin, q_norm=norm[0], k_norm=norm[1],
                k_cache=cache[0], v_cache=cache[1], slots=slots, heads=heads,
                kv_heads=kv_heads, head_dim=d)  # fmt: skip


def unfused_qkv_rope(a, w, rope, matmul=torch.nn.functional.linear):
    """The engine's path: the GEMM, then ``rope_store_kv`` on views of its output."""
    from nanograph.kernels import fused, reference

    heads, kv_heads, d = rope["heads"], rope["kv_heads"], rope["head_dim"]
    out = matmul(a, w)
    qkv = out.view(a.shape[0], heads + 2 * kv_heads, d)
    q, k, v = qkv[:, :heads], qkv[:, heads : heads + kv_heads], qkv[:, heads + kv_heads :]
    (fused if a.is_cuda else reference).rope_store_kv(
        q, k, v, rope["positions"], rope["cos_sin"], rope["k_cache"], rope["v_cache"],
        rope["slots"], q_norm_weight=rope["q_norm"], k_norm_weight=rope["k_norm"], eps=1e-6,
    )  # fmt: skip
    return out


def gemm(
    a,
    w,
    *,
    silu_mul=False,
    config=CONFIGS[0],
    warp_specialize=False,
    programs=None,
    norm_eps=None,
    inv_rms=None,
    residual=None,
):
    """``a [M, K] @ w [N, K]^T``, or with ``silu_mul`` silu(gate) * up of it ([M, N / 2]);
    ``norm_eps``: of rmsnorm(a) (w's columns already scaled by the norm's weight), or the same
    with the rows' 1/rms given (``inv_rms``, from ``row_inv_rms``); ``residual``: added into
    that tensor, in place, and returned."""
    m, k = a.shape
    n = w.shape[0]
    block_m, block_n, block_k, stages, warps = config
    inter = n // 2
    c = (
        residual
        if residual is not None
        else torch.empty(m, inter if silu_mul else n, dtype=a.dtype, device=a.device)
    )
    a_desc = TensorDescriptor.from_tensor(a, [block_m, block_k])
    w_desc = TensorDescriptor.from_tensor(w, [block_n, block_k])
    c_desc = TensorDescriptor.from_tensor(c, [block_m, block_n])
    if programs is None:
        programs = torch.cuda.get_device_properties(a.device).multi_processor_count
    norm = 2 if inv_rms is not None else int(norm_eps is not None)
    rms = inv_rms if inv_rms is not None else c
    _gemm[(programs,)](a_desc, w_desc, c_desc, rms, m, n, k, inter, norm_eps or 1e-6, block_m,
                       block_n, block_k, 8, programs, silu_mul, norm, residual is not None,
                       warp_specialize, num_warps=warps, num_stages=stages)  # fmt: skip
    return c


def unfused_silu_mul(a, w):
    from nanograph.kernels import fused, reference

    x = torch.nn.functional.linear(a, w)
    return (fused if a.is_cuda else reference).silu_and_mul(x)


def _kernels(device_tensor):
    from nanograph.kernels import fused, reference

    return fused if device_tensor.is_cuda else reference


def make_layer(m, device, generator, dtype=torch.bfloat16):
    """qwen3-0.6b's layer weights (norm weights folded into copies for the fused chain), a
    residual stream of m tokens, the attention output, and the rope inputs."""
    h, inter, heads, kv_heads, d = 1024, 3072, 16, 8, 128

    def weight(n, k):
        return (torch.randn(n, k, device=device, generator=generator) / k**0.5).to(dtype)

    def norm_weight():
        return (1 + 0.1 * torch.randn(h, device=device, generator=generator)).to(dtype)

    w = dict(qkv=weight((heads + 2 * kv_heads) * d, h), o=weight(h, heads * d),
             gate_up=weight(2 * inter, h), down=weight(h, inter), ln1=norm_weight(),
             ln2=norm_weight())  # fmt: skip
    w["qkv_folded"] = (w["qkv"].float() * w["ln1"].float()).to(dtype)
    w["gate_up_folded"] = (w["gate_up"].float() * w["ln2"].float()).to(dtype)
    stream = torch.randn(m, h, device=device, generator=generator).to(dtype)
    attn = torch.randn(m, heads * d, device=device, generator=generator).to(dtype)
    return w, stream, attn, make_rope(m, heads, kv_heads, d, device, generator, dtype)


def unfused_layer(w, stream, attn, rope, eps=1e-6):
    """The engine's prefill layer around attention: rmsnorm, q/k/v, rope kernel, (attention
    given), o, add_rmsnorm, gate/up, SiLU, down, the residual add. Returns (qkv, stream)."""
    k = _kernels(stream)
    stream = stream.clone()
    qkv = unfused_qkv_rope(k.rmsnorm(stream, w["ln1"], eps), w["qkv"], rope)
    o = torch.nn.functional.linear(attn, w["o"])
    normed, stream = k.add_rmsnorm(o, stream, w["ln2"], eps)
    act = k.silu_and_mul(torch.nn.functional.linear(normed, w["gate_up"]))
    stream.add_(torch.nn.functional.linear(act, w["down"]))  # the next layer's add_rmsnorm
    return qkv, stream


@triton.jit
def _row_inv_rms(x_ptr, out_ptr, M, K, eps, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    squares = tl.zeros([BLOCK_M], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(
            x_ptr + rows[:, None].to(tl.int64) * K + cols[None, :],
            mask=(rows < M)[:, None] & (cols < K)[None, :],
            other=0.0,
        ).to(tl.float32)
        squares += tl.sum(x * x, 1)
    tl.store(out_ptr + rows, tl.rsqrt(squares / K + eps), mask=rows < M)


def row_inv_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """1/rms of each row of a contiguous [M, K] ``x``, fp32 [M]: the norm's pre-pass."""
    m, k = x.shape
    out = torch.empty(m, dtype=torch.float32, device=x.device)
    _row_inv_rms[(triton.cdiv(m, 16),)](x, out, m, k, eps, 16, 256, num_warps=4)
    return out


def fused_layer(w, stream, attn, rope, eps=1e-6, configs=None, prepass=False):
    """The same with four kernels: norm + q/k/v + rope/norms/KV store; o + residual; norm +
    gate/up + SiLU; down + residual. ``configs``: tiles per kernel (defaults otherwise);
    ``prepass``: the gate/up kernel's 1/rms from ``row_inv_rms`` (a fifth kernel) instead of
    sums of squares in its K loop."""
    c = configs or {}
    stream = stream.clone()
    qkv = qkv_rope(stream, w["qkv_folded"], rope, norm_eps=eps, **c.get("qkv", {}))
    gemm(attn, w["o"], residual=stream, **c.get("o", {}))
    norm = {"inv_rms": row_inv_rms(stream, eps)} if prepass else {"norm_eps": eps}
    act = gemm(stream, w["gate_up_folded"], silu_mul=True, **norm, **c.get("gate_up", {}))
    gemm(act, w["down"], residual=stream, **c.get("down", {}))
    return qkv, stream


def check() -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(96, 64, generator=g)
    w = torch.randn(256, 64, generator=g) / 8
    for config in ((32, 32, 32, 2, 4), (32, 64, 32, 2, 4)):
        got = gemm(a, w, config=config, programs=3)
        torch.testing.assert_close(got, a @ w.T, atol=1e-4, rtol=1e-4)
        got = gemm(a, w, silu_mul=True, config=config, programs=3)
        torch.testing.assert_close(got, unfused_silu_mul(a, w), atol=1e-4, rtol=1e-4)
    heads, kv_heads, d = 4, 2, 32  # float32: the interpreter's bf16 dots are not exact
    a = torch.randn(64, 64, generator=g)
    w = torch.randn((heads + 2 * kv_heads) * d, 64, generator=g) / 8
    ropes = [make_rope(64, heads, kv_heads, d, "cpu", torch.Generator().manual_seed(1),
                       torch.float32) for _ in range(2)]  # fmt: skip
    want = unfused_qkv_rope(a, w, ropes[0])
    got = qkv_rope(a, w, ropes[1], config=(32, d, 32, 2, 4), programs=3)
    for x, y in ((got, want), (ropes[1]["k_cache"], ropes[0]["k_cache"]),
                 (ropes[1]["v_cache"], ropes[0]["v_cache"])):  # fmt: skip
        torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)
    cpu = dict(config=(32, 32, 32, 2, 4), programs=3)
    w, stream, attn, rope = make_layer(64, "cpu", torch.Generator().manual_seed(2), torch.float32)
    ropes = [dict(rope, k_cache=rope["k_cache"].clone(), v_cache=rope["v_cache"].clone())
             for _ in range(2)]  # fmt: skip
    want = unfused_layer(w, stream, attn, ropes[0])
    configs = {"qkv": dict(config=(32, 128, 32, 2, 4), programs=3), "o": cpu, "gate_up": cpu,
               "down": cpu}  # fmt: skip
    for prepass in (False, True):
        got = fused_layer(w, stream, attn, ropes[1], configs=configs, prepass=prepass)
        for x, y in (*zip(got, want), (ropes[1]["k_cache"], ropes[0]["k_cache"]),
                     (ropes[1]["v_cache"], ropes[0]["v_cache"])):  # fmt: skip
            torch.testing.assert_close(x, y, atol=1e-3, rtol=1e-3)
    print("plain, silu_mul, q/k/v + rope GEMMs and the fused layer match the engine's path "
          "(float32, interpreter)")  # fmt: skip


def _compile_sm90(fn, signature: dict, constexprs: dict, config, path: str) -> None:
    """Compiles ``fn`` for sm_90 (H100/H200) with ``config``'s stages and warps; writes its
    SASS to ``path``.sass and prints its registers, stack and HGMMA count."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")  # fmt: skip
    signature = signature | dict.fromkeys(constexprs, "constexpr")
    names = list(signature)
    source = ASTSource(
        fn=fn, signature=signature, constexprs={(names.index(k),): v for k, v in constexprs.items()}
    )
    compiled = triton.compile(
        source,
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": config[4], "num_stages": config[3]},
    )
    with open(path + ".cubin", "wb") as f:
        f.write(compiled.asm["cubin"])
    usage, text = (
        subprocess.run(
            [tool, flag, path + ".cubin"], capture_output=True, text=True, check=True
        ).stdout
        for flag in ("-res-usage", "-sass")
    )
    with open(path + ".sass", "w") as f:
        f.write(re.sub(r"/\*[0-9a-f]{4}\*/", "", text))
    regs = " ".join(re.findall(r"(REG:\d+|STACK:\d+)", usage))
    print(f"{os.path.basename(path)}: {regs}, {text.count('HGMMA')} HGMMA")


def sass(folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    # the layer's fused kernels: the product + residual (norm 0), norm + gate/up + SiLU with
    # the sums of squares in the K loop (norm 1) or 1/rms from the pre-pass (norm 2)
    for silu_mul, norm in ((False, 0), (True, 1), (True, 2)):
        for config in CONFIGS[:3] if not silu_mul else SILU_CONFIGS[:3]:
            block_m, block_n, block_k = config[:3]
            signature = {
                "a_desc": f"tensordesc<bf16[{block_m},{block_k}]>",
                "w_desc": f"tensordesc<bf16[{block_n},{block_k}]>",
                "c_desc": f"tensordesc<bf16[{block_m},{block_n}]>", "rms_ptr": "*fp32",
                "M": "i32", "N": "i32", "K": "i32", "inter": "i32", "eps": "fp32",
            }  # fmt: skip
            residual = not silu_mul
            constexprs = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k,
                          "GROUP_M": 8, "NUM_PROGRAMS": 132, "SILU_MUL": silu_mul,
                          "NORM": norm, "RESIDUAL": residual,
                          "WARP_SPECIALIZE": False}  # fmt: skip
            kind = f"norm{norm}_silu" if silu_mul else "residual"
            name = f"gemm_{kind}_" + "_".join(map(str, config))
            _compile_sm90(_gemm, signature, constexprs, config, os.path.join(folder, name))
    for config in QKV_CONFIGS:  # the q/k/v product with rope_store_kv's work in its epilogue
        block_m, _, block_k = config[:3]
        signature = {
            "a_desc": f"tensordesc<bf16[{block_m},{block_k}]>",
            "w_desc": f"tensordesc<bf16[64,{block_k}]>",
            "c_desc": f"tensordesc<bf16[{block_m},64]>",
            "positions_ptr": "*i64", "cos_sin_ptr": "*fp32", "q_norm_ptr": "*bf16",
            "k_norm_ptr": "*bf16", "slot_ptr": "*i64", "k_cache_ptr": "*bf16",
            "v_cache_ptr": "*bf16", "M": "i32", "K": "i32", "stride_cos_sin": "i32",
            "stride_slot": "i32", "stride_head": "i32", "eps": "fp32",
        }  # fmt: skip
        constexprs = {"NUM_Q_HEADS": 16, "NUM_KV_HEADS": 8, "BLOCK_M": block_m,
                      "HEAD_DIM": 128, "BLOCK_K": block_k, "GROUP_M": 8,
                      "NUM_PROGRAMS": 132, "NORM": True}  # fmt: skip
        name = "qkv_rope_" + "_".join(map(str, config))
        _compile_sm90(_qkv_rope, signature, constexprs, config, os.path.join(folder, name))


def _time_ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def _best(arms: dict, prefix: str) -> tuple[float, str]:
    return min((v["ms"], k) for k, v in arms.items() if "ms" in v and k.startswith(prefix))


def measure(out: str | None, dry: bool = False) -> None:
    """Every arm, then the layer chains with each fused kernel's best tiles. ``dry``: tiny
    sizes on the CPU under the interpreter, each arm run once, to catch a broken script
    before it costs device time."""
    dev = torch.device("cpu" if dry else "cuda")
    dtype = torch.float32 if dry else torch.bfloat16
    timer = (lambda fn: (fn(), 0.0)[1]) if dry else _time_ms
    extra = dict(programs=3) if dry else {}
    g = torch.Generator(device=dev).manual_seed(0)
    sizes = (64,) if dry else (2048, 8192)
    configs = [(32, 32, 32, 2, 4)] if dry else CONFIGS
    silu_configs = [(32, 32, 32, 2, 4)] if dry else SILU_CONFIGS
    qkv_configs = [(32, 128, 32, 2, 4)] if dry else QKV_CONFIGS
    report = {"device": "cpu (dry run)" if dry else torch.cuda.get_device_name(), "rows": [],
              "layers": []}  # fmt: skip
    for m in sizes:
        a = {k: torch.randn(m, k, device=dev, generator=g).to(dtype) for k in (1024, 2048, 3072)}
        best_tiles = {}
        for name, n, k in PRODUCTS:
            w = (torch.randn(n, k, device=dev, generator=g) / k**0.5).to(dtype)
            x = a[k]
            arms = {"cublas": lambda x=x, w=w: torch.nn.functional.linear(x, w)}
            tiles_of = {}  # label -> the tiles its kernel ran with
            for config in configs:
                for ws in (False, True):
                    tiles_of[f"triton {config} ws={ws}"] = config
                    arms[f"triton {config} ws={ws}"] = (
                        lambda x=x, w=w, c=config, ws=ws: gemm(x, w, config=c, warp_specialize=ws,
                                                               **extra))  # fmt: skip
                # not persistent: a program a tile (the persistent loop then runs once)
                tiles = triton.cdiv(m, config[0]) * triton.cdiv(n, config[1])
                tiles_of[f"triton {config} a program a tile"] = config
                arms[f"triton {config} a program a tile"] = functools.partial(
                    gemm, x, w, config=config, programs=tiles
                )
            if name == "qkv":  # qwen3-0.6b: 16 q / 8 kv heads of 128, q/k norm
                rope = make_rope(m, 16, 8, 128, dev, g, dtype)

                def fresh(rope=rope):  # the same inputs, a cache of its own for each arm
                    return dict(rope, k_cache=rope["k_cache"].clone(),
                                v_cache=rope["v_cache"].clone())  # fmt: skip

                arms["cublas + rope kernel"] = functools.partial(unfused_qkv_rope, x, w, fresh())
                for config in qkv_configs:
                    tiles_of[f"fused rope {config}"] = config
                    arms[f"fused rope {config}"] = functools.partial(
                        qkv_rope, x, w, fresh(), config=config,
                        **extra)  # fmt: skip
            if name == "gate_up":
                arms["cublas + silu kernel"] = functools.partial(unfused_silu_mul, x, w)
                for config in silu_configs:
                    tiles_of[f"fused silu {config}"] = config
                    arms[f"fused silu {config}"] = functools.partial(
                        gemm, x, w, silu_mul=True, config=config, **extra
                    )
            refs = {label: arms[label]().float() for label in arms if not label.startswith(
                ("triton", "fused"))}  # fmt: skip
            row = {"M": m, "product": name, "N": n, "K": k, "arms": {}}
            for label, fn in arms.items():
                ref = refs["cublas + rope kernel" if "rope" in label else
                           "cublas + silu kernel" if "silu" in label else "cublas"]  # fmt: skip
                try:
                    err = (fn().float() - ref).abs().max().item()
                    ms = timer(fn)
                except Exception as exc:  # a configuration out of shared memory, say
                    row["arms"][label] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
                    continue
                row["arms"][label] = {"ms": ms, "tflops": 2 * m * n * k / max(ms, 1e-9) / 1e9,
                                      "err": err}  # fmt: skip
            plain = _best(row["arms"], "triton (")
            best_tiles[name] = {"config": tiles_of[plain[1]]}
            print(f"M={m} {name}: cuBLAS {row['arms']['cublas']['ms']:.4f} ms, best Triton "
                  f"{plain[0]:.4f} ({plain[1]})")  # fmt: skip
            for fused_prefix, unfused in (("fused rope", "cublas + rope kernel"),
                                          ("fused silu", "cublas + silu kernel")):  # fmt: skip
                if unfused in row["arms"]:
                    fused = _best(row["arms"], fused_prefix)
                    best_tiles[name] = {"config": tiles_of[fused[1]]}
                    print(f"  {unfused}: {row['arms'][unfused]['ms']:.4f} ms, fused "
                          f"{fused[0]:.4f} ({fused[1]})")  # fmt: skip
            report["rows"].append(row)
        # the whole layer but attention: the engine's 9 kernels against the fused 4
        w, stream, attn, rope = make_layer(m, dev, g, dtype)
        tiles = {name: dict(best_tiles[name], **extra) for name in best_tiles}
        chains = {
            "unfused": functools.partial(unfused_layer, w, stream, attn, rope),
            "fused": functools.partial(fused_layer, w, stream, attn, rope, configs=tiles),
            "fused, norm pre-pass": functools.partial(
                fused_layer, w, stream, attn, rope, configs=tiles, prepass=True
            ),
        }
        want = chains["unfused"]()
        layer = {"M": m, "tiles": {k: list(v["config"]) for k, v in best_tiles.items()}}
        for label, fn in chains.items():
            got = fn()
            layer[label] = {
                "ms": timer(fn),
                "err": max((x.float() - y.float()).abs().max().item() for x, y in zip(got, want)),
            }
        print(
            f"M={m} layer without attention: unfused {layer['unfused']['ms']:.4f} ms, fused "
            f"{layer['fused']['ms']:.4f} (norm pre-pass: "
            f"{layer['fused, norm pre-pass']['ms']:.4f}); 28 layers save "
            f"{28 * (layer['unfused']['ms'] - layer['fused']['ms']):+.2f} ms a forward "
            f"({28 * (layer['unfused']['ms'] - layer['fused, norm pre-pass']['ms']):+.2f})"
        )
        report["layers"].append(layer)
    if out:
        with open(out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--sass")
    parser.add_argument("--out")
    parser.add_argument("--dry", action="store_true", help="the --out run on CPU, tiny sizes")
    args = parser.parse_args()
    if args.check:
        check()
    if args.sass:
        sass(args.sass)
    if args.out or args.dry:
        measure(args.out, dry=args.dry)
