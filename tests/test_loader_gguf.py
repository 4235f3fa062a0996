"""GGUF loading: SmolLM2's config and every dequantised weight against transformers' own GGUF
loader; synthetic GGUFs (written with ``gguf.GGUFWriter``) for qwen2/qwen3, Qwen3-MoE, llama3 rope
scaling, quant types and the bad-file errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY as TINY_HF
from conftest import make_hf_model, requires_smollm2, smollm2_gguf

from nanograph.loader import ModelLoadError, iter_gguf_weights, read_gguf_config
from nanograph.loader.gguf import llama3_rope_factors, unpermute_qk
from nanograph.loader.presets import PRESET_CONFIGS
from nanograph.models.config import ModelConfig, RopeScaling

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def transformers_smollm2_state():
    """transformers' float32 state dict of the SmolLM2 GGUF (its own dequantise + un-permute)."""
    from transformers import AutoModelForCausalLM

    path = smollm2_gguf()
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, local_files_only=True, dtype=torch.float32
    )
    return model.state_dict()


@requires_smollm2
def test_smollm2_config():
    config = read_gguf_config(smollm2_gguf())
    assert config == ModelConfig.from_hf_dict(PRESET_CONFIGS["smollm2-135m"])
    assert (config.architecture, config.hidden_size, config.num_hidden_layers) == ("llama", 576, 30)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (9, 3, 64)
    assert config.tie_word_embeddings and config.rms_norm_eps == 1e-5
    assert config.rope_theta == 100000.0 and config.rope_scaling.kind == "none"
    assert (config.bos_token_id, config.eos_token_ids) == (1, (2,))


@requires_smollm2
def test_smollm2_weights_match_transformers(transformers_smollm2_state):
    ours = dict(iter_gguf_weights(smollm2_gguf()))
    # transformers lists the tied head as its own key; the GGUF (and we) have it once
    assert set(ours) == set(transformers_smollm2_state) - {"lm_head.weight"}
    for name, tensor in ours.items():
        torch.testing.assert_close(
            tensor.float(), transformers_smollm2_state[name], rtol=0, atol=0, msg=name
        )


# ---- synthetic files ------------------------------------------------------------------------


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """``LlamaModel.permute`` from llama.cpp's convert_hf_to_gguf.py, verbatim in numpy."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def random_hf_weights(config: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, i, d = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    shapes = {"model.embed_tokens.weight": (config.vocab_size, h), "model.norm.weight": (h,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    for layer in range(config.num_hidden_layers):
        p = f"model.layers.{layer}."
        shapes |= {
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
        if config.attention_bias:
            sizes = {"q": q, "k": kv, "v": kv}
            shapes |= {p + f"self_attn.{x}_proj.bias": (n,) for x, n in sizes.items()}
        if config.qk_norm:
            shapes |= {p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)}
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def write_gguf(
    path: Path,
    config: ModelConfig,
    weights: dict[str, np.ndarray],
    *,
    quant: dict[str, object] | None = None,
    arch: str | None = None,
    extra: dict[str, np.ndarray] | None = None,
) -> Path:
    """Writes ``weights`` (HF names) the way llama.cpp's converter would: gguf's own name map,
    q/k rows permuted for the llama architecture, metadata keys from ``gguf.Keys``."""
    arch = arch or config.architecture
    writer = gguf.GGUFWriter(str(path), arch)
    add_metadata(writer, config)
    arch_enum = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), None)
    name_map = gguf.get_tensor_name_map(arch_enum or gguf.MODEL_ARCH.LLAMA, 64)
    quant = quant or {}
    for name, w in weights.items():
        base, suffix = name.rsplit(".", 1)
        if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
            heads = config.num_attention_heads if ".q_proj." in name else config.num_key_value_heads
            w = llama_cpp_permute(w, heads)
        add_tensor(writer, f"{name_map.get_name(base)}.{suffix}", w, quant.get(name))
    for name, w in (extra or {}).items():
        writer.add_tensor(name, w)
    return finish(writer, path)


def add_metadata(writer, config: ModelConfig) -> None:
    """The keys llama.cpp's converter writes for every architecture here (``gguf.Keys``)."""
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_bos_token_id(7)
    writer.add_eos_token_id(3)
    writer.add_eot_token_id(5)
    if config.is_moe:
        writer.add_expert_count(config.num_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        writer.add_expert_feed_forward_length(config.expert_intermediate_size)


def add_tensor(writer, gguf_name: str, w: np.ndarray, qtype=None) -> None:
    qtype = qtype or gguf.GGMLQuantizationType.F32
    if qtype == gguf.GGMLQuantizationType.F32:
        writer.add_tensor(gguf_name, w)
    elif qtype == gguf.GGMLQuantizationType.F16:
        writer.add_tensor(gguf_name, w.astype(np.float16))
    else:
        writer.add_tensor(gguf_name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)


def finish(writer, path: Path) -> Path:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


TINY = dict(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    bos_token_id=7,
    eos_token_ids=(3, 5),
)


@pytest.mark.parametrize(
    "config",
    [
        ModelConfig(architecture="llama", **TINY, tie_word_embeddings=False),
        ModelConfig(architecture="qwen2", **TINY, tie_word_embeddings=True, attention_bias=True),
        ModelConfig(architecture="qwen3", **TINY, tie_word_embeddings=False, qk_norm=True),
        # llama with q/k biases: the bias rows are permuted too
        ModelConfig(architecture="llama", **TINY, tie_word_embeddings=True, attention_bias=True),
    ],
    ids=["llama", "qwen2-bias-tied", "qwen3-qknorm", "llama-bias"],
)
def test_synthetic_round_trip(tmp_path, config):
    weights = random_hf_weights(config)
    path = write_gguf(tmp_path / "m.gguf", config, weights)
    assert read_gguf_config(path) == config
    ours = dict(iter_gguf_weights(path))
    assert set(ours) == set(weights)
    for name, w in weights.items():
        assert torch.equal(ours[name], torch.from_numpy(w)), name


@pytest.mark.parametrize("chunk_bytes", [None, 200], ids=["whole", "row-chunks-in-threads"])
def test_quant_types(tmp_path, monkeypatch, chunk_bytes):
    if chunk_bytes:  # tensors past the chunk size are dequantised in row chunks by threads
        monkeypatch.setattr("nanograph.loader.gguf.DEQUANT_CHUNK_BYTES", chunk_bytes)
    config = ModelConfig(architecture="llama", **TINY)
    weights = random_hf_weights(config)
    q = "model.layers.0.self_attn.q_proj.weight"
    types = gguf.GGMLQuantizationType
    quant = {
        q: types.Q8_0,
        "model.layers.0.self_attn.k_proj.weight": types.Q4_0,
        "model.layers.0.mlp.up_proj.weight": types.BF16,
        "model.layers.1.mlp.up_proj.weight": types.F16,
    }
    path = write_gguf(tmp_path / "m.gguf", config, weights, quant=quant)
    ours = dict(iter_gguf_weights(path))
    assert ours["model.layers.1.mlp.up_proj.weight"].dtype == torch.float16
    for name, qtype in quant.items():
        w = weights[name]
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_attention_heads if "q_proj" in name else config.num_key_value_heads
            # quantisation blocks run along the permuted rows: quantise as the converter did
            expected = gguf.quants.dequantize(
                gguf.quants.quantize(llama_cpp_permute(w, heads), qtype), qtype
            )
            expected = unpermute_qk(torch.from_numpy(expected), heads)
        else:
            expected = torch.from_numpy(
                gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype)
            )
        torch.testing.assert_close(ours[name].float(), expected.float(), rtol=0, atol=0)
        # and the quantisation error is what the format allows
        assert (ours[name].float() - torch.from_numpy(w)).abs().max() < 0.5


def test_llama3_rope_scaling_from_rope_freqs(tmp_path):
    scaling = RopeScaling(
        kind="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )
    # Llama 3.1's head_dim and theta, so the ramp has real points
    config = ModelConfig(
        architecture="llama", **(TINY | dict(head_dim=128, hidden_size=512, rope_theta=500000.0))
    ).replace(rope_scaling=scaling)
    factors = llama3_rope_factors(config.head_dim, config.rope_theta, scaling).astype(np.float32)
    path = write_gguf(
        tmp_path / "m.gguf",
        config,
        random_hf_weights(config),
        extra={"rope_freqs.weight": factors},
    )
    assert read_gguf_config(path).rope_scaling == scaling
    assert "rope_freqs.weight" not in dict(iter_gguf_weights(path))


def test_llama3_rope_scaling_other_factors(tmp_path):
    scaling = RopeScaling(
        kind="llama3", factor=32.0, low_freq_factor=2.0, high_freq_factor=8.0
    )  # unusual values: recovered by the fit, not by the defaults
    config = ModelConfig(
        architecture="llama", **(TINY | dict(head_dim=128, hidden_size=512, rope_theta=500000.0))
    )
    factors = llama3_rope_factors(128, 500000.0, scaling).astype(np.float32)
    weights = random_hf_weights(config)
    path = write_gguf(tmp_path / "m.gguf", config, weights, extra={"rope_freqs.weight": factors})
    assert read_gguf_config(path).rope_scaling == scaling
    bad = write_gguf(
        tmp_path / "bad.gguf",
        config,
        weights,
        extra={"rope_freqs.weight": np.linspace(1, 3, 64, dtype=np.float32)[::-1].copy()},
    )
    with pytest.raises(ModelLoadError, match="rope_freqs.weight does not follow llama3"):
        read_gguf_config(bad)


def qwen3_moe_gguf(path: Path, quant: dict[str, object] | None = None, fused: bool = False):
    """The tiny transformers Qwen3-MoE written as llama.cpp's converter does (its experts
    stacked per layer: ``ffn_{gate,up,down}_exps`` [E, rows, cols], or with ``fused`` gate and
    up in one ``ffn_gate_up_exps``, gate rows first); returns the model too."""
    from nanograph.models.config import ModelConfig

    hf = make_hf_model("qwen3_moe")
    config = ModelConfig.from_hf_dict(TINY_HF["qwen3_moe"]).replace(
        bos_token_id=7, eos_token_ids=(3, 5)
    )
    weights, extra = {}, {}
    for name, w in hf.state_dict().items():
        w = w.numpy()
        if name.endswith("mlp.experts.gate_up_proj") and fused:
            extra[f"blk.{name.split('.')[2]}.ffn_gate_up_exps.weight"] = w
        elif name.endswith("mlp.experts.gate_up_proj"):  # transformers 5: [E, 2I, H] in memory
            stem = name.removesuffix("gate_up_proj")
            weights[stem + "gate_proj.weight"], weights[stem + "up_proj.weight"] = np.split(w, 2, 1)
        elif name.endswith("mlp.experts.down_proj"):
            weights[name + ".weight"] = w
        else:
            weights[name] = w
    return hf, config, write_gguf(path, config, weights, quant=quant, arch="qwen3moe", extra=extra)


def test_qwen3_moe_gguf_fused_gate_up(tmp_path):
    """Newer llama.cpp converters may fuse a layer's gate and up stacks: the same model."""
    from nanograph.loader import load_weights
    from nanograph.models import build_model

    models = []
    for fused in (False, True):
        _, config, path = qwen3_moe_gguf(tmp_path / f"moe{fused}.gguf", fused=fused)
        models.append(build_model(config, torch.float32, torch.device("cpu")))
        load_weights(models[-1], iter_gguf_weights(path), progress=False)
    for (name, a), b in zip(models[0].named_parameters(), models[1].parameters()):
        assert torch.equal(a, b), name


def test_qwen3_moe_gguf_logits_match_transformers(tmp_path):
    """Config, every weight and the logits of a Qwen3-MoE GGUF; transformers' own GGUF loader
    reads the same file to the same weights (so the file is what llama.cpp writes)."""
    from transformers import AutoModelForCausalLM

    from nanograph.loader import load_weights
    from nanograph.models import build_model

    hf, config, path = qwen3_moe_gguf(tmp_path / "moe.gguf")
    assert read_gguf_config(path) == config
    model = build_model(config, torch.float32, torch.device("cpu"))
    load_weights(model, iter_gguf_weights(path), progress=False)
    # transformers takes the vocabulary size from a tokenizer (this file has none) and leaves
    # moe_intermediate_size at Qwen3-30B-A3B's 768 whatever the file says: given here
    theirs = AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=path.name, local_files_only=True, dtype=torch.float32,
        vocab_size=config.vocab_size, moe_intermediate_size=config.moe_intermediate_size,
    ).state_dict()  # fmt: skip
    direct = build_model(config, torch.float32, torch.device("cpu"))
    load_weights(direct, hf.state_dict().items(), progress=False)
    for (name, ours), expected in zip(model.named_parameters(), direct.parameters()):
        assert torch.equal(ours, expected), name
    for name, tensor in hf.state_dict().items():
        assert torch.equal(theirs[name], tensor), name
    assert_runs_like(hf, model, path, seed=2)


def test_qwen3_moe_gguf_quantized_experts(tmp_path):
    """Q8_0 and Q4_K expert stacks dequantize to what gguf makes of each expert's rows."""
    types = gguf.GGMLQuantizationType
    quant = {"model.layers.0.mlp.experts.up_proj.weight": types.Q8_0,
             "model.layers.1.mlp.experts.down_proj.weight": types.Q4_0}  # fmt: skip
    hf, config, path = qwen3_moe_gguf(tmp_path / "moe.gguf", quant)
    ours = dict(iter_gguf_weights(path))
    assert len(ours) == len(build_hf_names(config))
    gate_up = hf.state_dict()["model.layers.0.mlp.experts.gate_up_proj"].numpy()
    down = hf.state_dict()["model.layers.1.mlp.experts.down_proj"].numpy()
    inter = config.moe_intermediate_size
    for expert in range(config.num_experts):
        for name, w, qtype in (
            (f"model.layers.0.mlp.experts.{expert}.up_proj.weight", gate_up[expert, inter:],
             types.Q8_0),
            (f"model.layers.1.mlp.experts.{expert}.down_proj.weight", down[expert], types.Q4_0),
        ):  # fmt: skip
            expected = gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype)
            assert torch.equal(ours[name], torch.from_numpy(expected)), name


def gpt_oss_gguf(path: Path, *, fused: bool = False, mxfp4: bool = False):
    """The tiny transformers gpt-oss written as llama.cpp's converter writes it (its
    ``GptOssModel``): gate/up de-interleaved into ``ffn_gate_exps`` / ``ffn_up_exps`` [E, I, H]
    (or, ``fused``, ``ffn_gate_up_exps`` [E, 2I, H], gate rows first) with their biases,
    ``ffn_down_exps`` [E, H, I], sinks as ``attn_sinks.weight``, the router as
    ``ffn_gate_inp``; experts in MXFP4 if asked. Returns the model, config, path and the
    expert tensors as written (HF layout, after the file's own rounding)."""
    hf = make_hf_model("gpt_oss")
    config = ModelConfig.from_hf_dict(TINY_HF["gpt_oss"]).replace(
        bos_token_id=7, eos_token_ids=(3, 5)
    )
    t = gguf.MODEL_TENSOR
    names = gguf.TENSOR_NAMES
    mx = gguf.GGMLQuantizationType.MXFP4 if mxfp4 else None
    writer = gguf.GGUFWriter(str(path), "gpt-oss")
    add_metadata(writer, config)
    writer.add_sliding_window(config.sliding_window)
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(config.rope_scaling.factor)
    writer.add_rope_scaling_orig_ctx_len(config.rope_scaling.original_max_position_embeddings)
    sd = {name: w.numpy() for name, w in hf.state_dict().items()}
    add_tensor(writer, "token_embd.weight", sd["model.embed_tokens.weight"])
    add_tensor(writer, "output_norm.weight", sd["model.norm.weight"])
    written = {}

    def expert(kind, bid, suffix, w):  # the file's values: what a loader must give back
        qtype = mx if suffix == "weight" else None
        add_tensor(writer, f"{names[kind].format(bid=bid)}.{suffix}", w, qtype)
        return gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype) if qtype else w

    for bid in range(config.num_hidden_layers):
        p = f"model.layers.{bid}."
        for kind, hf_name in ((t.ATTN_Q, "q_proj"), (t.ATTN_K, "k_proj"), (t.ATTN_V, "v_proj"),
                              (t.ATTN_OUT, "o_proj")):  # fmt: skip
            for suffix in ("weight", "bias"):
                add_tensor(writer, f"{names[kind].format(bid=bid)}.{suffix}",
                           sd[f"{p}self_attn.{hf_name}.{suffix}"])  # fmt: skip
        add_tensor(writer, f"blk.{bid}.attn_sinks.weight", sd[f"{p}self_attn.sinks"])
        add_tensor(writer, f"blk.{bid}.attn_norm.weight", sd[f"{p}input_layernorm.weight"])
        add_tensor(writer, f"blk.{bid}.post_attention_norm.weight",
                   sd[f"{p}post_attention_layernorm.weight"])  # fmt: skip
        for suffix in ("weight", "bias"):
            add_tensor(writer, f"blk.{bid}.ffn_gate_inp.{suffix}", sd[f"{p}mlp.router.{suffix}"])
        gate_up = sd[f"{p}mlp.experts.gate_up_proj"].transpose(0, 2, 1)  # [E, 2I, H] interleaved
        gate_up_bias = sd[f"{p}mlp.experts.gate_up_proj_bias"]
        halves = {"weight": (gate_up[:, ::2], gate_up[:, 1::2]),
                  "bias": (gate_up_bias[:, ::2], gate_up_bias[:, 1::2])}  # fmt: skip
        for suffix, (gate, up) in halves.items():
            gate, up = np.ascontiguousarray(gate), np.ascontiguousarray(up)
            if fused:
                both = expert(t.FFN_GATE_UP_EXP, bid, suffix, np.concatenate((gate, up), 1))
                gate, up = np.split(both, 2, axis=1)
            else:
                gate = expert(t.FFN_GATE_EXP, bid, suffix, gate)
                up = expert(t.FFN_UP_EXP, bid, suffix, up)
            interleaved = np.stack((gate, up), axis=2).reshape(*gate.shape[:1], -1,
                                                               *gate.shape[2:])  # fmt: skip
            written[f"{p}mlp.experts.gate_up_proj" + ("_bias" if suffix == "bias" else "")] = (
                interleaved if suffix == "bias" else interleaved.transpose(0, 2, 1)
            )
        down = np.ascontiguousarray(sd[f"{p}mlp.experts.down_proj"].transpose(0, 2, 1))
        written[f"{p}mlp.experts.down_proj"] = expert(t.FFN_DOWN_EXP, bid, "weight",
                                                      down).transpose(0, 2, 1)  # fmt: skip
        written[f"{p}mlp.experts.down_proj_bias"] = expert(
            t.FFN_DOWN_EXP, bid, "bias", sd[f"{p}mlp.experts.down_proj_bias"]
        )
    return hf, config, finish(writer, path), written


@pytest.mark.parametrize("fused", [False, True], ids=["gate-up-apart", "gate-up-fused"])
def test_gpt_oss_gguf_logits_match_transformers(tmp_path, fused):
    """llama.cpp's gpt-oss layout: config, every weight equal to the model's, logits."""
    from nanograph.loader import load_weights
    from nanograph.models import build_model

    hf, config, path, _ = gpt_oss_gguf(tmp_path / "oss.gguf", fused=fused)
    assert read_gguf_config(path) == config
    model = build_model(config, torch.float32, torch.device("cpu"))
    load_weights(model, iter_gguf_weights(path), progress=False)
    for name, ours in model.hf_state_dict().items():
        assert torch.equal(ours, hf.state_dict()[name]), name
    assert_runs_like(hf, model, path, seed=4)


def assert_runs_like(hf, model, path: Path, seed: int) -> None:
    """``model`` (loaded from the GGUF at ``path``) gives ``hf``'s logits on a random prompt,
    and the engine on the file generates transformers' greedy tokens."""
    from test_model_reference import run_chunks

    from nanograph import LLM, SamplingParams
    from nanograph.engine.kv_cache import KVCache

    ids = torch.randint(0, 256, (23,), generator=torch.Generator().manual_seed(seed)).tolist()
    kv = KVCache(model.config, num_pages=16, page_size=4, dtype=torch.float32,
                 device=torch.device("cpu"))  # fmt: skip
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(run_chunks(model, kv, ids, [len(ids)]), ref, atol=1e-4, rtol=1e-4)
    greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    llm = LLM(str(path), page_size=4, kv_cache_bytes=2**20, progress=False)
    [out] = llm.generate([ids], greedy)
    with torch.no_grad():
        expected = hf.generate(
            torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=0,
        )  # fmt: skip
    assert out.token_ids == expected[0, len(ids) :].tolist()


@pytest.mark.parametrize("fused", [False, True], ids=["gate-up-apart", "gate-up-fused"])
def test_gpt_oss_gguf_mxfp4_experts(tmp_path, fused):
    """MXFP4 expert stacks (the released GGUFs' type) leave the reader as MXFP4 pairs in the
    safetensors' layout: dequantized, they are what gguf makes of them, re-interleaved and
    transposed into Hugging Face's layout; kept packed (``mxfp4_experts``), the codes and
    scales decode to the same weights."""
    from nanograph.loader import load_weights
    from nanograph.loader.mxfp4 import Mxfp4Tensor
    from nanograph.models import build_model
    from nanograph.models.moe import get_moe_backend

    _, config, path, written = gpt_oss_gguf(tmp_path / "oss.gguf", fused=fused, mxfp4=True)
    model = build_model(config, torch.float32, torch.device("cpu"))
    load_weights(model, iter_gguf_weights(path), progress=False)
    ours = model.hf_state_dict()
    for name, expected in written.items():
        assert torch.equal(ours[name], torch.from_numpy(np.ascontiguousarray(expected))), name
    packed = build_model(config.replace(mxfp4_experts=True), torch.float32, torch.device("cpu"),
                         get_moe_backend("triton", torch.device("cpu")))  # fmt: skip
    load_weights(packed, iter_gguf_weights(path), progress=False)
    for layer, dense in zip(packed.model.layers, model.model.layers, strict=True):
        mine, theirs = layer.mlp, dense.mlp
        for codes, scales, weight in ((mine.w13, mine.w13_scales, theirs.w13),
                                      (mine.w2, mine.w2_scales, theirs.w2)):  # fmt: skip
            pair = Mxfp4Tensor(codes.view(*codes.shape[:2], -1, 16), scales)
            decoded = pair.dequantize(torch.device("cpu"), torch.float32).transpose(-1, -2)
            assert torch.equal(decoded, weight)


def test_gpt_oss_gguf_missing_half_is_a_clear_error(tmp_path):
    _, config, path, _ = gpt_oss_gguf(tmp_path / "oss.gguf")
    reader = gguf.GGUFReader(str(path))
    kept = gguf.GGUFWriter(str(tmp_path / "cut.gguf"), "gpt-oss")
    add_metadata(kept, config)
    kept.add_sliding_window(config.sliding_window)
    for tensor in reader.tensors:
        if tensor.name != "blk.1.ffn_up_exps.weight":
            kept.add_tensor(tensor.name, np.array(tensor.data))
    cut = finish(kept, tmp_path / "cut.gguf")
    with pytest.raises(ModelLoadError, match=r"without their gate or up half.*layers\.1\."):
        list(iter_gguf_weights(cut))


def build_hf_names(config: ModelConfig) -> list[str]:
    from nanograph.models import build_model

    return build_model(config, torch.float32, torch.device("meta")).hf_weight_names()


# ---- errors ---------------------------------------------------------------------------------


def test_unsupported_architecture(tmp_path):
    config = ModelConfig(architecture="llama", **TINY)
    path = write_gguf(tmp_path / "m.gguf", config, random_hf_weights(config), arch="gemma2")
    with pytest.raises(ModelLoadError, match=r"'gemma2' is not supported.*llama, qwen2, qwen3"):
        read_gguf_config(path)


def test_unsupported_quant_type(tmp_path):
    config = ModelConfig(architecture="qwen3", **TINY, qk_norm=True)
    weights = random_hf_weights(config)
    up = weights.pop("model.layers.1.mlp.up_proj.weight")
    # I8 is a GGUF storage type the gguf package does not dequantise
    path = write_gguf(
        tmp_path / "m.gguf", config, weights, extra={"blk.1.ffn_up.weight": up.astype(np.int8)}
    )
    with pytest.raises(ModelLoadError, match=r"blk\.1\.ffn_up\.weight uses quantisation I8"):
        list(iter_gguf_weights(path))


def test_not_a_gguf(tmp_path):
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"not a gguf at all")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        read_gguf_config(path)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(b"GGUF\x03\x00\x00\x00")
    with pytest.raises(ModelLoadError, match="not a readable GGUF file"):
        read_gguf_config(truncated)


def test_unknown_tensor(tmp_path):
    config = ModelConfig(architecture="llama", **TINY)
    path = write_gguf(
        tmp_path / "m.gguf",
        config,
        random_hf_weights(config),
        extra={"blk.0.attn_sinks.weight": np.zeros(4, np.float32)},
    )
    with pytest.raises(ModelLoadError, match="attn_sinks.weight' has no counterpart"):
        list(iter_gguf_weights(path))
