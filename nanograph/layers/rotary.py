"""Rotary position embedding tables, with the scaling variants our model configs use
(``RopeScaling``, which model configs hold: it lives here, below ``models/``).

Invariant: ``cos_sin_cache`` is float32 ``[max_positions, head_dim]`` with cos in the first half
of the last dim and sin in the second (NeoX / Hugging Face ``rotate_half`` pairing (i, i + D/2)).
It is built once per model and indexed by position inside kernels, so it is graph-safe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling. ``kind`` is one of: none, linear, llama3, yarn, dynamic."""

    kind: str = "none"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True  # yarn: round the correction range to whole dims (gpt-oss: False)

    @staticmethod
    def from_hf(d: dict[str, Any] | None) -> RopeScaling:
        if not d:
            return RopeScaling()
        kind = d.get("rope_type", d.get("type", "none")) or "none"
        if kind == "default":
            return RopeScaling()
        return RopeScaling(
            kind=kind,
            factor=float(d.get("factor", 1.0)),
            low_freq_factor=float(d.get("low_freq_factor", 1.0)),
            high_freq_factor=float(d.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(d.get("original_max_position_embeddings", 8192)),
            beta_fast=float(d.get("beta_fast", 32.0)),
            beta_slow=float(d.get("beta_slow", 1.0)),
            truncate=bool(d.get("truncate", True)),
        )

    def to_hf(self) -> dict[str, Any] | None:
        if self.kind == "none":
            return None
        d: dict[str, Any] = {"rope_type": self.kind, "factor": self.factor}
        if self.kind == "llama3":
            d.update(
                low_freq_factor=self.low_freq_factor,
                high_freq_factor=self.high_freq_factor,
                original_max_position_embeddings=self.original_max_position_embeddings,
            )
        if self.kind == "yarn":
            d.update(
                beta_fast=self.beta_fast,
                beta_slow=self.beta_slow,
                original_max_position_embeddings=self.original_max_position_embeddings,
                truncate=self.truncate,
            )
        return d


def inverse_frequencies(
    head_dim: int, theta: float, scaling: RopeScaling
) -> tuple[torch.Tensor, float]:
    """Returns (inv_freq [head_dim/2] float64, attention scale applied to cos/sin)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    kind = scaling.kind
    if kind in ("none", "dynamic"):
        # dynamic NTK only changes frequencies beyond the trained length; we keep the base table
        # (as transformers does for sequences within max_position_embeddings).
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / scaling.factor, 1.0
    if kind == "llama3":
        old_len = scaling.original_max_position_embeddings
        low_wavelen = old_len / scaling.low_freq_factor
        high_wavelen = old_len / scaling.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
        smooth = (old_len / wavelen - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, scaled), 1.0
    if kind == "yarn":
        old_len = scaling.original_max_position_embeddings

        def correction_dim(rotations: float) -> float:
            return (head_dim * math.log(old_len / (rotations * 2 * math.pi))) / (
                2 * math.log(theta)
            )

        low, high = correction_dim(scaling.beta_fast), correction_dim(scaling.beta_slow)
        if scaling.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, head_dim - 1)
        ramp = (torch.arange(head_dim // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)
        extrapolation = 1 - ramp.clamp(0, 1)
        interpolated = inv_freq / scaling.factor
        inv = interpolated * (1 - extrapolation) + inv_freq * extrapolation
        mscale = 0.1 * math.log(scaling.factor) + 1.0 if scaling.factor > 1 else 1.0
        return inv, mscale
    raise ValueError(
        f"unsupported rope scaling {kind!r}: use none, linear, llama3, yarn or dynamic"
    )


def build_cos_sin_cache(
    head_dim: int, max_positions: int, theta: float, scaling: RopeScaling, device: torch.device
) -> torch.Tensor:
    inv_freq, mscale = inverse_frequencies(head_dim, theta, scaling)
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)
    table = torch.cat([freqs.cos() * mscale, freqs.sin() * mscale], dim=-1)
    return table.to(device=device, dtype=torch.float32)
