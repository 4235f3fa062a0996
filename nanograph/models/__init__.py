"""Models. ``build_model`` constructs the causal LM for a ``ModelConfig``."""

from __future__ import annotations

import torch

from nanograph.models.config import ModelConfig
from nanograph.models.llama import CausalLM


def build_model(config: ModelConfig, dtype: torch.dtype, device: torch.device) -> CausalLM:
    """Allocates the model on ``device`` in ``dtype`` with uninitialised weights (load or init
    them next). Built on the meta device first so an 8B model never exists in float32."""
    with torch.device("meta"):
        model = CausalLM(config)
    model = model.to(dtype=dtype).to_empty(device=device)
    model.build_rotary()
    return model.eval().requires_grad_(False)


__all__ = ["CausalLM", "ModelConfig", "build_model"]
