"""GGUF files: a ``ModelConfig`` from the metadata and Hugging Face-named, dequantised tensors.

Invariants:
- Tensors leave this module with Hugging Face names and layouts, so every consumer treats GGUF
  and safetensors alike: a layer's stacked experts leave as the architecture's checkpoints
  hold them (Qwen3-MoE one expert at a time; gpt-oss with gate and up interleaved again).
  llama.cpp's q/k row interleave (applied by ``convert_hf_to_gguf`` to the ``llama``
  architecture only, not qwen2/qwen3) is undone here and nowhere else.
- ``gguf`` is imported inside functions: ``import nanograph`` works without it.
- Tensors stream one at a time; a quantised tensor exists in float32 only while it is yielded
  (gpt-oss' separate gate and up stacks of a layer: until the second is read). gpt-oss' MXFP4
  expert stacks are not dequantised here: they leave as ``Mxfp4Tensor`` pairs in the released
  safetensors' layout (their nibbles reordered), which ``load_weights`` dequantises on the
  device or keeps packed (``--quantization mxfp4``).
- One ``GGUFReader`` per file is kept (parsing the metadata of a 49k-token vocabulary takes
  seconds), so reading the config and then the weights parses the file once.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from nanograph.loader.errors import ModelLoadError
from nanograph.loader.mxfp4 import Mxfp4Tensor
from nanograph.models.config import ModelConfig, RopeScaling

if TYPE_CHECKING:
    from gguf import GGUFReader, ReaderTensor

# general.architecture -> ours
GGUF_ARCHITECTURES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3moe": "qwen3_moe",
    "gpt-oss": "gpt_oss",
}
GGUF_MAGIC = b"GGUF"

# GGUF's standard tensor names (ggml docs/gguf.md) -> Hugging Face module names.
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# gpt-oss only (other architectures' post_attention_norm is another norm)
_GPT_OSS_NAMES = {
    "post_attention_norm": "post_attention_layernorm",
    "attn_sinks": "self_attn.sinks",  # a parameter of its own: no .weight in HF names
}
_ROUTER = {"qwen3_moe": "mlp.gate", "gpt_oss": "mlp.router"}
# all experts of a layer in one tensor [E, rows, cols] (gate_up: gate rows, then up rows);
# _experts turns them into the tensors the architecture's Hugging Face checkpoints hold
_EXPERT_NAMES = {
    "ffn_gate_exps": "gate_proj",
    "ffn_up_exps": "up_proj",
    "ffn_gate_up_exps": "gate_up_proj",
    "ffn_down_exps": "down_proj",
}
# Llama 3 defaults (the values of every released Llama 3.x config); see _llama3_from_rope_freqs.
_LLAMA3_LOW_FREQ_FACTOR, _LLAMA3_HIGH_FREQ_FACTOR, _LLAMA3_ORIGINAL_CONTEXT = 1.0, 4.0, 8192


def is_gguf_file(path: str | os.PathLike[str]) -> bool:
    """True for an existing file that starts with the GGUF magic bytes."""
    p = Path(path)
    if not p.is_file():
        return False
    with p.open("rb") as f:
        return f.read(4) == GGUF_MAGIC


@functools.lru_cache(maxsize=2)
def _open_reader(resolved: str, mtime_ns: int) -> GGUFReader:
    from gguf import GGUFReader

    class PlainBufferReader(GGUFReader):
        """Parses over a plain ndarray view of the file's memmap: every slice of a memmap is a
        new memmap object (``__array_finalize__``), and the reader slices once per vocabulary
        entry. SmolLM2's 49k-token metadata: 2.2 s -> 0.6 s on the dev CPU."""

        @property
        def data(self) -> np.ndarray:
            return self._buffer

        @data.setter
        def data(self, value: np.ndarray) -> None:
            self._buffer = value.view(np.ndarray)  # the view keeps the memmap (and file) open

    del mtime_ns  # part of the cache key only: a rewritten file is parsed again
    return PlainBufferReader(resolved, "r")


def open_gguf(path: str | os.PathLike[str]) -> GGUFReader:
    """The (cached) ``gguf.GGUFReader`` of ``path``; a bad file is a ``ModelLoadError``."""
    p = Path(path).resolve()
    if not is_gguf_file(p):
        raise ModelLoadError(f"{path} is not a GGUF file (missing or no GGUF magic bytes)")
    try:
        return _open_reader(str(p), p.stat().st_mtime_ns)
    except (ValueError, OSError) as e:
        raise ModelLoadError(f"{path} is not a readable GGUF file: {e}") from e


def _field(reader: GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _float32_decimal(x: float) -> float:
    # GGUF stores float32: 1e-5 comes back as 9.99999974e-06. The shortest float32 decimal is
    # the value the original config.json had.
    return float(str(np.float32(x)))


def read_gguf_config(path: str | os.PathLike[str]) -> ModelConfig:
    """The ``ModelConfig`` described by a GGUF file's metadata (and tensor list)."""
    reader = open_gguf(path)
    arch = _field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ModelLoadError(
            f"{path}: GGUF architecture {arch!r} is not supported; nanograph loads "
            f"{', '.join(GGUF_ARCHITECTURES)}"
        )

    def meta(key: str, default: Any = ModelLoadError) -> Any:
        value = _field(reader, f"{arch}.{key}", default)
        if value is ModelLoadError:
            raise ModelLoadError(
                f"{path}: GGUF metadata lacks {arch}.{key}; the file is incomplete"
            )
        return value

    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise ModelLoadError(f"{path}: GGUF has no token_embd.weight tensor")
    hidden, heads = int(meta("embedding_length")), int(meta("attention.head_count"))
    head_dim = int(meta("attention.key_length", hidden // heads))
    rope_theta = _float32_decimal(meta("rope.freq_base", 10000.0))
    max_positions = int(meta("context_length"))
    rope_scaling = _rope_scaling(reader, arch, tensors, head_dim, rope_theta, max_positions, path)

    eos_ids: list[int] = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        token = _field(reader, f"tokenizer.ggml.{key}")
        if token is not None and int(token) not in eos_ids:
            eos_ids.append(int(token))
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    extra: dict[str, Any] = {}  # the MoE architectures' fields
    if arch in ("qwen3moe", "gpt-oss"):
        extra = dict(num_experts=int(meta("expert_count")),
                   num_experts_per_tok=int(meta("expert_used_count")))  # fmt: skip
    if arch == "qwen3moe":
        extra["moe_intermediate_size"] = int(meta("expert_feed_forward_length"))
        # llama.cpp's qwen3moe always renormalises the top-k weights (norm_topk_prob)
        extra["norm_topk_prob"] = bool(meta("expert_weights_norm", True))
    if arch == "gpt-oss":
        # llama.cpp's gpt-oss: sliding-window attention on even layers; its YaRN is the
        # released config's (no rounding of the correction range: truncate false)
        layers = int(meta("block_count"))
        extra |= dict(
            sliding_window=int(meta("attention.sliding_window")),
            layer_types=tuple(
                ("sliding_attention", "full_attention")[i % 2] for i in range(layers)
            ),
            o_proj_bias="blk.0.attn_output.bias" in tensors,
            attention_sinks="blk.0.attn_sinks.weight" in tensors,
        )
        rope_scaling = dataclasses.replace(rope_scaling, truncate=False)
    return ModelConfig(
        architecture=GGUF_ARCHITECTURES[arch],
        # the embedding's rows, not the tokenizer's list: the weights are what the model needs
        vocab_size=int(tensors["token_embd.weight"].shape[1]),
        hidden_size=hidden,
        intermediate_size=int(meta("feed_forward_length")),
        num_hidden_layers=int(meta("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(meta("attention.head_count_kv", heads)),
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        rms_norm_eps=_float32_decimal(meta("attention.layer_norm_rms_epsilon")),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        # llama.cpp drops output.weight when the head is tied to the embedding
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=tuple(eos_ids),
        **extra,
    )


def _rope_scaling(
    reader: GGUFReader,
    arch: str,
    tensors: dict[str, ReaderTensor],
    head_dim: int,
    theta: float,
    max_positions: int,
    path: str | os.PathLike[str],
) -> RopeScaling:
    kind = _field(reader, f"{arch}.rope.scaling.type", "none")
    factor = float(_field(reader, f"{arch}.rope.scaling.factor", 1.0))
    original = int(_field(reader, f"{arch}.rope.scaling.original_context_length", max_positions))
    if "rope_freqs.weight" in tensors:
        # Llama 3.1+ GGUFs carry no scaling metadata, only the per-frequency divisors.
        factors = np.asarray(tensors["rope_freqs.weight"].data, dtype=np.float64).reshape(-1)
        return _llama3_from_rope_freqs(factors, head_dim, theta, path)
    if kind == "none":
        return RopeScaling()
    if kind == "linear":
        return RopeScaling(kind="linear", factor=factor)
    if kind == "yarn":
        return RopeScaling(
            kind="yarn",
            factor=factor,
            original_max_position_embeddings=original,
            beta_fast=float(_field(reader, f"{arch}.rope.scaling.yarn_beta_fast", 32.0)),
            beta_slow=float(_field(reader, f"{arch}.rope.scaling.yarn_beta_slow", 1.0)),
        )
    raise ModelLoadError(
        f"{path}: rope scaling type {kind!r} is not supported (supported: none, linear, yarn, "
        "and llama3 via rope_freqs.weight)"
    )


def llama3_rope_factors(head_dim: int, theta: float, scaling: RopeScaling) -> np.ndarray:
    """The per-frequency divisors llama.cpp's converter writes as ``rope_freqs.weight``."""
    inv_freq = theta ** -(np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    original = scaling.original_max_position_embeddings
    smooth = np.clip((original / wavelen - low) / (high - low), 0.0, 1.0)
    return 1.0 / ((1.0 - smooth) / scaling.factor + smooth)


def _llama3_from_rope_freqs(
    factors: np.ndarray, head_dim: int, theta: float, path: str | os.PathLike[str]
) -> RopeScaling:
    """Recovers llama3 rope scaling from ``rope_freqs.weight``: ``factor`` is the largest divisor;
    on the ramp, ``smooth = (1/f - 1/factor) / (1 - 1/factor)`` is linear in ``1/wavelength``,
    which gives the low/high frequency factors. The result is checked against the tensor."""
    factor = float(factors.max())
    if factor <= 1.0 and float(factors.min()) >= 1.0:
        return RopeScaling()
    original = _LLAMA3_ORIGINAL_CONTEXT  # the converter always uses 8192 here
    low, high = _LLAMA3_LOW_FREQ_FACTOR, _LLAMA3_HIGH_FREQ_FACTOR
    ramp = (factors > 1.0 + 1e-6) & (factors < factor - 1e-6)
    if ramp.sum() >= 2:
        inv_freq = theta ** -(np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
        x = original * inv_freq[ramp] / (2 * math.pi)  # original / wavelength
        smooth = (1.0 / factors[ramp] - 1.0 / factor) / (1.0 - 1.0 / factor)
        slope, intercept = np.polyfit(x, smooth, 1)
        low = round(-intercept / slope, 4)
        high = round(low + 1.0 / slope, 4)
    scaling = RopeScaling(
        kind="llama3",
        factor=round(factor, 6),
        low_freq_factor=low,
        high_freq_factor=high,
        original_max_position_embeddings=original,
    )
    expected = llama3_rope_factors(head_dim, theta, scaling)
    if expected.shape != factors.shape or not np.allclose(expected, factors, rtol=1e-3):
        raise ModelLoadError(
            f"{path}: rope_freqs.weight does not follow llama3 rope scaling; this rope variant "
            "is not supported"
        )
    return scaling


def gguf_to_hf_name(name: str, architecture: str = "llama") -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``, and a layer's
    stacked experts ``blk.3.ffn_up_exps.weight`` -> ``model.layers.3.mlp.experts.{}.up_proj.weight``
    (``{}``: where the expert's index goes; ``_experts`` resolves it); None if unknown."""
    stem, _, suffix = name.rpartition(".")
    if stem in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[stem]}.{suffix}"
    parts = stem.split(".")
    if len(parts) != 3 or parts[0] != "blk" or not parts[1].isdigit():
        return None
    layer, kind = f"model.layers.{parts[1]}", parts[2]
    if architecture == "gpt_oss" and kind in _GPT_OSS_NAMES:
        hf = f"{layer}.{_GPT_OSS_NAMES[kind]}"
        return hf if kind == "attn_sinks" else f"{hf}.{suffix}"
    if kind in _BLOCK_NAMES:
        return f"{layer}.{_BLOCK_NAMES[kind]}.{suffix}"
    if kind == "ffn_gate_inp" and architecture in _ROUTER:
        return f"{layer}.{_ROUTER[architecture]}.{suffix}"
    if kind in _EXPERT_NAMES:
        return f"{layer}.mlp.experts.{{}}.{_EXPERT_NAMES[kind]}.{suffix}"
    return None


def _experts(
    name: str, weight: torch.Tensor | Mxfp4Tensor, architecture: str, halves: dict
) -> Iterator[tuple[str, torch.Tensor | Mxfp4Tensor]]:
    """A stacked expert tensor (``name`` from ``gguf_to_hf_name``) as the architecture's
    Hugging Face checkpoints hold it. Qwen3-MoE: one tensor per expert (a fused gate_up: the
    transformers-5 tensor, gate rows then up rows, as it is). gpt-oss: all experts in one
    tensor, ``[E, in, out]``, gate and up interleaved in one ``gate_up_proj`` (its weight and
    its bias); a GGUF's separate gate and up wait in ``halves`` for each other. An MXFP4 stack
    (``[E, out, groups, 16]`` codes: already ``[E, in, out]`` as a dense shape) has its rows
    interleaved the same way, and is not transposed."""
    prefix, rest = name.split(".{}.")
    proj, suffix = rest.split(".")
    if architecture != "gpt_oss":
        if proj == "gate_up_proj":
            yield f"{prefix}.gate_up_proj", weight
        else:
            for expert, rows in enumerate(weight):
                yield f"{prefix}.{expert}.{proj}.{suffix}", rows
        return
    hf = f"{prefix}.{'down_proj' if proj == 'down_proj' else 'gate_up_proj'}"
    hf += "_bias" if suffix == "bias" else ""
    packed = isinstance(weight, Mxfp4Tensor)
    if proj == "down_proj":
        yield hf, weight if suffix == "bias" or packed else weight.transpose(1, 2)
        return
    if proj == "gate_up_proj":
        gate, up = _rows(weight, lambda t: t.chunk(2, dim=1))
    else:
        pair = halves.setdefault(hf, {})
        pair[proj] = weight
        if len(pair) < 2:
            return
        gate, up = halves.pop(hf)["gate_proj"], pair["up_proj"]
    if packed:
        both = Mxfp4Tensor(*(_interleave(g, u) for g, u in zip(
            (gate.blocks, gate.scales), (up.blocks, up.scales), strict=True)))  # fmt: skip
        yield hf, both
        return
    both = _interleave(gate, up)  # rows (or bias entries) interleaved
    yield hf, both if suffix == "bias" else both.transpose(1, 2)


def _interleave(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.stack((gate, up), dim=2).flatten(1, 2)


def _rows(weight: torch.Tensor | Mxfp4Tensor, split) -> tuple:
    """``split`` applied to a stack's rows: of a tensor, or of both halves of an MXFP4 pair."""
    if not isinstance(weight, Mxfp4Tensor):
        return split(weight)
    return tuple(Mxfp4Tensor(b, s) for b, s in zip(split(weight.blocks), split(weight.scales),
                                                     strict=True))  # fmt: skip


def _mxfp4_pair(tensor: ReaderTensor) -> Mxfp4Tensor:
    """An MXFP4 stack's bytes as the safetensors pair: llama.cpp's block of 32 values is a scale
    byte, then 16 bytes holding values 0-15 in their low nibbles and 16-31 in their high ones;
    the released checkpoints hold value 2j in byte j's low nibble, 2j + 1 in its high one.
    The 4-bit codes and the E8M0 scale mean the same in both (llama.cpp stores the E2M1 values
    doubled under a scale halved)."""
    data = np.asarray(tensor.data, dtype=np.uint8)
    blocks = data.reshape(*data.shape[:-1], data.shape[-1] // 17, 17)
    nibbles = blocks[..., 1:]
    codes = np.concatenate((nibbles & 15, nibbles >> 4), axis=-1)  # values 0..31 in order
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return Mxfp4Tensor(torch.from_numpy(np.ascontiguousarray(packed)),
                       torch.from_numpy(np.ascontiguousarray(blocks[..., 0])))  # fmt: skip


def unpermute_qk(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Inverse of ``LlamaModel.permute`` in llama.cpp's ``convert_hf_to_gguf.py``.

    Hugging Face keeps each head's rows as two rotary halves (rotate_half); GGUF interleaves them,
    so GGUF row ``h*d + 2*j + k`` is HF row ``h*d + k*d/2 + j`` (d = head_dim, k in {0, 1}).
    Works for weights [rows, in] and biases [rows].
    """
    head_dim = weight.shape[0] // num_heads
    split = weight.reshape(num_heads, head_dim // 2, 2, *weight.shape[1:])
    return split.transpose(1, 2).reshape(weight.shape).contiguous()


# Quantised tensors past a MiB are dequantised in row chunks of a MiB by a pool of threads
# (numpy releases the GIL in its array operations; quantisation blocks never cross a row). On
# the 2-core development CPU, a [32, 768, 2048] stack: Q8_0 177 -> 470-650 M values/s, Q4_0
# 257 -> ~400, MXFP4 116 -> 170-200 (chunks that fit the caches help beside the threads); one
# thread would take minutes for a 20-30B model.
DEQUANT_CHUNK_BYTES = 1 << 20
DEQUANT_THREADS = 32  # at most


def _dequantize(
    tensor: ReaderTensor, path: str | os.PathLike[str], pool: ThreadPoolExecutor
) -> torch.Tensor:
    from gguf import GGMLQuantizationType, dequantize, quant_shape_from_byte_shape

    qtype = tensor.tensor_type
    # np.array copies out of the read-only memory map (torch warns on non-writable arrays).
    if qtype == GGMLQuantizationType.F32:
        return torch.from_numpy(np.array(tensor.data, dtype=np.float32))
    if qtype == GGMLQuantizationType.F16:
        return torch.from_numpy(np.array(tensor.data, dtype=np.float16))  # no float32 detour
    data = tensor.data
    try:
        if data.nbytes <= DEQUANT_CHUNK_BYTES:
            return torch.from_numpy(np.ascontiguousarray(dequantize(data, qtype)))
        rows = data.reshape(-1, data.shape[-1])
        out = np.empty(quant_shape_from_byte_shape(rows.shape, qtype), np.float32)
        step = max(1, DEQUANT_CHUNK_BYTES // rows.shape[-1])

        def part(lo: int) -> None:
            out[lo : lo + step] = dequantize(rows[lo : lo + step], qtype)

        list(pool.map(part, range(0, len(rows), step)))  # list(): re-raises a task's error
        return torch.from_numpy(out.reshape(*data.shape[:-1], out.shape[-1]))
    except NotImplementedError as e:
        raise ModelLoadError(
            f"{path}: tensor {tensor.name} uses quantisation {qtype.name}, which the gguf "
            "package cannot dequantise; use a GGUF in F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, "
            "Q8_0, MXFP4 or a K-quant (Q2_K..Q6_K)"
        ) from e


def _keeps_mxfp4(tensor: ReaderTensor, hf_name: str, config: ModelConfig) -> bool:
    """A gpt-oss expert weight stack in MXFP4: it leaves as an ``Mxfp4Tensor``."""
    from gguf import GGMLQuantizationType

    return (
        tensor.tensor_type == GGMLQuantizationType.MXFP4
        and config.architecture == "gpt_oss"
        and ".mlp.experts.{}." in hf_name
        and hf_name.endswith(".weight")
    )


def _threads() -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cpus or 1, DEQUANT_THREADS))


def iter_gguf_weights(
    path: str | os.PathLike[str], config: ModelConfig | None = None
) -> Iterator[tuple[str, torch.Tensor | Mxfp4Tensor]]:
    """Yields ``(hf_name, tensor)`` for every weight, in file order. Quantised tensors come out
    float32, F16 ones float16, F32 ones float32, gpt-oss' MXFP4 experts as ``Mxfp4Tensor``
    pairs; the caller converts to its dtype."""
    reader = open_gguf(path)
    config = config or read_gguf_config(path)
    halves: dict[str, dict[str, torch.Tensor]] = {}  # gpt-oss: a gate stack awaiting its up
    with ThreadPoolExecutor(_threads(), thread_name_prefix="gguf-dequantize") as pool:
        for tensor in reader.tensors:
            if tensor.name == "rope_freqs.weight":
                continue  # folded into config.rope_scaling
            hf_name = gguf_to_hf_name(tensor.name, config.architecture)
            if hf_name is None:
                raise ModelLoadError(
                    f"{path}: GGUF tensor {tensor.name!r} has no counterpart in nanograph's "
                    f"{config.architecture} model"
                )
            if _keeps_mxfp4(tensor, hf_name, config):
                yield from _experts(hf_name, _mxfp4_pair(tensor), config.architecture, halves)
                continue
            weight = _dequantize(tensor, path, pool)
            if config.architecture == "llama":
                if ".self_attn.q_proj." in hf_name:
                    weight = unpermute_qk(weight, config.num_attention_heads)
                elif ".self_attn.k_proj." in hf_name:
                    weight = unpermute_qk(weight, config.num_key_value_heads)
            if ".mlp.experts.{}." in hf_name:
                yield from _experts(hf_name, weight, config.architecture, halves)
            else:
                yield hf_name, weight
    if halves:
        raise ModelLoadError(
            f"{path}: expert tensors without their gate or up half: {sorted(halves)}"
        )
