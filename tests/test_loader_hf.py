"""Hugging Face folders (single and sharded safetensors), ``load_weights`` and its errors, and
``init_dummy_weights``."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_hf_model
from torch import nn

from nanograph.loader import (
    ModelLoadError,
    init_dummy_weights,
    iter_hf_weights,
    load_weights,
    read_hf_config,
)
from nanograph.models.config import RopeScaling

pytest.importorskip("transformers")


def expected_state(model: nn.Module) -> dict[str, torch.Tensor]:
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight")  # saved once, as the embedding
    return state


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen2"])
def test_hf_folder_round_trip(tiny_model_dir, arch):
    folder = tiny_model_dir(arch)
    reference = make_hf_model(arch)
    config = read_hf_config(folder)
    hf = reference.config
    assert config.architecture == arch
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (
        hf.hidden_size,
        hf.num_hidden_layers,
        hf.vocab_size,
    )
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (
        hf.num_attention_heads,
        hf.num_key_value_heads,
        getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads,
    )
    assert config.tie_word_embeddings == hf.tie_word_embeddings
    assert config.rms_norm_eps == hf.rms_norm_eps
    assert config.qk_norm == (arch == "qwen3")
    assert config.attention_bias == (arch == "qwen2")
    ours = dict(iter_hf_weights(folder))
    state = expected_state(reference)
    assert set(ours) == set(state)
    for name, tensor in ours.items():
        assert torch.equal(tensor, state[name]), name


def test_transformers5_rope_parameters(tiny_model_dir):
    """transformers >= 5 saves theta and scaling as ``rope_parameters``; both must survive."""
    folder = tiny_model_dir("llama")
    assert "rope_parameters" in json.loads((folder / "config.json").read_text())
    config = read_hf_config(folder)
    assert config.rope_theta == 500000.0
    assert config.rope_scaling == RopeScaling(
        kind="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=64,
    )


def test_sharded_folder_and_generation_config(tmp_path):
    reference = make_hf_model("qwen3")
    reference.save_pretrained(tmp_path, max_shard_size="40KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [9, 11]}))
    config = read_hf_config(tmp_path)
    assert set(config.eos_token_ids) >= {9, 11}
    ours = dict(iter_hf_weights(tmp_path))
    state = expected_state(reference)
    assert set(ours) == set(state)
    assert all(torch.equal(ours[n], state[n]) for n in state)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_load_weights_into_transformers_model(tiny_model_dir, arch):
    """The plain-module path: parameters matched by name, tied head shared, dtype converted."""
    folder = tiny_model_dir(arch)
    target = make_hf_model(arch, seed=1).to(torch.bfloat16)
    load_weights(target, iter_hf_weights(folder), progress=True)
    for name, tensor in expected_state(make_hf_model(arch)).items():
        assert torch.equal(target.state_dict()[name], tensor.to(torch.bfloat16)), name


def test_load_weights_skips_tied_head_copy():
    """transformers' state_dict() lists a tied head separately; it fills nothing new."""
    reference = make_hf_model("qwen2")
    assert reference.config.tie_word_embeddings and "lm_head.weight" in reference.state_dict()
    target = make_hf_model("qwen2", seed=1)
    load_weights(target, reference.state_dict().items(), progress=False)
    assert torch.equal(target.lm_head.weight, reference.lm_head.weight)


class PackedToy(nn.Module):
    """A model that packs q/k/v into one parameter, like nanograph's ``CausalLM``."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Parameter(torch.zeros(6, 4))
        self.norm = nn.Parameter(torch.zeros(4))

    def hf_weight_target(self, name: str) -> tuple[nn.Parameter, slice | None]:
        rows = {"q.weight": slice(0, 2), "k.weight": slice(2, 4), "v.weight": slice(4, 6)}
        if name in rows:
            return self.qkv, rows[name]
        if name == "norm.weight":
            return self.norm, None
        raise KeyError(name)

    def hf_weight_names(self) -> list[str]:
        return ["q.weight", "k.weight", "v.weight", "norm.weight"]


def toy_weights() -> dict[str, torch.Tensor]:
    w = {
        n: torch.full((2, 4), float(i)) for i, n in enumerate(["q.weight", "k.weight", "v.weight"])
    }
    return w | {"norm.weight": torch.arange(4.0)}


def test_load_weights_packed():
    model = PackedToy()
    load_weights(model, toy_weights().items(), progress=False)
    assert model.qkv[:, 0].tolist() == [0, 0, 1, 1, 2, 2]
    assert model.norm.tolist() == [0, 1, 2, 3]


def test_load_weights_errors():
    weights = toy_weights()
    missing = {k: v for k, v in weights.items() if k != "k.weight"}
    with pytest.raises(ModelLoadError, match=r"lacks 1 weight\(s\) the model needs: k\.weight"):
        load_weights(PackedToy(), missing.items(), progress=False)
    unexpected = weights | {"lm_head.weight": torch.zeros(2, 4)}
    with pytest.raises(ModelLoadError, match="'lm_head.weight' has no place in the model"):
        load_weights(PackedToy(), unexpected.items(), progress=False)
    wrong = weights | {"v.weight": torch.zeros(3, 4)}
    with pytest.raises(ModelLoadError, match=r"'v.weight' has shape \(3, 4\).*expects \(2, 4\)"):
        load_weights(PackedToy(), wrong.items(), progress=False)


def test_init_dummy_weights():
    a, b = make_hf_model("qwen2", seed=0), make_hf_model("qwen2", seed=1).to(torch.bfloat16)
    init_dummy_weights(a, seed=3)
    init_dummy_weights(b, seed=3)
    c = make_hf_model("qwen2", seed=2)
    init_dummy_weights(c, seed=4)
    for name, p in a.named_parameters():
        if "norm" in name:
            assert torch.all(p == 1), name
        else:
            assert 0.01 < p.std().item() < 0.03, name
    assert b.model.embed_tokens.weight.dtype == torch.bfloat16
    state_a = dict(a.named_parameters())
    again = make_hf_model("qwen2", seed=5)
    init_dummy_weights(again, seed=3)
    for name, p in again.named_parameters():
        assert torch.equal(p, state_a[name]), name  # same seed -> same weights
    assert not torch.equal(c.model.embed_tokens.weight, a.model.embed_tokens.weight)
