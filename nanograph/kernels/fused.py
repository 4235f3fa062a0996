"""Fused Triton kernels for the non-GEMM work of a layer: norms, SiLU-and-mul, rope + KV store.

Invariants:
- Graph-safe: grids depend on static shapes only; nothing is read back to the host.
- Math runs in fp32 with one rounding to the output dtype at the end. ``add_rmsnorm`` rounds
  the sum to the residual's dtype before normalizing it, as an unfused model would see it.
- ``rope_store_kv``: q ``[N, Hq, D]``, k/v ``[N, Hkv, D]``; ``cos_sin_cache`` is fp32
  ``[max_positions, D]`` with cos in the first half of the last dim and sin in the second;
  rotation pairs are (i, i + D/2) (NeoX / Hugging Face ``rotate_half``), full rotary dim.
  q and k are updated in place (optional per-head RMSNorm first, as Qwen3's q/k-norm), then
  k and v are written to ``k_cache``/``v_cache [num_slots, Hkv, D]`` at ``slot_mapping``;
  slot -1 marks a padded token and is not written. Rows at or past ``num_tokens`` (a device
  int32 ``[1]``, optional) are skipped entirely, so their positions may hold anything; given
  ``zero_padding`` (the attention output that follows, ``[N, Hq, D]``), those rows of it are
  zeroed instead: attention writes every row below ``num_tokens``, so the caller needs no
  zero-fill kernel of its own. A one-row launch on sm_90+ is a programmatic dependent launch
  that waits (``gdc_wait``) before anything else.
- The torch references with the same signatures live in ``nanograph.kernels.reference``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nanograph.kernels import pdl
from nanograph.kernels.launch import LaunchCache


def _warps_for(block: int) -> int:
    return 4 if block <= 1024 else 8 if block <= 4096 else 16


def _rows(x: torch.Tensor) -> torch.Tensor:
    """[..., H] -> [rows, H] as a view (in-place outputs must alias the caller's tensor)."""
    if x.stride(-1) != 1:
        raise ValueError("the last dim must be contiguous")
    return x.view(-1, x.shape[-1])


@triton.jit
def _rmsnorm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    stride_x,
    stride_r,
    stride_o,
    hidden,
    eps,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        # a kernel launched as a dependent of this one (the decode GEMV) may start now and
        # prefetch its weights; it waits for this kernel before it reads anything written here
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + offs, mask=mask, other=0.0).to(tl.float32)
        summed = (x + r).to(residual_ptr.dtype.element_ty)
        tl.store(residual_ptr + row * stride_r + offs, summed, mask=mask)
        x = summed.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, 0) / hidden + eps)
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, (x * inv_rms * w).to(out_ptr.dtype.element_ty),
             mask=mask)  # fmt: skip


_launch_norm = LaunchCache(_rmsnorm_kernel)


def _norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """rmsnorm of ``x`` (of ``residual += x`` when a residual is given) into ``out``."""
    rows = _rows(x)
    res_rows = rows if residual is None else _rows(residual)
    out = torch.empty_like(x) if out is None else out
    out_rows = _rows(out)
    hidden = rows.shape[1]
    block = triton.next_power_of_2(hidden)
    _launch_norm(
        (rows.shape[0],),
        (rows, res_rows, weight, out_rows),
        (rows.stride(0), res_rows.stride(0), out_rows.stride(0), hidden, eps),
        dict(BLOCK=block, HAS_RESIDUAL=residual is not None, PDL=pdl.enabled(x),
             num_warps=_warps_for(block)),
    )  # fmt: skip
    return out


def rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps) * weight`` over the last dim."""
    return _norm(x, None, weight, eps, out)


def add_rmsnorm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual += x`` in place; returns ``(rmsnorm(residual), residual)`` in one pass."""
    return _norm(x, residual, weight, eps, out), residual


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + offs, mask=mask, other=0.0).to(tl.float32)
    y = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


_launch_silu_and_mul = LaunchCache(_silu_and_mul_kernel)


def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(x[..., :I]) * x[..., I:]`` for ``x [..., 2I]`` (gate first, up second)."""
    rows = _rows(x)
    inter = rows.shape[1] // 2
    if out is None:
        out = torch.empty((*x.shape[:-1], inter), dtype=x.dtype, device=x.device)
    out_rows = _rows(out)
    block = min(triton.next_power_of_2(inter), 1024)
    grid = (rows.shape[0], triton.cdiv(inter, block))
    _launch_silu_and_mul(
        grid, (rows, out_rows), (rows.stride(0), out_rows.stride(0), inter),
        dict(BLOCK=block, num_warps=4),
    )  # fmt: skip
    return out


@triton.jit
def _norm_and_rotate(
    base_ptr,
    stride_head,
    cos,
    sin,
    norm_ptr,
    eps,
    NUM_HEADS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HALF: tl.constexpr,
    HAS_NORM: tl.constexpr,
):
    """Loads heads [BLOCK_H, D] of one token as two halves, norms, rotates; returns fp32."""
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HALF)
    mask = (offs_h < NUM_HEADS)[:, None]
    ptrs = base_ptr + offs_h[:, None] * stride_head + offs_d[None, :]
    x1 = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptrs + HALF, mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        inv_rms = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF) + eps)
        w1 = tl.load(norm_ptr + offs_d).to(tl.float32)
        w2 = tl.load(norm_ptr + HALF + offs_d).to(tl.float32)
        x1 = x1 * inv_rms[:, None] * w1[None, :]
        x2 = x2 * inv_rms[:, None] * w2[None, :]
    out1 = x1 * cos[None, :] - x2 * sin[None, :]
    out2 = x2 * cos[None, :] + x1 * sin[None, :]
    return out1, out2, ptrs, mask


@triton.jit
def _rope_store_kv_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    positions_ptr,
    cos_sin_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    num_tokens_ptr,
    q_norm_ptr,
    k_norm_ptr,
    zero_ptr,
    stride_q_tok,
    stride_q_head,
    stride_k_tok,
    stride_k_head,
    stride_v_tok,
    stride_v_head,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_slot,
    stride_vc_head,
    stride_cos_sin,
    stride_z_tok,
    stride_z_head,
    eps,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HKV: tl.constexpr,
    HALF: tl.constexpr,
    HAS_Q_NORM: tl.constexpr,
    HAS_K_NORM: tl.constexpr,
    HAS_NUM_TOKENS: tl.constexpr,
    ZERO_PADDING: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        # launched as a programmatic dependent of the one-row q/k/v GEMV: its programs may be
        # resident early, and wait here for every earlier kernel before reading or writing
        tl.extra.cuda.gdc_wait()
        # every earlier kernel has finished: the one-row attention launch after this one may
        # start (it reads the lengths and page table, then waits for this kernel's q and key)
        tl.extra.cuda.gdc_launch_dependents()
    token = tl.program_id(0)
    if HAS_NUM_TOKENS:
        if token >= tl.load(num_tokens_ptr):
            if ZERO_PADDING:  # the attention output's padded row: nothing else writes it
                offs_h = tl.arange(0, BLOCK_HQ)
                offs_z = tl.arange(0, 2 * HALF)
                z_ptrs = zero_ptr + token.to(tl.int64) * stride_z_tok
                z_ptrs += offs_h[:, None] * stride_z_head + offs_z[None, :]
                zeros = tl.zeros([BLOCK_HQ, 2 * HALF], zero_ptr.dtype.element_ty)
                tl.store(z_ptrs, zeros, mask=(offs_h < NUM_Q_HEADS)[:, None])
            return
    token = token.to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    offs_d = tl.arange(0, HALF)
    cos = tl.load(cos_sin_ptr + pos * stride_cos_sin + offs_d)
    sin = tl.load(cos_sin_ptr + pos * stride_cos_sin + HALF + offs_d)

    q1, q2, q_ptrs, q_mask = _norm_and_rotate(
        q_ptr + token * stride_q_tok, stride_q_head, cos, sin, q_norm_ptr, eps,
        NUM_Q_HEADS, BLOCK_HQ, HALF, HAS_Q_NORM,
    )  # fmt: skip
    tl.store(q_ptrs, q1.to(q_ptr.dtype.element_ty), mask=q_mask)
    tl.store(q_ptrs + HALF, q2.to(q_ptr.dtype.element_ty), mask=q_mask)

    k1, k2, k_ptrs, kv_mask = _norm_and_rotate(
        k_ptr + token * stride_k_tok, stride_k_head, cos, sin, k_norm_ptr, eps,
        NUM_KV_HEADS, BLOCK_HKV, HALF, HAS_K_NORM,
    )  # fmt: skip
    tl.store(k_ptrs, k1.to(k_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(k_ptrs + HALF, k2.to(k_ptr.dtype.element_ty), mask=kv_mask)

    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_HKV)
    # slot -1: a padded token, whose KV is not stored
    # (the slot test is made per head, not on a scalar: the interpreter rejects scalar masks)
    write = ((offs_h < NUM_KV_HEADS) & (tl.zeros([BLOCK_HKV], tl.int64) + slot >= 0))[:, None]
    kc_ptrs = k_cache_ptr + slot * stride_kc_slot + offs_h[:, None] * stride_kc_head
    kc_ptrs += offs_d[None, :]
    tl.store(kc_ptrs, k1.to(k_cache_ptr.dtype.element_ty), mask=write)
    tl.store(kc_ptrs + HALF, k2.to(k_cache_ptr.dtype.element_ty), mask=write)
    v_ptrs = v_ptr + token * stride_v_tok + offs_h[:, None] * stride_v_head + offs_d[None, :]
    vc_ptrs = v_cache_ptr + slot * stride_vc_slot + offs_h[:, None] * stride_vc_head
    vc_ptrs += offs_d[None, :]
    for half in tl.static_range(2):
        v = tl.load(v_ptrs + half * HALF, mask=write, other=0.0)
        tl.store(vc_ptrs + half * HALF, v.to(v_cache_ptr.dtype.element_ty), mask=write)


_launch_rope_store_kv = LaunchCache(_rope_store_kv_kernel)


def rope_store_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    num_tokens: torch.Tensor | None = None,
    zero_padding: torch.Tensor | None = None,
) -> None:
    """In place: optional q/k RMSNorm, rotary on q and k; then k, v -> cache at slot_mapping.
    ``zero_padding``: a tensor like q whose rows at or past ``num_tokens`` are zeroed."""
    num_rows, num_q_heads, head_dim = q.shape
    if zero_padding is not None and (zero_padding.shape != q.shape or zero_padding.stride(-1) != 1):
        raise ValueError(f"zero_padding must be shaped like q {tuple(q.shape)} and contiguous "
                         f"in head_dim, got {tuple(zero_padding.shape)}")  # fmt: skip
    num_kv_heads = k.shape[1]
    if head_dim % 2 or (head_dim // 2) & (head_dim // 2 - 1):
        raise ValueError(f"head_dim must be a power of two, got {head_dim}")
    for name, t in (("q", q), ("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim")
    if num_rows == 0:
        return
    # one row (decode at batch 1): a programmatic dependent launch behind the GEMV that wrote
    # q/k/v; larger launches stay plain
    use_pdl = num_rows == 1 and pdl.enabled(q)
    zero = zero_padding if zero_padding is not None else q  # a placeholder when unused
    _launch_rope_store_kv(
        (num_rows,),
        (
            q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping,
            num_tokens if num_tokens is not None else slot_mapping,
            q_norm_weight if q_norm_weight is not None else cos_sin_cache,
            k_norm_weight if k_norm_weight is not None else cos_sin_cache,
            zero,
        ),
        (
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
            cos_sin_cache.stride(0), zero.stride(0), zero.stride(1), eps,
        ),
        dict(
            NUM_Q_HEADS=num_q_heads,
            NUM_KV_HEADS=num_kv_heads,
            BLOCK_HQ=triton.next_power_of_2(num_q_heads),
            BLOCK_HKV=triton.next_power_of_2(num_kv_heads),
            HALF=head_dim // 2,
            HAS_Q_NORM=q_norm_weight is not None,
            HAS_K_NORM=k_norm_weight is not None,
            HAS_NUM_TOKENS=num_tokens is not None,
            # without num_tokens every row is a token: nothing to zero
            ZERO_PADDING=zero_padding is not None and num_tokens is not None,
            PDL=use_pdl,
            num_warps=4,
            launch_pdl=use_pdl,
        ),
    )  # fmt: skip
