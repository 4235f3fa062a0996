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
    model = model.to(dtype=dtype)
    _check_weights_fit(model, device)
    model = model.to_empty(device=device)
    model.build_rotary()
    return model.eval().requires_grad_(False)


def _check_weights_fit(model: CausalLM, device: torch.device) -> None:
    """A clear error, before any allocation, when a GPU cannot hold the weights (torch's own
    out-of-memory error would come from inside ``to_empty`` and name no way out)."""
    if device.type != "cuda":
        return
    need = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    free, total = torch.cuda.mem_get_info(device)
    # what torch's allocator holds but no tensor uses (an engine freed earlier in this process)
    # is free for these weights too
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if need > free:
        dtype = next(model.parameters()).dtype
        raise MemoryError(
            f"the model's weights need {need / 2**30:.1f} GiB in {dtype} but {device} has "
            f"{free / 2**30:.1f} GiB free (of {total / 2**30:.1f}): use a GPU with more memory, "
            "--tensor-parallel-size N to split them over N GPUs, or a smaller model"
        )


__all__ = [
    "MOE_BACKENDS",
    "CausalLM",
    "ModelConfig",
    "MoEBackend",
    "build_model",
    "get_moe_backend",
]
