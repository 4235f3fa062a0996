"""The same architecture in transformers, for reference checks and the benchmark peer.

``transformers`` is imported only when called. Weights are shared through Hugging Face names:
``CausalLM.hf_state_dict()`` gives ours in that form.
"""

from __future__ import annotations

import torch

from nanograph.models.config import ModelConfig


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
        missing, unexpected = model.load_state_dict(state_dict, strict=False)
        # a tied head is the embedding; anything else missing means a naming bug
        if unexpected or set(missing) - {"lm_head.weight"}:
            raise ValueError(f"weights do not fit: missing {missing}, unexpected {unexpected}")
    return model
