"""Plain-torch references of every kernel in this package, with the same signatures.

They are the CPU path of the model and the ground truth of the kernel tests (call them on
float64 copies for a float64 reference). They read lengths on the host, so they are not
graph-safe; the layouts and conventions are the ones documented in ``attention`` and ``fused``:
- math in at least fp32, one rounding to the output dtype at the end;
- padded rows (at or past ``query_start_loc[S]`` / ``num_tokens``) are not written, and slot -1
  in ``slot_mapping`` is not stored.
"""

from __future__ import annotations

import torch


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x (already in the compute dtype) over the last dim: torch's own op, one pass
    on CPU where x * rsqrt(mean(x^2) + eps) * w took four (0.27 against 0.42 ms at 512 x 576)."""
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight.to(x.dtype), eps)


def rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    y = _rms(x.to(_compute_dtype(x)), weight, eps).to(x.dtype)
    if out is None:
        return y
    out.copy_(y)
    return out


def add_rmsnorm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    residual.add_(x)
    return rmsnorm(residual, weight, eps, out=out), residual


def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    inter = x.shape[-1] // 2
    xf = x.to(_compute_dtype(x))
    # in place on silu's own output: one temporary fewer (the CPU path's MLP)
    y = torch.nn.functional.silu(xf[..., :inter]).mul_(xf[..., inter:]).to(x.dtype)
    if out is None:
        return y
    out.copy_(y)
    return out


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    silu_mul: bool = False,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    silu_out: bool = False,
    residual: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    normed_out: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    tiles: object | None = None,
) -> torch.Tensor:
    """The one-row product with its optional prologue (silu_and_mul or rmsnorm of x, rounded to
    x's dtype, the normalised row copied into ``normed_out``) and epilogue (``bias`` added
    before the product's rounding, silu_and_mul of the product, ``residual +=`` the result),
    each rounded to the dtype; ``tiles`` is the Triton kernel's launch hint, ignored."""
    del tiles
    row = silu_and_mul(x) if silu_mul else x
    if norm_weight is not None:
        row = rmsnorm(row, norm_weight, eps)
    if normed_out is not None:
        normed_out.copy_(row)
    y = row.to(_compute_dtype(x)) @ weight.to(_compute_dtype(x)).T
    y = (y if bias is None else y + bias.to(y.dtype)).to(x.dtype)
    if silu_out:
        y = silu_and_mul(y)
    if residual is not None:
        residual.copy_((residual.to(_compute_dtype(x)) + y).to(residual.dtype))
        return residual
    if out is None:
        return y
    out.copy_(y)
    return out


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
    rows = q.shape[0] if num_tokens is None else int(num_tokens.reshape(-1)[0])
    if zero_padding is not None:
        zero_padding[rows:] = 0
    half = q.shape[-1] // 2
    table = cos_sin_cache[positions[:rows].long()]
    cos = table[:, None, :half].to(_compute_dtype(q))
    sin = table[:, None, half:].to(_compute_dtype(q))

    def norm_and_rotate(x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        xf = x[:rows].to(_compute_dtype(x))
        if weight is not None:
            xf = _rms(xf, weight, eps)
        x1, x2 = xf[..., :half], xf[..., half:]
        # each half written in place: no cat, two temporaries fewer (the CPU path's rope)
        out = torch.empty_like(xf)
        torch.mul(x1, cos, out=out[..., :half]).addcmul_(x2, sin, value=-1)
        torch.mul(x2, cos, out=out[..., half:]).addcmul_(x1, sin)
        return out

    q[:rows] = norm_and_rotate(q, q_norm_weight).to(q.dtype)
    k_rot = norm_and_rotate(k, k_norm_weight)
    k[:rows] = k_rot.to(k.dtype)
    slots = slot_mapping[:rows].long()
    keep = slots >= 0
    k_new, v_new = k_rot, v[:rows]
    if not bool(keep.all()):  # padded rows (slot -1) are not stored
        slots, k_new, v_new = slots[keep], k_new[keep], v_new[keep]
    k_cache[slots] = k_new.to(k_cache.dtype)
    v_cache[slots] = v_new.to(v_cache.dtype)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    page_size: int,
    scale: float,
    *,
    sliding_window: int = 0,
    sinks: torch.Tensor | None = None,
    softcap: float = 0.0,
    max_query_len: int | None = None,
    num_splits: int | None = None,
    tiles: object | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal paged attention, one request at a time (``max_query_len``, ``num_splits`` and
    ``tiles`` are launch hints of the Triton kernel and ignored here)."""
    del max_query_len, num_splits, tiles
    num_q_heads = q.shape[1]
    group = num_q_heads // k_cache.shape[1]
    dtype = _compute_dtype(q)
    if out is None:
        out = torch.zeros_like(q)
    for r, (seq_len, q_len, start) in enumerate(
        zip(seq_lens.tolist(), query_lens.tolist(), query_start_loc.tolist(), strict=False)
    ):
        if q_len == 0:
            continue
        key_pos = torch.arange(seq_len, device=q.device)
        pages = page_table[r, key_pos // page_size].long()
        slots = pages * page_size + key_pos % page_size
        k = k_cache[slots].to(dtype).repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = v_cache[slots].to(dtype).repeat_interleave(group, dim=1)
        qr = q[start : start + q_len].to(dtype)  # [q_len, Hq, D]
        scores = torch.einsum("qhd,khd->hqk", qr, k) * scale
        if softcap > 0:
            scores = softcap * torch.tanh(scores / softcap)
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
        visible = key_pos[None, :] <= q_pos[:, None]
        if sliding_window > 0:
            visible &= key_pos[None, :] > q_pos[:, None] - sliding_window
        scores = scores.masked_fill(~visible, float("-inf"))
        if sinks is not None:
            # the sink is one more logit per head that takes probability mass and no value
            sink = sinks.to(dtype)[:, None, None].expand(num_q_heads, q_len, 1)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        out[start : start + q_len] = torch.einsum("hqk,khd->qhd", probs, v).to(out.dtype)
    return out


def moe_activation(
    gate_up: torch.Tensor, activation: str, alpha: float = 1.702, limit: float = 7.0
) -> torch.Tensor:
    """[..., 2I] -> [..., I]. ``silu``: gate = first half, up = second half, silu(gate) * up.
    ``clamped_swiglu`` (gpt-oss): gate/up interleaved (even/odd columns), gate clamped above
    and up to [-limit, limit], (up + 1) * gate * sigmoid(alpha * gate)."""
    if activation == "silu":
        gate, up = gate_up.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up
    if activation == "clamped_swiglu":
        gate = gate_up[..., ::2].clamp(max=limit)
        up = gate_up[..., 1::2].clamp(min=-limit, max=limit)
        return (up + 1) * gate * torch.sigmoid(gate * alpha)
    raise ValueError(f"unknown MoE activation {activation!r}: use silu or clamped_swiglu")


def fused_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    b13: torch.Tensor | None,
    b2: torch.Tensor | None,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
    alpha: float = 1.702,
    limit: float = 7.0,
    tiles: object | None = None,
) -> torch.Tensor:
    """Every (token, k) pair through its expert by gathering the weights (``tiles`` is the
    Triton kernel's launch hint, ignored): small sizes only."""
    del tiles
    dtype = _compute_dtype(x)
    xs = x.to(dtype)[:, None, None, :]  # [T, 1, 1, H]
    gate_up = (xs * w13[topk_ids].to(dtype)).sum(-1)  # [T, K, 2I]
    if b13 is not None:
        gate_up = gate_up + b13[topk_ids].to(dtype)
    act = moe_activation(gate_up, activation, alpha, limit)
    down = (act[:, :, None, :] * w2[topk_ids].to(dtype)).sum(-1)  # [T, K, H]
    if b2 is not None:
        down = down + b2[topk_ids].to(dtype)
    return (down * topk_weights.to(dtype)[..., None]).sum(1).to(x.dtype)
