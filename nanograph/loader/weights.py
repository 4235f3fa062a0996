"""Putting tensors into a model: streamed checkpoint weights, or a deterministic random init.

Invariants:
- ``load_weights`` fills every weight the model expects exactly once or raises: an unknown name,
  a wrong shape and a weight the checkpoint lacks are each a ``ModelLoadError`` naming the tensor.
- Tensors are converted to each parameter's dtype and device by ``copy_``; a checkpoint tensor
  is dropped as soon as it is copied, so host memory stays near one tensor. An MXFP4 tensor is
  dequantized on the parameter's device, into its dtype, before anything else looks at it,
  unless its parameter is uint8 (a model that keeps MXFP4 experts): then its codes go there
  and its scales into the parameter of ``<name>_scales``, both as the checkpoint holds them.
- A model may pack several Hugging Face tensors into one parameter (q/k/v, gate/up, experts) or
  hold one transposed (gpt-oss experts): it says so through ``HFWeightTargets``. Any other
  module is matched by parameter name.
- Tensor parallelism: a model that holds one rank's shard (``HFWeightShards``) cuts each
  checkpoint tensor to its part before the shape check and the copy, so only the shard reaches
  the device; a model of one rank returns the tensor unchanged.
- Tied embeddings: a tied model has no separate ``lm_head`` weight (shared parameter or none at
  all). A checkpoint's ``lm_head.weight`` that has no place in a model with an embedding is the
  tied copy (transformers' ``state_dict()`` lists it) and is skipped; every other name without
  a place is an error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from nanograph.loader.errors import ModelLoadError
from nanograph.loader.mxfp4 import BLOCKS, SCALES, Mxfp4Tensor
from nanograph.models.llama import WeightIndex, weight_view
from nanograph.progress import progress_bar

EMBEDDING = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"
# Hugging Face's initializer_range default; a random-init model has realistic activation scales.
DUMMY_INIT_STD = 0.02


@runtime_checkable
class HFWeightTargets(Protocol):
    """A model whose parameters are not one-to-one with Hugging Face tensor names."""

    def hf_weight_target(self, name: str) -> tuple[nn.Parameter, WeightIndex]:
        """The parameter a Hugging Face tensor goes into and the part it fills (None: all;
        see ``models.llama.weight_view``).
        Raises ``KeyError`` for a name the model does not have."""
        ...

    def hf_weight_names(self) -> list[str]:
        """Every Hugging Face tensor name the model needs."""
        ...


@runtime_checkable
class HFWeightShards(Protocol):
    """A model that holds one tensor-parallel rank's shard of the checkpoint."""

    def hf_weight_shard(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """The part of the full checkpoint tensor ``name`` this model keeps."""
        ...


Resolver = Callable[[str], tuple[nn.Parameter, WeightIndex]]


def _targets(model: nn.Module) -> tuple[Resolver, list[str]]:
    if isinstance(model, HFWeightTargets):
        return model.hf_weight_target, model.hf_weight_names()
    # named_parameters drops aliases, so a head tied to the embedding appears once
    params = dict(model.named_parameters())
    return (lambda name: (params[name], None)), list(params)


def _whole(name: str, tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def load_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor | Mxfp4Tensor]],
    *,
    progress: bool = True,
) -> None:
    """Copies ``(hf_name, tensor)`` pairs into ``model``'s parameters (any dtype/device).

    Shows a tqdm bar on a terminal when ``progress`` is true.
    """
    resolve, expected = _targets(model)
    shard = model.hf_weight_shard if isinstance(model, HFWeightShards) else _whole
    items = progress_bar(
        weights, desc="Loading weights", show=progress, total=len(expected), unit="tensor"
    )
    loaded: set[str] = set()
    whole: set[int] = set()  # parameters a single tensor filled
    with torch.no_grad():
        for name, tensor in items:
            try:
                param, index = resolve(name)
            except KeyError:
                if name == LM_HEAD and EMBEDDING in expected:
                    continue  # the tied head: the embedding fills it
                raise ModelLoadError(
                    f"checkpoint tensor {name!r} has no place in the model; the checkpoint does "
                    "not match the config (architecture, tied embeddings, bias, q/k norm)"
                ) from None
            target = weight_view(param, index)
            packed = target.dtype == torch.uint8  # the model keeps MXFP4 codes here
            if isinstance(tensor, Mxfp4Tensor) and packed:
                scales = weight_view(*resolve(name + SCALES))
                _copy(name + SCALES, scales, shard(name + SCALES, tensor.scales))
                tensor = shard(name + BLOCKS, tensor.blocks).flatten(-2)
            elif isinstance(tensor, Mxfp4Tensor):
                tensor = shard(name, tensor.dequantize(target.device, target.dtype))
            elif packed:
                raise ModelLoadError(
                    f"checkpoint tensor {name!r} is {tensor.dtype}, but the model keeps MXFP4 "
                    f"experts, which load from a checkpoint's MXFP4 pairs ({name}{BLOCKS} / "
                    f"{name}{SCALES}): drop --quantization mxfp4 for this checkpoint"
                )
            else:
                tensor = shard(name, tensor)
            _copy(name, target, tensor)
            loaded.add(name)
            if index is None:
                whole.add(id(param))
    # a name not loaded is missing unless a tensor filled its whole parameter (transformers 5
    # holds Qwen3-MoE experts fused: one tensor fills what the per-expert names would)
    missing = [n for n in expected if n not in loaded and id(resolve(n)[0]) not in whole]
    if missing:
        shown = ", ".join(missing[:5]) + (", ..." if len(missing) > 5 else "")
        raise ModelLoadError(
            f"the checkpoint lacks {len(missing)} weight(s) the model needs: {shown}"
        )


def _copy(name: str, target: torch.Tensor, tensor: torch.Tensor) -> None:
    if target.shape != tensor.shape:
        raise ModelLoadError(
            f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)} but the model "
            f"expects {tuple(target.shape)}; the checkpoint does not match the config"
        )
    target.copy_(tensor)


# MXFP4 dummy experts: random codes under the scale 2^-7 (E2M1 values' RMS ~2.9: weights of
# RMS ~0.023, like the dense init's std)
DUMMY_MXFP4_SCALE = 127 - 7


def init_dummy_weights(model: nn.Module, seed: int = 0) -> None:
    """Random weights for ``--load-format dummy``: matrices and biases ~ N(0, 0.02), norm
    weights 1, MXFP4 experts random codes of a similar scale. Drawn in place, on the
    parameters' device and dtype (an 8B model on GPU takes well under a second); the same
    seed, model and device give the same weights."""
    generators: dict[torch.device, torch.Generator] = {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 1 and not name.endswith("bias"):
                param.fill_(1.0)  # RMSNorm scales (including per-head q/k norms)
                continue
            if param.device not in generators:
                generators[param.device] = torch.Generator(device=param.device).manual_seed(seed)
            if name.endswith(SCALES) and param.dtype == torch.uint8:
                param.fill_(DUMMY_MXFP4_SCALE)
            elif param.dtype == torch.uint8:  # MXFP4 codes
                param.random_(0, 256, generator=generators[param.device])
            else:
                param.normal_(0.0, DUMMY_INIT_STD, generator=generators[param.device])
