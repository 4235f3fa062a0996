"""Model architecture description shared by loaders, models and benchmarks.

Invariants:
- A ``ModelConfig`` is frozen and fully resolved: every derived size (head_dim, kv heads) is
  explicit, so a model never guesses from weights.
- Field names follow Hugging Face ``config.json`` where one exists, so ``from_hf_dict`` is a
  plain mapping and a config can be written back for transformers reference checks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling. ``kind`` is one of: none, linear, llama3, yarn, dynamic."""

    kind: str = "none"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    @staticmethod
    def from_hf(d: dict[str, Any] | None) -> RopeScaling:
        if not d:
            return RopeScaling()
        kind = d.get("rope_type", d.get("type", "none")) or "none"
        if kind == "default":
            return RopeScaling()
        return RopeScaling(
            kind=kind,
            factor=float(d.get("factor", 1.0)),
            low_freq_factor=float(d.get("low_freq_factor", 1.0)),
            high_freq_factor=float(d.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(d.get("original_max_position_embeddings", 8192)),
            beta_fast=float(d.get("beta_fast", 32.0)),
            beta_slow=float(d.get("beta_slow", 1.0)),
        )

    def to_hf(self) -> dict[str, Any] | None:
        if self.kind == "none":
            return None
        d: dict[str, Any] = {"rope_type": self.kind, "factor": self.factor}
        if self.kind == "llama3":
            d.update(
                low_freq_factor=self.low_freq_factor,
                high_freq_factor=self.high_freq_factor,
                original_max_position_embeddings=self.original_max_position_embeddings,
            )
        if self.kind == "yarn":
            d.update(
                beta_fast=self.beta_fast,
                beta_slow=self.beta_slow,
                original_max_position_embeddings=self.original_max_position_embeddings,
            )
        return d


@dataclass(frozen=True)
class ModelConfig:
    """Decoder-only transformer of the Llama family (Llama, Qwen2, Qwen3)."""

    architecture: str  # "llama" | "qwen2" | "qwen3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm on q and k before rotary (Qwen3)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {self.architecture!r}; nanograph supports "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )

    @staticmethod
    def from_hf_dict(d: dict[str, Any]) -> ModelConfig:
        """Build from a Hugging Face ``config.json`` dictionary (old or transformers-5 keys)."""
        rope = d.get("rope_parameters")
        if isinstance(rope, dict):
            # transformers >= 5 writes theta and scaling as one ``rope_parameters`` dict
            d = dict(d)
            d.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
            if rope.get("rope_type", "default") != "default":
                d.setdefault("rope_scaling", {k: v for k, v in rope.items() if k != "rope_theta"})
        model_type = d.get("model_type", "llama")
        arch = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}.get(model_type)
        if arch is None:
            raise ValueError(
                f"unsupported model_type {model_type!r} in config.json; nanograph supports "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        heads = int(d["num_attention_heads"])
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return ModelConfig(
            architecture=arch,
            vocab_size=int(d["vocab_size"]),
            hidden_size=int(d["hidden_size"]),
            intermediate_size=int(d["intermediate_size"]),
            num_hidden_layers=int(d["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or d["hidden_size"] // heads),
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(d.get("rope_theta", 10000.0)),
            rope_scaling=RopeScaling.from_hf(d.get("rope_scaling")),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d.get("attention_bias", arch == "qwen2")),
            qk_norm=arch == "qwen3",
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """A ``config.json`` dictionary transformers accepts (for reference checks)."""
        model_type = self.architecture
        d: dict[str, Any] = {
            "model_type": model_type,
            "architectures": [
                {
                    "llama": "LlamaForCausalLM",
                    "qwen2": "Qwen2ForCausalLM",
                    "qwen3": "Qwen3ForCausalLM",
                }[model_type]
            ],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling.to_hf(),
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
        }
        if model_type == "llama":
            d["attention_bias"] = self.attention_bias
            d["mlp_bias"] = False
        if self.bos_token_id is not None:
            d["bos_token_id"] = self.bos_token_id
        if self.eos_token_ids:
            d["eos_token_id"] = list(self.eos_token_ids)
        return d

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    @property
    def num_params(self) -> int:
        """Parameter count (for roofline figures and the start-up summary)."""
        h, i, layers = self.hidden_size, self.intermediate_size, self.num_hidden_layers
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        per_layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h
        if self.attention_bias:
            per_layer += q + 2 * kv
        if self.qk_norm:
            per_layer += 2 * self.head_dim
        emb = self.vocab_size * h
        return layers * per_layer + emb * (1 if self.tie_word_embeddings else 2) + h
