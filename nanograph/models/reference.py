"""The same architecture in transformers, for reference checks and the benchmark peer.

``transformers`` is imported only when called. Weights are shared through Hugging Face names:
``CausalLM.hf_state_dict()`` gives ours in that form.
"""

from __future__ import annotations

import re

import torch

from nanograph.models.config import ModelConfig

_EXPERT = re.compile(r"(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight")


def transformers_model(
    config: ModelConfig,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    state_dict: dict[str, torch.Tensor] | None = None,
    attn_implementation: str | None = None,
):
    """A transformers ``*ForCausalLM`` of ``config``: random weights, or ``state_dict``'s.
    ``attn_implementation`` (e.g. "sdpa", "eager"): transformers' default when None."""
    import transformers

    fields = config.to_hf_dict()
    arch = fields.pop("architectures")[0]
    fields.pop("model_type")
    if attn_implementation is not None:
        fields["attn_implementation"] = attn_implementation
    hf_config = getattr(transformers, arch.replace("ForCausalLM", "Config"))(**fields)
    with torch.device(device):
        model = getattr(transformers, arch)(hf_config).to(dtype).eval()
    if state_dict is not None:
        state_dict = _fuse_experts(state_dict, set(model.state_dict()))
        missing, unexpected = model.load_state_dict(state_dict, strict=False)
        # a tied head is the embedding; anything else missing means a naming bug
        if unexpected or set(missing) - {"lm_head.weight"}:
            raise ValueError(f"weights do not fit: missing {missing}, unexpected {unexpected}")
    return model


def _fuse_experts(state: dict[str, torch.Tensor], expected: set[str]) -> dict[str, torch.Tensor]:
    """Per-expert tensors (checkpoint names, ``hf_state_dict``'s) stacked into the
    ``experts.gate_up_proj [E, 2I, H]`` / ``experts.down_proj [E, H, I]`` parameters that
    transformers 5's Qwen3-MoE holds in memory; unchanged for a model that expects them."""
    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[tuple[int, str], torch.Tensor]] = {}
    for name, tensor in state.items():
        match = _EXPERT.fullmatch(name)
        if name in expected or match is None or f"{match[1]}.gate_up_proj" not in expected:
            out[name] = tensor
        else:
            experts.setdefault(match[1], {})[(int(match[2]), match[3])] = tensor
    for prefix, parts in experts.items():
        count = 1 + max(e for e, _ in parts)
        out[f"{prefix}.gate_up_proj"] = torch.stack(
            [torch.cat([parts[(e, "gate")], parts[(e, "up")]]) for e in range(count)]
        )
        out[f"{prefix}.down_proj"] = torch.stack([parts[(e, "down")] for e in range(count)])
    return out
