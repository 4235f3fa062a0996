"""How a model splits over tensor-parallel ranks: the rank's own config, and the part of each
checkpoint tensor the rank keeps (Megatron-style column/row parallelism).

Invariants:
- ``shard_config`` gives the model one rank builds: q heads, the dense MLP width and each
  expert's width divided by the size; KV heads divided too, or one per rank when there are
  fewer KV heads than ranks (rank r then keeps KV head ``r * kv_heads // size``, the one its q
  heads read: every KV head is replicated on ``size / kv_heads`` ranks). Hidden size and
  vocabulary are unchanged (the embedding and LM head hold ``vocab_rows`` rows each).
- ``shard_tensor`` cuts a full checkpoint tensor (Hugging Face name and layout) to this rank's
  part: column-parallel q/k/v and gate/up (output rows), row-parallel o/down (input columns),
  vocabulary rows (the last rank's padded with zeros), experts by their intermediate width.
  A row-parallel bias is added once: rank 0 keeps it, the others hold zeros, so the sum over
  ranks of the all-reduce is the full layer's output. Everything else (norms, q/k norms, MoE
  routers) is replicated. With one rank it returns the tensor unchanged.
- Loaders call it tensor by tensor, so a rank never holds more than one full checkpoint tensor
  (on the host) and only its shard goes to its device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from nanograph.arith import ceil_div

if TYPE_CHECKING:  # models import this module: no import of models at run time
    from nanograph.models.config import ModelConfig


def vocab_rows(vocab_size: int, size: int) -> int:
    """Embedding / LM-head rows per rank (the vocabulary padded to a multiple of ``size``)."""
    return ceil_div(vocab_size, size)


def shard_config(config: ModelConfig, size: int) -> ModelConfig:
    """The config of one rank's model; a clear error when the model does not divide."""
    if size == 1:
        return config
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    problems = []
    if heads % size:
        problems.append(f"num_attention_heads ({heads})")
    if kv % size and size % kv:
        problems.append(f"num_key_value_heads ({kv}; or be a multiple of it)")
    widths = {"intermediate_size": config.intermediate_size}
    if config.is_moe:
        widths = {"moe_intermediate_size": config.expert_intermediate_size}
    problems += [f"{name} ({w})" for name, w in widths.items() if w % size]
    if problems:
        raise ValueError(
            f"tensor_parallel_size={size} must divide {', '.join(problems)} of this "
            f"{config.architecture} model; choose a size that divides them"
        )
    changes = dict(num_attention_heads=heads // size, num_key_value_heads=max(kv // size, 1))
    if config.is_moe and config.moe_intermediate_size:
        changes["moe_intermediate_size"] = config.moe_intermediate_size // size
    else:  # dense MLP, or gpt-oss whose experts use intermediate_size
        changes["intermediate_size"] = config.intermediate_size // size
    return config.replace(**changes)


def _part(tensor: torch.Tensor, dim: int, rank: int, parts: int) -> torch.Tensor:
    n = tensor.shape[dim] // parts
    return tensor.narrow(dim, rank * n, n)


def _kv_part(tensor: torch.Tensor, config: ModelConfig, rank: int, size: int) -> torch.Tensor:
    kv = config.num_key_value_heads
    if kv >= size:
        return _part(tensor, 0, rank, size)
    return _part(tensor, 0, rank * kv // size, kv)  # one replicated KV head


def _vocab_part(tensor: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    rows = vocab_rows(tensor.shape[0], size)
    part = tensor[rank * rows : (rank + 1) * rows]
    if part.shape[0] == rows:
        return part
    padded = tensor.new_zeros(rows, *tensor.shape[1:])
    padded[: part.shape[0]] = part
    return padded


def _gate_up_halves(tensor: torch.Tensor, dim: int, rank: int, size: int) -> torch.Tensor:
    """Stacked [gate; up] along ``dim``: this rank's rows of each half, stacked again."""
    gate, up = tensor.chunk(2, dim=dim)
    return torch.cat([_part(gate, dim, rank, size), _part(up, dim, rank, size)], dim=dim)


def shard_tensor(
    name: str, tensor: torch.Tensor, config: ModelConfig, rank: int, size: int
) -> torch.Tensor:
    """This rank's part of checkpoint tensor ``name`` of the full model ``config``."""
    if size == 1:
        return tensor
    leaf = name.split(".")
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return _vocab_part(tensor, rank, size)
    if ".self_attn." in name:
        proj = leaf[-2] if leaf[-1] in ("weight", "bias") else leaf[-1]
        if proj == "q_proj" or proj == "sinks":
            return _part(tensor, 0, rank, size)
        if proj in ("k_proj", "v_proj"):
            return _kv_part(tensor, config, rank, size)
        if proj == "o_proj":
            return _part(tensor, 1, rank, size) if leaf[-1] == "weight" else _once(tensor, rank)
        return tensor  # q_norm, k_norm
    if ".mlp.experts." in name:
        return _expert_part(leaf, tensor, config, rank, size)
    if ".mlp." in name:
        proj = leaf[-2]
        if proj in ("gate_proj", "up_proj"):
            return _part(tensor, 0, rank, size)
        if proj == "down_proj":
            return _part(tensor, 1, rank, size)
    return tensor  # layer norms, the final norm, MoE routers


def _once(bias: torch.Tensor, rank: int) -> torch.Tensor:
    return bias if rank == 0 else torch.zeros_like(bias)


def _expert_part(
    leaf: list[str], tensor: torch.Tensor, config: ModelConfig, rank: int, size: int
) -> torch.Tensor:
    if config.architecture == "gpt_oss":  # [E, H, 2I] interleaved gate/up, [E, I, H] down
        kind = leaf[-1]
        # MXFP4 pairs kept packed: codes [E, out, groups, 16], scales [E, out, groups];
        # gate/up by output rows (pairs together), down by whole scale groups of its input
        if kind in ("gate_up_proj_blocks", "gate_up_proj_scales"):
            return _part(tensor, 1, rank, size)
        if kind in ("down_proj_blocks", "down_proj_scales"):
            return _part(tensor, 2, rank, size)
        if kind == "gate_up_proj":
            return _part(tensor, 2, rank, size)  # interleaved pairs stay together
        if kind == "gate_up_proj_bias":
            return _part(tensor, 1, rank, size)
        if kind == "down_proj":
            return _part(tensor, 1, rank, size)
        return _once(tensor, rank)  # down_proj_bias
    if leaf[-1] == "gate_up_proj":  # transformers 5, all experts: [E, 2I, H]
        return _gate_up_halves(tensor, 1, rank, size)
    if leaf[-1] == "down_proj":  # transformers 5: [E, H, I]
        return _part(tensor, 2, rank, size)
    proj = leaf[-2]  # one expert: gate_proj / up_proj [I, H], down_proj [H, I]
    return _part(tensor, 1 if proj == "down_proj" else 0, rank, size)
