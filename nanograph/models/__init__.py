"""Models. ``build_model`` constructs the causal LM for a ``ModelConfig``."""

from __future__ import annotations

import torch

from nanograph.distributed.group import TensorParallel
from nanograph.models.config import ModelConfig
from nanograph.models.llama import CausalLM
from nanograph.models.moe import MOE_BACKENDS, MoEBackend, get_moe_backend


def build_model(
    config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    moe_backend: MoEBackend | None = None,
    tp: TensorParallel | None = None,
) -> CausalLM:
    """Allocates the model on ``device`` in ``dtype`` with uninitialised weights (load or init
    them next). Built on the meta device first so an 8B model never exists in float32. A MoE
    model runs its experts with ``moe_backend`` (default: ``auto`` for the device). With a
    ``tp`` of several ranks it is this rank's shard (see ``CausalLM``)."""
    if config.is_moe and moe_backend is None:
        moe_backend = get_moe_backend("auto", device)
    with torch.device("meta"):
        model = CausalLM(config, moe_backend if config.is_moe else None, tp)
    model = model.to(dtype=dtype).to_empty(device=device)
    model.build_rotary()
    return model.eval().requires_grad_(False)


__all__ = [
    "MOE_BACKENDS",
    "CausalLM",
    "ModelConfig",
    "MoEBackend",
    "build_model",
    "get_moe_backend",
]
