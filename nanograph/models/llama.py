"""Decoder-only transformer: the Llama family (Llama 2/3.x, SmolLM2, Qwen2, Qwen3) and the
mixture-of-experts models Qwen3-MoE and gpt-oss (``models.moe``), which differ from it only in
their MLP and in attention options (sinks, sliding windows, output bias).

Invariants:
- Parameter names follow Hugging Face's except for packed tensors (``qkv_proj`` holds q/k/v,
  ``gate_up_proj`` holds gate/up, for one GEMM each; a MoE layer holds every expert in
  ``w13``/``w2``); ``hf_weight_target`` maps a Hugging Face name to (parameter, index into it),
  so loaders stream HF/GGUF tensors straight in.
- ``forward`` sees only tokens and positions: the same code runs eagerly,
  in any graph backend, and on CPU or GPU. It never asks which graph backend is active.
- The model holds no KV cache and no attention backend: the ``attention`` split op reads them
  from the forward context the runner sets, so one module serves every execution path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from nanograph.attention.op import attention
from nanograph.distributed.collectives import all_reduce, gather_vocab
from nanograph.distributed.group import TensorParallel
from nanograph.distributed.sharding import shard_config, shard_tensor
from nanograph.layers import ops
from nanograph.layers.parallel import VocabParallelEmbedding
from nanograph.layers.rotary import build_cos_sin_cache
from nanograph.models.config import ModelConfig
from nanograph.models.moe import MoE, MoEBackend

if TYPE_CHECKING:  # kernels.rows needs Triton, an optional extra
    from nanograph.kernels.rows import NormedRows


class Linear(nn.Linear):
    """``nn.Linear`` whose product goes through ``ops.linear`` (cuBLAS or the decode GEMV)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return ops.rmsnorm(x, self.weight, self.eps)
        return ops.add_rmsnorm(x, residual, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.tp = tp
        self.layer = layer
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        self.eps = config.rms_norm_eps
        self.qkv_proj = Linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.attention_bias
        )
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=config.o_proj_bias)
        self.sliding_window = config.layer_sliding_window(layer)
        self.sinks = nn.Parameter(torch.empty(self.num_heads)) if config.attention_sinks else None
        if config.qk_norm:
            self.q_norm = nn.Parameter(torch.ones(self.head_dim))
            self.k_norm = nn.Parameter(torch.ones(self.head_dim))
        else:
            self.q_norm = self.k_norm = None

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        cos_sin_cache: torch.Tensor,
    ) -> torch.Tensor:
        out = self.attend(positions, self.qkv_proj(hidden), cos_sin_cache)
        return all_reduce(self.o_proj(out), self.tp)

    def attend(
        self, positions: torch.Tensor, qkv: torch.Tensor, cos_sin_cache: torch.Tensor,
        out: torch.Tensor | None = None, one_row: bool = False,
    ) -> torch.Tensor:  # fmt: skip
        """Packed q/k/v [N, q + 2 kv] -> attention output [N, q] (before the o projection);
        ``out`` [N, heads, head_dim] and ``one_row`` as ``op.attention`` takes them."""
        n = qkv.shape[0]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(n, self.num_heads, self.head_dim)
        k = k.reshape(n, self.num_kv_heads, self.head_dim)
        v = v.reshape(n, self.num_kv_heads, self.head_dim)
        out = attention(
            q, k, v, positions, cos_sin_cache, self.q_norm, self.k_norm, self.layer, self.scale,
            self.eps, self.sliding_window, self.sinks, out, one_row,
        )  # fmt: skip
        return out.reshape(n, self.q_size)


class MLP(nn.Module):
    def __init__(
        self, hidden_size: int, intermediate_size: int, tp: TensorParallel | None = None
    ) -> None:
        super().__init__()
        self.tp = tp
        self.gate_up_proj = Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = ops.mlp(x, self.gate_up_proj.weight, self.down_proj.weight)
        return all_reduce(out, self.tp)


class DecoderLayer(nn.Module):
    def __init__(
        self, config: ModelConfig, layer: int, moe_backend: MoEBackend | None,
        tp: TensorParallel | None,
    ) -> None:  # fmt: skip
        super().__init__()
        self.self_attn = Attention(config, layer, tp)
        self.mlp = (
            MoE(config, moe_backend, tp) if moe_backend is not None
            else MLP(config.hidden_size, config.intermediate_size, tp)
        )  # fmt: skip
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # one-row decode through fused GEMVs (norm prologue, bias and residual epilogue): no
        # all-reduce between a product and its residual add; a MoE layer only with experts
        # that add into the stream themselves (triton)
        self.fusable = tp is None and (moe_backend is None or self.mlp.adds_into_stream)
        # few rows: dense MLPs, no projection biases (the few-row products take none)
        self.rows_fusable = (
            self.fusable and moe_backend is None
            and not config.attention_bias and not config.o_proj_bias
        )  # fmt: skip

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        cos_sin_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``residual`` None: ``hidden`` is the whole residual stream (the first layer, or after
        a fused layer, which returns the updated stream and None); otherwise the stream is
        ``hidden + residual``."""
        moe = isinstance(self.mlp, MoE)
        if residual is None and self.fusable and ops.fused_decode_applies(hidden, moe=moe):
            return self._forward_fused(positions, hidden, cos_sin_cache), None
        if residual is None:
            residual = hidden.clone()  # the fused add+norm updates the residual in place
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, cos_sin_cache)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual

    def _forward_fused(
        self, positions: torch.Tensor, stream: torch.Tensor, cos_sin_cache: torch.Tensor
    ) -> torch.Tensor:
        """Four GEMVs around attention, updating the one-row ``stream`` in place: q/k/v and
        gate/up normalise it on load (gate/up writes only the activation), o and down add their
        product to it (q/k/v and o with their biases, where the model has them). Five kernels
        with Triton attention (which rotates q and stores the new k/v itself), six with rope +
        KV store on their own. A MoE layer normalises once for the router (in its GEMV, which
        writes the normalised row) and the experts, whose down projection adds into the stream:
        seven kernels (router, routing, gate/up, down after the attention half) instead of
        eleven."""
        attn, mlp = self.self_attn, self.mlp
        pre, post = self.input_layernorm, self.post_attention_layernorm
        qkv = ops.norm_linear(stream, pre.weight, pre.eps, attn.qkv_proj.weight,
                              bias=attn.qkv_proj.bias)  # fmt: skip
        # the one row is a live token, which attention writes: no zero fill (a kernel) first
        out = stream.new_empty(1, attn.num_heads, attn.head_dim)
        attended = attn.attend(positions, qkv, cos_sin_cache, out, one_row=True)
        ops.linear_add(attended, attn.o_proj.weight, stream, bias=attn.o_proj.bias)
        if isinstance(mlp, MoE):
            return mlp.forward_add(stream, post.weight, post.eps)
        act = ops.norm_linear(
            stream, post.weight, post.eps, mlp.gate_up_proj.weight, silu_and_mul=True
        )
        return ops.linear_add(act, mlp.down_proj.weight, stream)

    def forward_fused_rows(
        self, positions: torch.Tensor, stream: torch.Tensor, normed: NormedRows | None,
        next_norm: tuple[torch.Tensor, float] | None, cos_sin_cache: torch.Tensor,
    ) -> NormedRows | None:  # fmt: skip
        """The layer over 2 to ``FEW_ROWS`` rows of the residual stream, updated in place:
        ``normed`` is the stream made ready for the input norm by the layer before (None in
        the first layer: its norm runs on its own); q/k/v and gate/up take their norms in, o
        and down add into the stream and make it ready for the post-attention norm and
        ``next_norm`` (returned: the next layer's ``normed``; None after the last layer,
        whose final norm runs on its own)."""
        attn, mlp = self.self_attn, self.mlp
        pre, post = self.input_layernorm, self.post_attention_layernorm
        if normed is None:
            qkv = attn.qkv_proj(pre(stream))
        else:
            qkv = ops.norm_rows_linear(normed, attn.qkv_proj.weight)
        attended = attn.attend(positions, qkv, cos_sin_cache)
        post_normed = ops.rows_linear_add(attended, attn.o_proj.weight, stream,
                                          (post.weight, post.eps))  # fmt: skip
        act = ops.norm_rows_linear(post_normed, mlp.gate_up_proj.weight, silu_and_mul=True)
        return ops.rows_linear_add(act, mlp.down_proj.weight, stream, next_norm)


class Backbone(nn.Module):
    def __init__(
        self, config: ModelConfig, moe_backend: MoEBackend | None, tp: TensorParallel | None
    ) -> None:
        super().__init__()
        self.embed_tokens = (
            VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp)
            if tp is not None and tp.enabled
            else nn.Embedding(config.vocab_size, config.hidden_size)
        )
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, moe_backend, tp) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    """Causal LM over a paged KV cache. A MoE config needs ``moe_backend`` (the experts'
    implementation, ``models.moe.get_moe_backend``); a dense one takes none.

    With a ``tp`` of size N > 1 it is one rank's shard (``distributed.sharding``): ``config``
    is that rank's (heads, KV heads, MLP widths divided; ``full_config`` is the model's), the
    embedding and LM head hold a vocabulary shard, and attention, MLP and MoE outputs are
    all-reduced over the ranks."""

    def __init__(
        self,
        config: ModelConfig,
        moe_backend: MoEBackend | None = None,
        tp: TensorParallel | None = None,
    ) -> None:
        super().__init__()
        if config.is_moe != (moe_backend is not None):
            raise ValueError(
                "a MoE model needs a moe_backend and a dense model takes none "
                f"({config.architecture}, num_experts={config.num_experts})"
            )
        self.tp = tp if tp is not None and tp.enabled else None
        self.full_config = config
        self.config = config = shard_config(config, tp.size if self.tp else 1)
        self.moe_backend = moe_backend
        self.model = Backbone(config, moe_backend, self.tp)
        # forwards of 2 to FEW_ROWS rows may take the fused few-row layer (ops.fused_rows_applies)
        self.rows_fusable = all(layer.rows_fusable for layer in self.model.layers)
        head_rows = self.model.embed_tokens.num_embeddings  # the vocabulary, or this rank's rows
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else Linear(config.hidden_size, head_rows, bias=False)
        )
        # filled by ``build_rotary`` once the model is materialised on its device
        self.register_buffer("cos_sin_cache", torch.empty(0), persistent=False)

    def build_rotary(self) -> None:
        cfg = self.config
        self.cos_sin_cache = build_cos_sin_cache(
            cfg.head_dim,
            cfg.max_position_embeddings,
            cfg.rope_theta,
            cfg.rope_scaling,
            self.model.norm.weight.device,
        )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Returns final hidden states [N, hidden] (normed); see ``compute_logits``."""
        hidden = self.model.embed_tokens(input_ids)
        layers = self.model.layers
        if self.rows_fusable and ops.fused_rows_applies(hidden):
            normed = None
            for i, layer in enumerate(layers):
                following = layers[i + 1].input_layernorm if i + 1 < len(layers) else None
                normed = layer.forward_fused_rows(
                    positions, hidden, normed,
                    None if following is None else (following.weight, following.eps),
                    self.cos_sin_cache,
                )  # fmt: skip
            return self.model.norm(hidden)
        residual = None
        for layer in self.model.layers:
            hidden, residual = layer(positions, hidden, residual, self.cos_sin_cache)
        if residual is None:  # the fused decode path: hidden is the whole stream
            return self.model.norm(hidden)
        hidden, _ = self.model.norm(hidden, residual)
        return hidden

    def warmup_token_counts(self, max_tokens: int) -> list[int]:
        """Token counts (up to ``max_tokens``) of forwards that together compile every variant
        of the kernels that pick their launch configuration from the token count alone: the
        MoE backend's experts ([] for a dense model). Start-up's warm-up runs one of each."""
        if self.moe_backend is None:
            return []
        dtype = self.model.embed_tokens.weight.dtype
        return sorted({
            t for layer in self.model.layers
            for t in self.moe_backend.warmup_token_counts(layer.mlp, dtype, max_tokens)
        })  # fmt: skip

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return gather_vocab(ops.logits(hidden, weight), self.tp, self.config.vocab_size)

    def hf_weight_shard(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's part of the full checkpoint tensor ``name`` (all of it with one rank)."""
        if self.tp is None:
            return tensor
        return shard_tensor(name, tensor, self.full_config, self.tp.rank, self.tp.size)

    def hf_weight_target(self, name: str) -> tuple[nn.Parameter, WeightIndex]:
        """Maps a Hugging Face tensor name to (our parameter, the part it fills: an index into
        the parameter, or a ``Transposed`` view of that part; None for all of it)."""
        cfg = self.config
        q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        i = cfg.intermediate_size
        packed = {
            "self_attn.q_proj": ("self_attn.qkv_proj", slice(0, q)),
            "self_attn.k_proj": ("self_attn.qkv_proj", slice(q, q + kv)),
            "self_attn.v_proj": ("self_attn.qkv_proj", slice(q + kv, q + 2 * kv)),
            "mlp.gate_proj": ("mlp.gate_up_proj", slice(0, i)),
            "mlp.up_proj": ("mlp.gate_up_proj", slice(i, 2 * i)),
        }
        index: WeightIndex = None
        for hf, (ours, sl) in packed.items():
            if f".{hf}." in name:
                name, index = name.replace(f".{hf}.", f".{ours}."), sl
                break
        if cfg.is_moe:
            name, index = self._moe_target(name, index)
        name = name.replace("self_attn.q_norm.weight", "self_attn.q_norm").replace(
            "self_attn.k_norm.weight", "self_attn.k_norm"
        )
        params = self._parameters_by_name()
        if name not in params:
            raise KeyError(name)
        return params[name], index

    def _moe_target(self, name: str, index: WeightIndex) -> tuple[str, WeightIndex]:
        """Qwen3-MoE: ``mlp.experts.{e}.{gate,up,down}_proj.weight`` (one tensor per expert, as
        checkpoints store them; transformers 5 holds ``mlp.experts.{gate_up,down}_proj``, our
        layout), router ``mlp.gate``. gpt-oss: ``mlp.experts.{gate_up_proj,down_proj}[_bias]`` (all
        experts, ``[E, in, out]``: our weights transposed), router ``mlp.router``; with
        ``mxfp4_experts``, the checkpoint's ``_blocks`` go into ``w13`` / ``w2`` as they are and
        ``{gate_up,down}_proj_scales`` into ``w13_scales`` / ``w2_scales``."""
        parts = name.split(".")
        if parts[3:5] != ["mlp", "experts"]:
            return name.replace(".mlp.gate.", ".mlp.router."), index
        prefix = ".".join(parts[:4])
        if self.config.architecture == "gpt_oss":
            # MXFP4 experts keep the checkpoint's packed pairs in our layout: no transpose
            dense = None if self.config.mxfp4_experts else Transposed()
            ours = {
                "gate_up_proj": ("w13", dense),
                "down_proj": ("w2", dense),
                "gate_up_proj_bias": ("w13_bias", None),
                "down_proj_bias": ("w2_bias", None),
                "gate_up_proj_scales": ("w13_scales", None),
                "down_proj_scales": ("w2_scales", None),
            }.get(parts[5])
            if ours is None:
                return name, index
            return f"{prefix}.{ours[0]}", ours[1]
        if parts[5] in ("gate_up_proj", "down_proj"):  # transformers 5 in memory: all experts
            return f"{prefix}.{'w13' if parts[5] == 'gate_up_proj' else 'w2'}", index
        inter = self.config.expert_intermediate_size
        rows = {"gate_proj": slice(0, inter), "up_proj": slice(inter, 2 * inter)}
        if len(parts) != 8 or not parts[5].isdigit() or parts[6] not in (*rows, "down_proj"):
            return name, index  # no such parameter: the loader reports the name
        param = "w2" if parts[6] == "down_proj" else "w13"
        return f"{prefix}.{param}", (int(parts[5]), rows.get(parts[6], slice(None)))

    def _parameters_by_name(self) -> dict[str, nn.Parameter]:
        # Cached: a checkpoint load resolves every tensor name through it. Rebuilt when the
        # parameters were replaced (``to_empty``, a device move replaces them all at once).
        cached = self.__dict__.get("_param_map")
        embedding = self.model.embed_tokens.weight
        if cached is None or cached["model.embed_tokens.weight"] is not embedding:
            cached = self.__dict__["_param_map"] = dict(self.named_parameters())
        return cached

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Our weights under Hugging Face names (views, no copies)."""
        out = {}
        for name in self.hf_weight_names():
            out[name] = weight_view(*self.hf_weight_target(name))
        return out

    def hf_weight_names(self) -> list[str]:
        """The Hugging Face tensor names this model expects (for missing-weight checks)."""
        cfg = self.config
        names = ["model.embed_tokens.weight", "model.norm.weight"]
        if not cfg.tie_word_embeddings:
            names.append("lm_head.weight")
        for li in range(cfg.num_hidden_layers):
            p = f"model.layers.{li}."
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                names.append(f"{p}self_attn.{proj}.weight")
                if cfg.attention_bias and proj != "o_proj":
                    names.append(f"{p}self_attn.{proj}.bias")
            if cfg.o_proj_bias:
                names.append(f"{p}self_attn.o_proj.bias")
            if cfg.qk_norm:
                names += [f"{p}self_attn.q_norm.weight", f"{p}self_attn.k_norm.weight"]
            if cfg.attention_sinks:
                names.append(f"{p}self_attn.sinks")
            names += self._mlp_weight_names(p)
            names += [f"{p}input_layernorm.weight", f"{p}post_attention_layernorm.weight"]
        return names

    def _mlp_weight_names(self, p: str) -> list[str]:
        cfg = self.config
        if not cfg.is_moe:
            return [f"{p}mlp.{m}.weight" for m in ("gate_proj", "up_proj", "down_proj")]
        if cfg.architecture == "gpt_oss":
            experts = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")
            return [f"{p}mlp.router.weight", f"{p}mlp.router.bias"] + [
                f"{p}mlp.experts.{t}" for t in experts
            ]
        return [f"{p}mlp.gate.weight"] + [
            f"{p}mlp.experts.{e}.{m}.weight"
            for e in range(cfg.num_experts)
            for m in ("gate_proj", "up_proj", "down_proj")
        ]


class Transposed:
    """A Hugging Face tensor that is our parameter with its last two dims swapped."""

    def view(self, param: torch.Tensor) -> torch.Tensor:
        return param.transpose(-1, -2)


# where a Hugging Face tensor goes in its parameter: all of it (None), an index, or transposed
WeightIndex = slice | tuple[int, slice] | Transposed | None


def weight_view(param: torch.Tensor, index: WeightIndex) -> torch.Tensor:
    """The part of ``param`` a Hugging Face tensor fills, shaped like that tensor."""
    if index is None:
        return param
    if isinstance(index, Transposed):
        return index.view(param)
    return param[index]
