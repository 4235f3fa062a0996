"""Mixture-of-experts models on CUDA: small Qwen3-MoE and gpt-oss against transformers, the
fused Triton MoE against the native per-expert loop at the presets' layer shapes, and every
graph backend combination that ``nanograph bench coverage`` can claim against eager.

Agreement figures print with -s.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CUDA = torch.device("cuda")
ARCHS = ["qwen3_moe", "gpt_oss"]
SMALL = dict(
    page_size=16, chunked_prefill_size=256, prefill_graph_tokens=(64, 128, 256),
    prefill_graph_slots=4, cuda_graph_bs=(1, 2, 4, 8), max_num_seqs=8, mem_fraction=0.3,
    progress=False, cuda_graph_capture="startup",
)  # fmt: skip


def hf_config(arch: str):
    import transformers

    common = dict(
        vocab_size=4096, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
    )  # fmt: skip
    if arch == "qwen3_moe":
        return transformers.Qwen3MoeConfig(
            **common, intermediate_size=512, moe_intermediate_size=128, num_experts=24,
            num_experts_per_tok=4, norm_topk_prob=True, tie_word_embeddings=False,
        )  # fmt: skip
    return transformers.GptOssConfig(
        **common, intermediate_size=128, num_local_experts=12, num_experts_per_tok=3,
        sliding_window=32, tie_word_embeddings=True,
        layer_types=["sliding_attention", "full_attention"] * 2,
    )  # fmt: skip


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """arch -> folder of a small random model (biases and sinks perturbed off zero)."""
    import transformers

    dirs = {}
    for arch in ARCHS:
        config = hf_config(arch)
        torch.manual_seed(0)
        cls = transformers.Qwen3MoeForCausalLM if arch == "qwen3_moe" else (
            transformers.GptOssForCausalLM)  # fmt: skip
        model = cls(config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "bias" in name or "sinks" in name or "norm" in name:
                    p.add_(0.1 * torch.randn_like(p))
        dirs[arch] = tmp_path_factory.mktemp(arch)
        model.save_pretrained(dirs[arch])
    return dirs


def requests(n: int, seed: int):
    from nanograph import SamplingParams

    g = torch.Generator().manual_seed(seed)
    lengths = [300, 40, 7, 128, 90, 1, 16, 64][:n]  # longer than a chunk and than the window
    prompts = [torch.randint(0, 4096, (k,), generator=g).tolist() for k in lengths]
    params = [SamplingParams(max_tokens=m, temperature=0, ignore_eos=True)
              for m in (24, 9, 17, 30, 5, 12, 20, 8)[:n]]  # fmt: skip
    return prompts, params


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("moe", ["triton", "torch_native"])
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers(model_dirs, arch, moe, dtype):
    from nanograph import LLM
    from nanograph.runners.forward_batch import ForwardBatch

    torch_dtype = getattr(torch, dtype)
    hf = _transformers(model_dirs[arch], torch_dtype)
    truth = _transformers(model_dirs[arch], torch.float32) if dtype != "float32" else None
    llm = LLM(str(model_dirs[arch]), moe_backend=moe, dtype=dtype, decode_cuda_graph="none",
              prefill_cuda_graph="none", **SMALL)  # fmt: skip
    ids = requests(1, seed=5)[0][0][:200]
    with torch.no_grad():
        ref = hf(torch.tensor([ids], device=CUDA)).logits[0].float()
        exact = ref if truth is None else truth(torch.tensor([ids], device=CUDA)).logits[0]
    kv = llm.engine.kv_cache
    pages = kv.allocator.allocate(kv.pages_needed(len(ids)))
    batch = ForwardBatch.build([ids], [0], [pages], kv.page_size, [True])
    batch = ForwardBatch(**{**batch.__dict__, "sample_rows": list(range(len(ids)))})
    got = llm.engine.runner.forward(batch)
    kv.allocator.free(pages)
    rel = ((got - ref).norm() / ref.norm()).item()
    agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    print(f"\n{arch} {moe} {dtype} vs transformers: rel err {rel:.2e}, argmax agree {agree:.3f}")
    if dtype == "float32":
        torch.testing.assert_close(got, ref, atol=2e-3, rtol=2e-3)
        return
    # bf16 against float32 transformers, beside transformers' own bf16 error: on these random
    # models bf16 alone moves the logits by ~3e-2 (gpt-oss on CPU: transformers bf16 2.96e-2,
    # ours 2.62e-2), so a fixed bf16-vs-bf16 bound tests rounding luck, not the model
    ours, theirs = (((x - exact).norm() / exact.norm()).item() for x in (got, ref))
    ours_agree, theirs_agree = ((x.argmax(-1) == exact.argmax(-1)).float().mean().item()
                                for x in (got, ref))  # fmt: skip
    print(
        f"vs float32: ours rel {ours:.2e} agree {ours_agree:.3f}, "
        f"transformers bf16 rel {theirs:.2e} agree {theirs_agree:.3f}"
    )
    assert ours <= 1.25 * theirs + 1e-3 and ours_agree >= theirs_agree - 0.05


def _transformers(folder, dtype):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    return model.to(CUDA).eval()


@pytest.fixture(scope="module")
def eager_tokens(model_dirs):
    from nanograph import LLM

    out = {}
    for arch in ARCHS:
        for moe in ("triton", "torch_native"):
            llm = LLM(str(model_dirs[arch]), moe_backend=moe, dtype="float32",
                      decode_cuda_graph="none", prefill_cuda_graph="none", **SMALL)  # fmt: skip
            out[arch, moe] = [o.token_ids for o in llm.generate(*requests(5, seed=1))]
            del llm
    return out


COMBINATIONS = [
    ("triton", "full"), ("triton", "breakable"), ("triton", "tc_piecewise"),
    ("torch_native", "breakable"), ("torch_native", "tc_piecewise"),
]  # fmt: skip


@pytest.mark.parametrize("moe, graph", COMBINATIONS)
@pytest.mark.parametrize("arch", ARCHS)
def test_graph_backends_token_identical_to_eager(model_dirs, eager_tokens, arch, moe, graph):
    """Both paths on one graph backend, float32, a mixed batch of 5 requests (more than the 4
    prefill slots: one forward of them runs eagerly, the rest replay)."""
    from nanograph import LLM

    llm = LLM(str(model_dirs[arch]), moe_backend=moe, dtype="float32", decode_cuda_graph=graph,
              prefill_cuda_graph=graph, **SMALL)  # fmt: skip
    got = [o.token_ids for o in llm.generate(*requests(5, seed=1))]
    expected = eager_tokens[arch, moe]
    same = sum(a == b for a, b in zip(got, expected))
    print(f"\n{arch} moe={moe} graph={graph}: {same}/{len(got)} requests identical")
    for runner in llm.engine.runner.graph_runners.values():
        print(f"  {runner}")
        assert runner.replays > 0 and not runner.failed
    assert got == expected


@pytest.mark.parametrize("arch", ARCHS)
def test_fused_decode_of_a_moe_layer_matches_unfused(model_dirs, monkeypatch, arch):
    """Qwen3-MoE and gpt-oss (q/k/v, o and router biases, sinks, a sliding window) in bf16 with
    the triton experts, full decode graphs, requests decoded alone (batch 1: the fused decode,
    whose router takes the norm and whose experts add into the residual stream) and together:
    greedy tokens fused vs unfused agree for nearly every position (bf16 sums in another order
    may flip a near-tie), and the fused MoE ran only when on."""
    from conftest import fused_decode_agreement

    from nanograph import LLM
    from nanograph.models.moe import MoE

    calls = []
    real = MoE.forward_add
    monkeypatch.setattr(MoE, "forward_add", lambda *a: calls.append(1) or real(*a))

    def build():
        return LLM(str(model_dirs[arch]), moe_backend="triton", dtype="bfloat16",
                   decode_cuda_graph="full", prefill_cuda_graph="none", **SMALL)  # fmt: skip

    agree = fused_decode_agreement(build, *requests(3, seed=2), calls)
    print(f"\n{arch} greedy agreement, fused vs unfused: {agree:.3f}")
    assert agree > 0.9


@pytest.mark.parametrize("path", ["decode", "prefill"])
def test_full_graph_refuses_native_moe(model_dirs, path):
    from nanograph import LLM

    other = "prefill" if path == "decode" else "decode"
    with pytest.raises(ValueError, match="moe_backend='torch_native'.*'breakable' or "
                       "'tc_piecewise'"):  # fmt: skip
        LLM(str(model_dirs["qwen3_moe"]), moe_backend="torch_native",
            **{f"{path}_cuda_graph": "full", f"{other}_cuda_graph": "none"}, **SMALL)  # fmt: skip
    # auto takes breakable where it would take full
    llm = LLM(str(model_dirs["qwen3_moe"]), moe_backend="torch_native", **SMALL)
    assert llm.engine.runner.graph_runners[path].backend.name == "breakable"


# ---- the fused MoE against the native loop, at the presets' layer shapes -----------------

LAYERS = {  # hidden, expert width, experts, top-k, activation
    "qwen3-30b-a3b": (2048, 768, 128, 8, "silu"),
    "gpt-oss-20b": (2880, 2880, 32, 4, "clamped_swiglu"),
}


@pytest.mark.parametrize("routing", ["random", "one_expert"])
@pytest.mark.parametrize("tokens", [1, 7, 256])
@pytest.mark.parametrize("layer", list(LAYERS))
def test_fused_moe_matches_native_per_layer(layer, tokens, routing):
    from nanograph.kernels.moe import fused_experts
    from nanograph.models.moe import native_moe

    hidden, inter, experts, top_k, activation = LAYERS[layer]
    g = torch.Generator(device=CUDA).manual_seed(0)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, device=CUDA) * scale

    w13 = randn(experts, 2 * inter, hidden, scale=hidden**-0.5)
    w2 = randn(experts, hidden, inter, scale=inter**-0.5)
    biased = activation == "clamped_swiglu"
    b13, b2 = (randn(experts, 2 * inter), randn(experts, hidden)) if biased else (None, None)
    x = randn(tokens, hidden, scale=3.0)
    ids = torch.stack([torch.randperm(experts, device=CUDA)[:top_k] for _ in range(tokens)])
    if routing == "one_expert":  # every token's first choice is one expert: many blocks of it
        ids[:, 0] = experts - 1
        ids[:, 1:] = ids[:, 1:] % (experts - 1)
    weights = torch.softmax(randn(tokens, top_k), dim=-1)
    act = ["silu", "clamped_swiglu"].index(activation)
    reference = native_moe(x, w13, w2, b13, b2, weights, ids, act, 1.702, 7.0)  # float32
    as16 = [None if t is None else t.bfloat16() for t in (x, w13, w2, b13, b2, weights)]
    fused = fused_experts(*as16[:5], as16[5], ids, activation).float()
    native = native_moe(*as16[:5], as16[5], ids, act, 1.702, 7.0)
    fused32 = fused_experts(x, w13, w2, b13, b2, weights, ids, activation)
    rel = ((fused - reference).norm() / reference.norm()).item()
    rel_native = ((native.float() - reference).norm() / reference.norm()).item()
    print(f"\n{layer} T={tokens} {routing}: bf16 fused rel err {rel:.2e} (native {rel_native:.2e})")
    torch.testing.assert_close(fused32, reference, atol=1e-3, rtol=1e-3)
    assert rel < 2 * rel_native + 1e-3


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mxfp4_checkpoint_dequantizes_on_the_device(model_dirs, tmp_path, dtype):
    """The released gpt-oss form (MXFP4 experts) loads onto the GPU: the experts dequantize
    there to exactly what transformers' dequantization makes of them on the CPU, and the
    engine's graphs (the defaults: full, triton MoE) serve from them as eager does."""
    import transformers
    from conftest import save_mxfp4_copy

    from nanograph import LLM

    folder = tmp_path / "mxfp4"
    save_mxfp4_copy(model_dirs["gpt_oss"], folder)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        folder, quantization_config=transformers.Mxfp4Config(dequantize=True),
        dtype=getattr(torch, dtype),
    )  # fmt: skip
    theirs = dict(hf.named_parameters())
    prompts, params = requests(4, seed=2)
    tokens = []
    for graph in ("full", "none"):
        llm = LLM(str(folder), dtype=dtype, decode_cuda_graph=graph, prefill_cuda_graph=graph,
                  **SMALL)  # fmt: skip
        for name, ours in llm.engine.model.hf_state_dict().items():
            assert ours.device.type == "cuda" and torch.equal(ours.cpu(), theirs[name]), name
        tokens.append([o.token_ids for o in llm.generate(prompts, params)])
        del llm
    if dtype == "float32":  # bf16 graphs and eager may round apart
        assert tokens[0] == tokens[1]


# ---- MXFP4 experts kept packed (--quantization mxfp4) --------------------------------------


def _mxfp4(experts: int, n: int, k: int, g: torch.Generator):
    """(codes [E, N, K / 2], scales [E, N, K / 32], the dense float32 they encode)."""
    from nanograph.loader.mxfp4 import Mxfp4Tensor

    codes = torch.randint(0, 256, (experts, n, k // 2), dtype=torch.uint8, generator=g,
                          device=CUDA)  # fmt: skip
    scales = torch.randint(118, 124, (experts, n, k // 32), dtype=torch.uint8, generator=g,
                           device=CUDA)  # fmt: skip
    dense = Mxfp4Tensor(codes.view(experts, n, k // 32, 16), scales).dequantize(CUDA, torch.float32)
    return codes, scales, dense.transpose(-1, -2).contiguous()


@pytest.mark.parametrize("tokens", [1, 4, 256])
@pytest.mark.parametrize("experts", [32, 128])  # gpt-oss-20b's and gpt-oss-120b's
def test_mxfp4_experts_equal_dequantized_ones_on_the_device(tokens, experts):
    """gpt-oss' layer shapes: the packed experts' kernels (decode in registers) against the same
    kernels on the dequantized weights, in bfloat16 (the values are exact in both)."""
    from nanograph.kernels.moe import fused_experts

    hidden = inter = 2880
    g = torch.Generator(device=CUDA).manual_seed(0)
    c13, s13, w13 = _mxfp4(experts, 2 * inter, hidden, g)
    c2, s2, w2 = _mxfp4(experts, hidden, inter, g)
    b13 = torch.randn(experts, 2 * inter, generator=g, device=CUDA).bfloat16()
    b2 = torch.randn(experts, hidden, generator=g, device=CUDA).bfloat16()
    x = torch.randn(tokens, hidden, generator=g, device=CUDA).bfloat16()
    ids = torch.stack([torch.randperm(experts, device=CUDA)[:4] for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, 4, generator=g, device=CUDA), -1).bfloat16()
    args = (b13, b2, weights, ids, "clamped_swiglu")
    dense = fused_experts(x, w13.bfloat16(), w2.bfloat16(), *args).float()
    packed = fused_experts(x, c13, c2, *args, w13_scales=s13, w2_scales=s2).float()
    rel = ((packed - dense).norm() / dense.norm()).item()
    print(f"\nMXFP4 {experts} experts T={tokens}: rel diff to dequantized {rel:.2e}")
    # the same products: only the tensor cores' (sorted) or the sums' (pairwise) order differs
    assert rel < 1e-3


def test_mxfp4_engine_graphs_match_eager_and_its_dequantized_model(model_dirs, tmp_path):
    """A gpt-oss checkpoint in the released form, served with its experts packed: every graph
    backend and eager give the same tokens in float32 (a bf16 mismatch under one of them is
    then rounding, not the packed experts), and the dequantized model (same kernels) agrees."""
    from conftest import save_mxfp4_copy

    from nanograph import LLM

    folder = tmp_path / "mxfp4"
    save_mxfp4_copy(model_dirs["gpt_oss"], folder)
    prompts, params = requests(4, seed=3)
    runs = {}
    for graph in ("full", "breakable", "tc_piecewise", "none"):
        llm = LLM(str(folder), dtype="float32", quantization="mxfp4", decode_cuda_graph=graph,
                  prefill_cuda_graph=graph, **SMALL)  # fmt: skip
        assert llm.engine.model.model.layers[0].mlp.w13.dtype == torch.uint8
        runs[graph] = [o.token_ids for o in llm.generate(prompts, params)]
        del llm
    llm = LLM(str(folder), dtype="float32", **SMALL)
    runs["dequantized"] = [o.token_ids for o in llm.generate(prompts, params)]
    for name, tokens in runs.items():
        assert tokens == runs["none"], f"{name} differs from eager"


def test_mxfp4_gpt_oss_20b_dummy_fits_in_a_quarter_of_the_experts_bytes():
    """The preset with dummy MXFP4 experts: its weights take ~13 GB instead of ~42 (experts at
    17/32 of a byte a weight), and a decode step runs under full graphs."""
    from nanograph import LLM, SamplingParams

    llm = LLM("gpt-oss-20b", load_format="dummy", quantization="mxfp4", max_model_len=1024,
              **SMALL)  # fmt: skip
    config = llm.engine.model_config
    experts = config.num_hidden_layers * config.num_experts * 3 * 2880 * 2880
    assert llm.engine.weights_bytes < (config.num_params - experts) * 2 + experts * 17 / 32 * 1.01
    [out] = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    assert out.ok and len(out.token_ids) == 8
