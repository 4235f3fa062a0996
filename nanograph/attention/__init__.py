"""Attention backends. ``get_attention_backend(name, device)`` picks one by name."""

from __future__ import annotations

import torch

from nanograph.attention.base import AttentionBackend, AttentionMetadata

ATTENTION_BACKENDS = ("auto", "torch_native", "triton")


def get_attention_backend(name: str, device: torch.device) -> AttentionBackend:
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch_native"
    if name == "torch_native":
        from nanograph.attention.torch_native import TorchNativeAttention

        return TorchNativeAttention()
    if name == "triton":
        from nanograph.attention.triton_backend import TritonAttention

        return TritonAttention()
    raise ValueError(f"unknown attention backend {name!r}; choose one of {ATTENTION_BACKENDS}")


__all__ = ["AttentionBackend", "AttentionMetadata", "get_attention_backend"]
