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

from nanograph.layers.rotary import RopeScaling

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3_moe", "gpt_oss")
# model_type in config.json -> (architecture, transformers class prefix)
HF_CLASSES = {
    "llama": "Llama",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
    "qwen3_moe": "Qwen3Moe",
    "gpt_oss": "GptOss",
}


@dataclass(frozen=True)
class ModelConfig:
    """Decoder-only transformer: the Llama family (Llama, Qwen2, Qwen3) and the mixture-of-experts
    models Qwen3-MoE and gpt-oss (``num_experts > 0``: every layer's MLP is a MoE layer)."""

    architecture: str  # one of SUPPORTED_ARCHITECTURES
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # dense MLP width; gpt-oss: each expert's width
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2, gpt-oss)
    o_proj_bias: bool = False  # the output projection carries a bias (gpt-oss)
    qk_norm: bool = False  # per-head RMSNorm on q and k before rotary (Qwen3, Qwen3-MoE)
    attention_sinks: bool = False  # one learned logit per q head in the softmax (gpt-oss)
    sliding_window: int = 0  # window of the layers marked "sliding_attention" in layer_types
    layer_types: tuple[str, ...] = ()  # per layer: "full_attention" | "sliding_attention"
    # mixture of experts (0 experts: dense MLP)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0  # each expert's width
    norm_topk_prob: bool = True  # Qwen3-MoE: renormalise the top-k probabilities to sum to 1
    swiglu_limit: float = 7.0  # gpt-oss' clamped SwiGLU
    swiglu_alpha: float = 1.702
    # the experts' weights stay MXFP4 in memory (gpt-oss; ``--quantization mxfp4``): packed
    # codes and scales, decoded by the fused MoE kernels; False: the model's dtype
    mxfp4_experts: bool = False
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
        if self.is_moe and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok ({self.num_experts_per_tok}) must be in 1..num_experts "
                f"({self.num_experts})"
            )
        if self.layer_types and len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(
                f"layer_types lists {len(self.layer_types)} layers, the model has "
                f"{self.num_hidden_layers}"
            )
        unknown = set(self.layer_types) - {"full_attention", "sliding_attention"}
        if unknown:
            raise ValueError(f"unsupported layer types {sorted(unknown)}")
        if self.mxfp4_experts:
            if self.architecture != "gpt_oss":
                raise ValueError(
                    f"MXFP4 experts are gpt-oss' format; {self.architecture} runs unquantized "
                    "(drop --quantization mxfp4)"
                )
            sizes = (self.hidden_size, self.expert_intermediate_size)
            if any(n % 32 for n in sizes):
                raise ValueError(
                    "MXFP4 experts need a hidden size and an expert width (on each tensor-"
                    "parallel rank) that are multiples of 32 (one scale per 32 values), got "
                    f"{sizes}"
                )

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def moe_activation(self) -> str:
        """``silu`` (SwiGLU) or ``clamped_swiglu`` (gpt-oss: interleaved gate/up, biases)."""
        return "clamped_swiglu" if self.architecture == "gpt_oss" else "silu"

    def layer_sliding_window(self, layer: int) -> int:
        """Window of ``layer``'s attention (0: full causal attention)."""
        if self.layer_types and self.layer_types[layer] == "sliding_attention":
            return self.sliding_window
        return 0

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
        if model_type not in HF_CLASSES:
            raise ValueError(
                f"unsupported model_type {model_type!r} in config.json; nanograph supports "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        arch = model_type
        quant = (d.get("quantization_config") or {}).get("quant_method")
        # the released gpt-oss checkpoints: MXFP4 experts, dequantized as they load
        if quant and (quant, arch) != ("mxfp4", "gpt_oss"):
            raise ValueError(
                f"quantized checkpoints ({quant}) are not supported (only gpt-oss' MXFP4 experts, "
                "which load dequantized): use an unquantized (bf16/fp32) checkpoint, or "
                "--load-format dummy for random weights"
            )
        heads = int(d["num_attention_heads"])
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        moe: dict[str, Any] = {}
        if arch == "qwen3_moe":
            if d.get("mlp_only_layers") or int(d.get("decoder_sparse_step", 1)) != 1:
                raise ValueError(
                    "Qwen3-MoE with dense layers (mlp_only_layers, decoder_sparse_step > 1) is "
                    "not supported: every layer must be a MoE layer"
                )
            moe = dict(
                num_experts=int(d.get("num_experts") or d["num_local_experts"]),
                moe_intermediate_size=int(d["moe_intermediate_size"]),
                norm_topk_prob=bool(d.get("norm_topk_prob", False)),
            )
        if arch == "gpt_oss":
            moe = dict(
                num_experts=int(d["num_local_experts"]),
                swiglu_limit=float(d.get("swiglu_limit", 7.0)),
                swiglu_alpha=float(d.get("swiglu_alpha", 1.702)),
            )
        if moe:
            moe["num_experts_per_tok"] = int(d.get("num_experts_per_tok") or d["experts_per_token"])
        layer_types = tuple(d.get("layer_types") or ())
        if "sliding_attention" in layer_types and not d.get("sliding_window"):
            raise ValueError("layer_types has sliding_attention layers but no sliding_window")
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
            attention_bias=bool(d.get("attention_bias", arch in ("qwen2", "gpt_oss"))),
            o_proj_bias=arch == "gpt_oss" and bool(d.get("attention_bias", True)),
            qk_norm=arch in ("qwen3", "qwen3_moe"),
            attention_sinks=arch == "gpt_oss",
            sliding_window=int(d.get("sliding_window") or 0) if layer_types else 0,
            layer_types=layer_types,
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            **moe,
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """A ``config.json`` dictionary transformers accepts (for reference checks)."""
        model_type = self.architecture
        d: dict[str, Any] = {
            "model_type": model_type,
            "architectures": [f"{HF_CLASSES[model_type]}ForCausalLM"],
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
        if model_type == "qwen3_moe":
            d.update(
                num_experts=self.num_experts,
                num_experts_per_tok=self.num_experts_per_tok,
                moe_intermediate_size=self.moe_intermediate_size,
                norm_topk_prob=self.norm_topk_prob,
                decoder_sparse_step=1,
                mlp_only_layers=[],
            )
        if model_type == "gpt_oss":
            d.update(
                num_local_experts=self.num_experts,
                num_experts_per_tok=self.num_experts_per_tok,
                swiglu_limit=self.swiglu_limit,
                swiglu_alpha=self.swiglu_alpha,
                attention_bias=self.attention_bias,
                sliding_window=self.sliding_window,
                layer_types=list(self.layer_types),
            )
            # transformers' gpt-oss reads rope settings only from rope_parameters
            d["rope_parameters"] = {"rope_theta": self.rope_theta, **(d.pop("rope_scaling") or {})}
            d["rope_parameters"].setdefault("rope_type", "default")
            del d["rope_theta"]
        if self.bos_token_id is not None:
            d["bos_token_id"] = self.bos_token_id
        if self.eos_token_ids:
            d["eos_token_id"] = list(self.eos_token_ids)
        return d

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def _attention_params(self) -> int:
        h = self.hidden_size
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        n = h * (q + 2 * kv) + q * h + 2 * h
        if self.attention_bias:
            n += q + 2 * kv
        if self.o_proj_bias:
            n += h
        if self.qk_norm:
            n += 2 * self.head_dim
        if self.attention_sinks:
            n += self.num_attention_heads
        return n

    def _expert_params(self) -> int:
        h, i = self.hidden_size, self.expert_intermediate_size
        biases = 2 * i + h if self.moe_activation == "clamped_swiglu" else 0
        return 3 * h * i + biases

    def _mlp_params(self, experts: int) -> int:
        """One layer's MLP: a dense one, or a MoE's router and ``experts`` of its experts."""
        if self.is_moe:
            return experts * self._expert_params() + self._router_params()
        return 3 * self.hidden_size * self.intermediate_size

    def _router_params(self) -> int:
        return self.num_experts * (self.hidden_size + (self.architecture == "gpt_oss"))

    @property
    def num_params(self) -> int:
        """Parameter count (for roofline figures and the start-up summary)."""
        h, layers = self.hidden_size, self.num_hidden_layers
        mlp = self._mlp_params(self.num_experts)
        emb = self.vocab_size * h
        return (
            layers * (self._attention_params() + mlp)
            + emb * (1 if self.tie_word_embeddings else 2)
            + h
        )

    def active_weights_bytes(self, itemsize: int) -> float:
        """Bytes one decoded token reads: ``num_active_params`` at ``itemsize`` bytes, except
        MXFP4 experts' matrices at 17/32 of a byte a weight (a 4-bit code, a byte of scale per
        32)."""
        total = self.num_active_params * itemsize
        if self.mxfp4_experts:
            h, i = self.hidden_size, self.expert_intermediate_size
            matrices = self.num_hidden_layers * self.num_experts_per_tok * 3 * h * i
            total -= matrices * (itemsize - 17 / 32)
        return total

    @property
    def num_active_params(self) -> int:
        """Parameters one decoded token reads: attention and the MLP (a MoE's router and top-k
        experts) of each layer, one embedding row, the final norm and the LM head (the decode
        roofline's bytes / dtype size). An untied input embedding is read one row a token, so
        its table is not counted."""
        h, layers = self.hidden_size, self.num_hidden_layers
        mlp = self._mlp_params(self.num_experts_per_tok)
        return layers * (self._attention_params() + mlp) + h + h + self.vocab_size * h
