"""Mixture-of-experts models (Qwen3-MoE, gpt-oss) and the fused MoE kernels, on CPU.

Both MoE backends run here: ``torch_native`` as is, ``triton`` under TRITON_INTERPRET=1 (set
before ``nanograph.kernels.moe`` is imported, as in test_kernels_triton.py). References:
transformers (float32, tiny random models saved as Hugging Face folders) and float64 torch.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import pytest
import torch
from conftest import TINY, make_hf_model, save_mxfp4_copy

if torch.cuda.is_available():
    pytest.skip("CUDA present: tests/gpu/test_moe_gpu.py covers it", allow_module_level=True)
os.environ.setdefault("TRITON_INTERPRET", "1")
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(
    not HAS_TRITON, reason="triton not installed: pip install -e '.[triton]'"
)
if "nanograph.kernels.moe" in sys.modules:  # imported before the interpreter was switched on
    importlib.reload(sys.modules["nanograph.kernels.moe"])

from nanograph import LLM, SamplingParams  # noqa: E402
from nanograph.engine.kv_cache import KVCache  # noqa: E402
from nanograph.kernels import reference  # noqa: E402
from nanograph.loader import (  # noqa: E402
    iter_hf_weights,
    load_weights,
    read_hf_config,
    resolve_model,  # noqa: E402
)
from nanograph.loader.mxfp4 import Mxfp4Tensor  # noqa: E402
from nanograph.models import build_model, get_moe_backend  # noqa: E402
from nanograph.models.config import ModelConfig  # noqa: E402
from nanograph.models.moe import native_moe, route  # noqa: E402

moe_kernels = importlib.import_module("nanograph.kernels.moe") if HAS_TRITON else None

CPU = torch.device("cpu")
ARCHS = ["qwen3_moe", "gpt_oss"]
BACKENDS = ["torch_native", pytest.param("triton", marks=needs_triton)]
GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def hf_models(tiny_model_dir):
    """arch -> (transformers model, its saved folder)."""
    return {arch: (make_hf_model(arch), tiny_model_dir(arch)) for arch in ARCHS}


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    # longer than gpt_oss' sliding window (8); one prompt of one token
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in (19, 1, 11)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers(hf_models, arch, backend):
    from test_model_reference import run_chunks

    hf, folder = hf_models[arch]
    config = read_hf_config(folder)
    model = build_model(config, torch.float32, CPU, get_moe_backend(backend, CPU))
    load_weights(model, iter_hf_weights(folder, config), progress=False)
    kv = KVCache(config, num_pages=32, page_size=4, dtype=torch.float32, device=CPU)
    ids = _prompts()[0] + _prompts()[2]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(run_chunks(model, kv, ids, [len(ids)]), ref, atol=1e-4, rtol=1e-4)
    chunked = run_chunks(model, kv, ids, [7, 1, 9, len(ids) - 17])  # through the paged prefix
    torch.testing.assert_close(chunked, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_match_transformers(hf_models, arch, backend):
    hf, folder = hf_models[arch]
    llm = LLM(str(folder), moe_backend=backend, page_size=4, kv_cache_bytes=2**20,
              progress=False)  # fmt: skip
    ours = [o.token_ids for o in llm.generate(_prompts(), GREEDY)]  # one mixed batch
    for prompt, tokens in zip(_prompts(), ours):
        with torch.no_grad():
            ref = hf.generate(
                torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=GREEDY.max_tokens, do_sample=False, eos_token_id=None,
                pad_token_id=0,  # token 0 is in a prompt: the explicit mask keeps it unmasked
            )  # fmt: skip
        assert tokens == ref[0, len(prompt) :].tolist()


def test_config_round_trip_and_presets():
    for arch in ARCHS:
        config = ModelConfig.from_hf_dict(TINY[arch])
        assert ModelConfig.from_hf_dict(config.to_hf_dict()) == config, arch
    gpt = ModelConfig.from_hf_dict(TINY["gpt_oss"])
    assert [gpt.layer_sliding_window(i) for i in range(2)] == [8, 0]
    assert gpt.attention_sinks and gpt.o_proj_bias and not gpt.rope_scaling.truncate
    qwen = resolve_model("qwen3-30b-a3b", "dummy").config
    assert (qwen.num_experts, qwen.num_experts_per_tok, qwen.moe_intermediate_size) == (128, 8, 768)
    assert 30.4e9 < qwen.num_params < 30.6e9 and 3.0e9 < qwen.num_active_params < 3.1e9
    oss = resolve_model("gpt-oss-20b", "dummy").config
    assert 20.8e9 < oss.num_params < 21.0e9 and oss.sliding_window == 128
    assert oss.layer_types[:2] == ("sliding_attention", "full_attention")
    big = resolve_model("gpt-oss-120b", "dummy").config  # OpenAI's 116.8B total, 5.1B active
    assert 116.7e9 < big.num_params < 116.9e9 and 5.1e9 < big.num_active_params < 5.2e9
    assert (big.num_experts, big.num_hidden_layers, len(big.layer_types)) == (128, 36, 36)


def test_unsupported_moe_configs_fail_clearly():
    for arch, quant in (("gpt_oss", "gptq"), ("qwen3_moe", "mxfp4")):  # only gpt-oss' MXFP4
        with pytest.raises(ValueError, match="use an unquantized"):
            ModelConfig.from_hf_dict({**TINY[arch], "quantization_config": {"quant_method": quant}})
    with pytest.raises(ValueError, match="every layer must be a MoE layer"):
        ModelConfig.from_hf_dict({**TINY["qwen3_moe"], "mlp_only_layers": [0]})
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        ModelConfig.from_hf_dict({**TINY["qwen3_moe"], "num_experts_per_tok": 7})
    with pytest.raises(ValueError, match="moe_backend must be one of"):
        LLM("qwen3-30b-a3b", load_format="dummy", moe_backend="cutlass")


def test_engine_reports_host_planned_moe(hf_models):
    folder = hf_models["qwen3_moe"][1]
    native = LLM(str(folder), moe_backend="torch_native", page_size=4, kv_cache_bytes=2**20,
                 progress=False)  # fmt: skip
    assert any("moe_backend='torch_native'" in op for op in native.engine.host_planned_ops())
    fused = LLM(str(folder), moe_backend="triton", attention_backend="torch_native",
                page_size=4, kv_cache_bytes=2**20, progress=False)  # fmt: skip
    assert not any("moe_backend" in op for op in fused.engine.host_planned_ops())


@pytest.mark.parametrize("backend", BACKENDS)
def test_tc_piecewise_splits_only_at_host_planned_ops(hf_models, backend):
    """The native experts are a split point like attention; the fused ones stay inside."""
    from test_model_reference import TORCH_NATIVE

    from nanograph.attention.op import ForwardContext, forward_context
    from nanograph.graph.piecewise_compiler import PiecewiseCompiler, trace_and_split
    from nanograph.runners.attention_inputs import eager_inputs
    from nanograph.runners.forward_batch import ForwardBatch

    folder = hf_models["gpt_oss"][1]
    config = read_hf_config(folder)
    model = build_model(config, torch.float32, CPU, get_moe_backend(backend, CPU))
    load_weights(model, iter_hf_weights(folder, config), progress=False)
    kv = KVCache(config, num_pages=8, page_size=4, dtype=torch.float32, device=CPU)
    ids = _prompts()[2]
    pages = kv.allocator.allocate(kv.pages_needed(len(ids)))
    batch = ForwardBatch.build([ids], [0], [pages], kv.page_size, [True])
    tokens, positions = torch.tensor(batch.input_ids), torch.tensor(batch.positions)
    compiler = PiecewiseCompiler("eager")
    with torch.no_grad(), forward_context(ForwardContext(TORCH_NATIVE, eager_inputs(batch, CPU)[2],
                                                         kv.k, kv.v)):  # fmt: skip
        expected = model(tokens, positions)
        compiled = trace_and_split(lambda: model(tokens, positions), compiler)
        torch.testing.assert_close(compiled(), expected, atol=1e-5, rtol=1e-5)
    layers = config.num_hidden_layers
    splits = {"nanograph::attend": layers}
    if backend == "torch_native":
        splits["nanograph::native_experts"] = layers
    assert compiler.splits == splits


# ---- kernels ---------------------------------------------------------------------------------


def _experts(activation: str, num_experts: int, hidden: int = 48, inter: int = 40, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=g) / hidden**0.5
    w2 = torch.randn(num_experts, hidden, inter, generator=g) / inter**0.5
    biases = activation == "clamped_swiglu"
    b13 = torch.randn(num_experts, 2 * inter, generator=g) if biases else None
    b2 = torch.randn(num_experts, hidden, generator=g) if biases else None
    return w13, w2, b13, b2


def _routing(case: str, num_tokens: int, num_experts: int, top_k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    if case == "random":
        ids = torch.stack([torch.randperm(num_experts, generator=g)[:top_k]
                           for _ in range(num_tokens)])  # fmt: skip
    elif case == "one_expert":  # every token's first choice is expert 2; the rest are random
        ids = torch.stack([torch.cat([torch.tensor([2]), 3 + torch.randperm(
            num_experts - 3, generator=g)[: top_k - 1]]) for _ in range(num_tokens)])  # fmt: skip
    elif case == "two_experts":  # most experts get no token
        ids = torch.tensor([[1, num_experts - 1][:top_k]] * num_tokens)
    else:
        raise ValueError(case)
    weights = torch.softmax(torch.randn(num_tokens, top_k, generator=g), dim=-1)
    return weights, ids


CASES = [
    # (routing, tokens, experts, top_k, activation)
    ("random", 1, 4, 1, "silu"),  # batch 1, top-1
    ("random", 1, 8, 4, "clamped_swiglu"),  # batch 1, top-k > 1
    ("random", 7, 5, 2, "silu"),
    ("random", 9, 3, 3, "clamped_swiglu"),  # every expert every token
    ("one_expert", 21, 6, 2, "silu"),  # one expert takes 21 rows: two blocks of 16
    ("two_experts", 5, 9, 2, "clamped_swiglu"),  # seven experts with no token
]


@pytest.mark.parametrize(
    "case", CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}top{c[3]}-{c[4]}" for c in CASES]
)
def test_native_moe_matches_float64(case):
    """The native MoE (its split op the per-expert loop, the sort before it and the combine
    after it plain torch): experts with no token, and one expert taking every token."""
    routing, tokens, num_experts, top_k, activation = case
    w13, w2, b13, b2 = _experts(activation, num_experts)
    weights, ids = _routing(routing, tokens, num_experts, top_k)
    x = torch.randn(tokens, w13.shape[2], generator=torch.Generator().manual_seed(1))
    f64 = [None if t is None else t.double() for t in (x, w13, w2, b13, b2, weights)]
    expected = reference.fused_experts(*f64[:5], f64[5], ids, activation).float()
    native = native_moe(x, w13, w2, b13, b2, weights, ids,
                        ["silu", "clamped_swiglu"].index(activation), 1.702, 7.0)  # fmt: skip
    assert native.dtype == x.dtype and native.shape == x.shape
    torch.testing.assert_close(native, expected, atol=2e-4, rtol=2e-4)


def test_native_experts_are_held_for_nn_products():
    """The native backend's dense experts are [E, N, K] views of [E, K, N] memory, so each
    expert's weight transposed (what its rows are multiplied by) is contiguous: NN products.
    The triton backend keeps them [E, N, K] in memory, as its kernels read them."""
    from nanograph.models import moe

    config = ModelConfig.from_hf_dict({**TINY["gpt_oss"], "intermediate_size": 24})
    native = moe.MoE(config, get_moe_backend("torch_native", CPU))
    triton_layout = moe.MoE(config, get_moe_backend("triton", CPU))
    e, h = config.num_experts, config.hidden_size
    for layer in (native, triton_layout):
        assert layer.w13.shape == (e, 48, h) and layer.w2.shape == (e, h, 24)
    for w in (native.w13, native.w2):
        assert not w.is_contiguous() and w.transpose(1, 2).is_contiguous()
        assert all(v.is_contiguous() for v in moe._expert_views(-1, 0, w))
    assert triton_layout.w13.is_contiguous() and triton_layout.w2.is_contiguous()


def test_native_moe_keeps_a_layers_expert_views_while_its_weights_stay():
    """A native layer's per-expert weight views are made once and dropped with the layer; a
    weight replaced between forwards is what the next forward uses."""
    import gc

    from nanograph.models import moe

    config = resolve_model("qwen3-30b-a3b", "dummy").config.replace(
        num_hidden_layers=1, hidden_size=48, moe_intermediate_size=40, num_experts=6,
        num_experts_per_tok=2,
    )  # fmt: skip
    layer = moe.MoE(config, get_moe_backend("torch_native", CPU))
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.2)
    layer.requires_grad_(False)
    x = torch.randn(7, 48, generator=torch.Generator().manual_seed(2))
    first = layer(x)
    views = moe._EXPERT_VIEWS[(layer.views_key, 0)][1][0]
    torch.testing.assert_close(layer(x), first, rtol=0, atol=0)
    assert moe._EXPERT_VIEWS[(layer.views_key, 0)][1][0] is views  # made once
    layer.w13 = torch.nn.Parameter(2 * layer.w13, requires_grad=False)  # new memory
    assert not torch.allclose(layer(x), first)
    assert moe._EXPERT_VIEWS[(layer.views_key, 0)][1][0] is not views
    logits = layer.router(x)
    routed = moe.route(logits, 2, True, config.norm_topk_prob)
    fresh = moe.native_moe(x, layer.w13, layer.w2, None, None, *routed, 0, 1.702, 7.0)
    kept = layer.backend.forward(layer, x, logits)
    torch.testing.assert_close(kept, fresh, rtol=0, atol=0)  # fresh: views made for the call
    key = layer.views_key
    del layer
    gc.collect()
    assert (key, 0) not in moe._EXPERT_VIEWS and (key, 1) not in moe._EXPERT_VIEWS
    assert get_moe_backend("triton", CPU).graph_safe  # its layers keep no views: key -1


# the sorted regime for every case; the pairwise one where it runs (a few tokens)
FUSED_CASES = [(c, False) for c in CASES] + [
    (c, True)
    for c in CASES
    if c[1] <= 8  # kernels.moe.PAIRWISE_MAX_TOKENS
]


@pytest.mark.parametrize(
    "case, pairwise", FUSED_CASES,
    ids=[f"{'pairwise' if p else 'sorted'}-{c[0]}-{c[1]}x{c[2]}top{c[3]}-{c[4]}"
         for c, p in FUSED_CASES],
)  # fmt: skip
@needs_triton
def test_fused_experts_match_float64(case, pairwise):
    routing, tokens, num_experts, top_k, activation = case
    w13, w2, b13, b2 = _experts(activation, num_experts)
    weights, ids = _routing(routing, tokens, num_experts, top_k)
    x = torch.randn(tokens, w13.shape[2], generator=torch.Generator().manual_seed(1))
    if activation == "clamped_swiglu":
        x = 4 * x  # reach the clamps
    f64 = [None if t is None else t.double() for t in (x, w13, w2, b13, b2, weights)]
    expected = reference.fused_experts(*f64[:5], f64[5], ids, activation).float()
    tiles = moe_kernels.MoeTiles(16, 16 if pairwise else 32, 32, 1, 1, pairwise)
    fused = moe_kernels.fused_experts(x, w13, w2, b13, b2, weights, ids, activation, tiles=tiles)
    torch.testing.assert_close(fused, expected, atol=2e-4, rtol=2e-4)


def _mxfp4_weight(num_experts: int, n: int, k: int, g: torch.Generator):
    """(codes [E, N, K / 2], scales [E, N, K / 32], the dense [E, N, K] float32 they encode, as
    ``loader.mxfp4`` dequantizes a checkpoint's pair)."""
    codes = torch.randint(0, 256, (num_experts, n, k // 2), dtype=torch.uint8, generator=g)
    scales = torch.randint(118, 126, (num_experts, n, k // 32), dtype=torch.uint8, generator=g)
    pair = Mxfp4Tensor(codes.view(num_experts, n, k // 32, 16), scales)
    return codes, scales, pair.dequantize(CPU, torch.float32).transpose(-1, -2).contiguous()


MXFP4_CASES = [c for c in FUSED_CASES if c[0][0] != "one_expert"]


@pytest.mark.parametrize(
    "case, pairwise", MXFP4_CASES,
    ids=[f"{'pairwise' if p else 'sorted'}-{c[1]}x{c[2]}top{c[3]}-{c[4]}" for c, p in MXFP4_CASES],
)  # fmt: skip
@pytest.mark.parametrize("block_k", [32, 64])  # 64: K = 96 ends in a half tile
@needs_triton
def test_mxfp4_experts_equal_their_dequantized_weights(case, pairwise, block_k):
    """The kernels decode MXFP4 tiles to exactly the values ``loader.mxfp4`` dequantizes, so in
    float32 the packed experts give the dense experts' result to float32 rounding (the same
    products summed in another order), in both regimes."""
    routing, tokens, num_experts, top_k, activation = case
    g = torch.Generator().manual_seed(5)
    # w13: K = 64 (two scale groups); w2: K = 96, three groups (with 64-wide K tiles, the last
    # tile half outside the weight)
    hidden, inter = 64, 96
    c13, s13, w13 = _mxfp4_weight(num_experts, 2 * inter, hidden, g)
    c2, s2, w2 = _mxfp4_weight(num_experts, hidden, inter, g)
    biases = activation == "clamped_swiglu"
    b13 = torch.randn(num_experts, 2 * inter, generator=g) if biases else None
    b2 = torch.randn(num_experts, hidden, generator=g) if biases else None
    weights, ids = _routing(routing, tokens, num_experts, top_k)
    x = torch.randn(tokens, hidden, generator=g)
    tiles = moe_kernels.MoeTiles(16, 16 if pairwise else 32, block_k, 1, 1, pairwise)
    dense = moe_kernels.fused_experts(x, w13, w2, b13, b2, weights, ids, activation, tiles=tiles)
    packed = moe_kernels.fused_experts(x, c13, c2, b13, b2, weights, ids, activation, tiles=tiles,
                                       w13_scales=s13, w2_scales=s2)  # fmt: skip
    # the same products, summed in another order (pairwise: even and odd K apart; sorted: the
    # interpreter's dot, numpy, sums a transposed tile apart)
    torch.testing.assert_close(packed, dense, rtol=1e-6, atol=1e-6 * dense.abs().max().item())
    if pairwise:  # the fused decode's residual add, too
        stream = torch.randn(tokens, hidden, generator=g)
        expected = stream.clone()
        moe_kernels.fused_experts(x, w13, w2, b13, b2, weights, ids, activation, tiles=tiles,
                                  out=expected, accumulate=True)  # fmt: skip
        moe_kernels.fused_experts(x, c13, c2, b13, b2, weights, ids, activation, tiles=tiles,
                                  out=stream, accumulate=True, w13_scales=s13,
                                  w2_scales=s2)  # fmt: skip
        torch.testing.assert_close(
            stream, expected, rtol=1e-6, atol=1e-6 * dense.abs().max().item()
        )


@pytest.mark.parametrize("mxfp4", [False, True], ids=["bf16-tiles", "mxfp4-tiles"])
@pytest.mark.parametrize("tokens", [200, 300], ids=["64-rows", "128-rows"])
@needs_triton
def test_sorted_experts_in_the_gpu_tiles_match_float64(tokens, mxfp4):
    """The large tiles ``choose_tiles`` picks on a GPU for prefill-sized batches (64 x 128, and
    128 x 256 / 128 x 128 once experts see 128 rows), run here in float32 against the float64
    reference: row blocks past an expert's rows, N tiles past the weight's rows (64 < 256), K
    tiles half outside it (96), and the activation pass before the down GEMM."""
    num_experts, top_k, hidden, inter = 4, 2, 64, 96
    tiles = moe_kernels.choose_tiles(tokens, top_k, num_experts, hidden, inter,
                                     torch.device("cuda"), torch.bfloat16, mxfp4)  # fmt: skip
    assert tiles.block_m == (64 if tokens == 200 else 128) and not tiles.pairwise
    g = torch.Generator().manual_seed(8)
    c13, s13, w13 = _mxfp4_weight(num_experts, 2 * inter, hidden, g)
    c2, s2, w2 = _mxfp4_weight(num_experts, hidden, inter, g)
    b13 = torch.randn(num_experts, 2 * inter, generator=g)
    b2 = torch.randn(num_experts, hidden, generator=g)
    weights, ids = _routing("random", tokens, num_experts, top_k)
    x = 4 * torch.randn(tokens, hidden, generator=g)  # reach the clamps
    f64 = [t.double() for t in (x, w13, w2, b13, b2, weights)]
    expected = reference.fused_experts(*f64, ids, "clamped_swiglu").float()
    packed = dict(w13_scales=s13, w2_scales=s2) if mxfp4 else {}
    a13, a2 = (c13, c2) if mxfp4 else (w13, w2)
    got = moe_kernels.fused_experts(x, a13, a2, b13, b2, weights, ids, "clamped_swiglu",
                                    tiles=tiles, **packed)  # fmt: skip
    torch.testing.assert_close(got, expected, atol=2e-4 * expected.abs().max().item(), rtol=2e-4)


@pytest.mark.parametrize(
    "experts,top_k,hidden,inter,dtype,mxfp4",
    [(128, 8, 2048, 768, torch.bfloat16, False), (32, 4, 2880, 2880, torch.bfloat16, True),
     (6, 4, 64, 32, torch.bfloat16, False), (5, 3, 64, 32, torch.float32, False)],
    ids=["qwen3-30b-a3b", "gpt-oss-20b-mxfp4", "tiny", "tiny-fp32"],
)  # fmt: skip
@needs_triton
def test_warmup_token_counts_reach_every_gpu_tile_regime(experts, top_k, hidden, inter, dtype,
                                                         mxfp4):  # fmt: skip
    """Start-up runs a forward of each count ``tile_token_counts`` names: the fewest tokens of
    each launch configuration ``choose_tiles`` gives on a GPU from 1 to the largest forward,
    as a scan of every count finds them; each configuration holds one interval of counts (what
    the binary search assumes)."""
    from types import SimpleNamespace

    gpu = torch.device("cuda")  # choose_tiles' GPU tiles; nothing is allocated there
    codes = (experts, 2 * inter, hidden // 2 if mxfp4 else hidden)
    w13 = SimpleNamespace(shape=codes, device=gpu)
    scales = SimpleNamespace(shape=(experts, 2 * inter, hidden // 32)) if mxfp4 else None
    for largest in (1, 8, 9, 300, 2100):
        first: dict = {}  # tiles -> the fewest tokens that get them
        previous = None
        for tokens in range(1, largest + 1):
            tiles = moe_kernels.choose_tiles(tokens, top_k, experts, hidden, inter, gpu, dtype,
                                             mxfp4)  # fmt: skip
            if tiles != previous:
                assert tiles not in first, f"{tiles} again at {tokens} tokens: not an interval"
                first[tiles], previous = tokens, tiles
        assert moe_kernels.tile_token_counts(w13, scales, top_k, dtype, largest) == list(
            first.values()
        )
    # by 2,100 tokens: the pairwise GEMVs and the sorted row blocks of 16, 32, 64 and (not in
    # float32) 128 rows
    assert len(first) == (4 if dtype == torch.float32 else 5)


def test_warmup_token_counts_of_a_model_follow_its_moe_backend():
    """A model names the token counts of its MoE backend's tile regimes: the triton experts'
    (one CPU tile beside the pairwise GEMVs under the interpreter), none for the native loop
    or a dense model."""
    config = resolve_model("qwen3-30b-a3b", "dummy").config.replace(
        num_hidden_layers=2, hidden_size=64, moe_intermediate_size=32, vocab_size=300,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    )  # fmt: skip
    triton_model = build_model(config, torch.float32, CPU, get_moe_backend("triton", CPU))
    assert triton_model.warmup_token_counts(256) == [1, 9]
    assert triton_model.warmup_token_counts(8) == [1]
    native = build_model(config, torch.float32, CPU, get_moe_backend("torch_native", CPU))
    assert native.warmup_token_counts(256) == []
    dense = resolve_model("qwen3-0.6b", "dummy").config.replace(
        num_hidden_layers=1, hidden_size=64, intermediate_size=32, vocab_size=300,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    )  # fmt: skip
    assert build_model(dense, torch.float32, CPU).warmup_token_counts(256) == []


@needs_triton
def test_mxfp4_decode_covers_every_code_and_scale():
    """Each of the 256 bytes (both nibbles) under scales from the smallest (0: 2^-127, a float32
    subnormal) to 240, against ``loader.mxfp4``'s dequantization; larger scales (values past
    2^113, which no checkpoint holds) decode as 240's."""
    import triton
    import triton.language as tl

    @triton.jit
    def decode(codes_ptr, scales_ptr, out_ptr, ROWS: tl.constexpr, K: tl.constexpr):
        rows = tl.arange(0, ROWS)
        codes = tl.load(codes_ptr + rows[:, None] * (K // 2) + tl.arange(0, K // 2)[None, :])
        scales = tl.load(scales_ptr + rows[:, None] * (K // 32) + tl.arange(0, K // 32)[None, :])
        values = moe_kernels._mx_decode(codes, scales, ROWS, K)
        tl.store(out_ptr + rows[:, None] * K + tl.arange(0, K)[None, :], values)

    rows, k = 8, 512  # 256 bytes a row, 16 scale groups
    codes = torch.arange(256, dtype=torch.uint8).repeat(rows, 1)
    scale_values = [0, 1, 2, 100, 126, 127, 128, 130, 200, 239, 240, 120, 119, 5, 64, 127]
    scales = torch.tensor(scale_values, dtype=torch.uint8).roll(1).repeat(rows, 1)
    for r in range(rows):
        scales[r] = scales[r].roll(r)
    out = torch.empty(rows, k)
    decode[(1,)](codes, scales, out, rows, k)
    pair = Mxfp4Tensor(codes.view(1, rows, k // 32, 16), scales[None])
    expected = pair.dequantize(CPU, torch.float32).transpose(-1, -2)[0]
    assert torch.equal(out, expected)
    decode[(1,)](codes, torch.full_like(scales, 250), out, rows, k)
    saturated = Mxfp4Tensor(codes.view(1, rows, k // 32, 16), torch.full_like(scales, 240)[None])
    assert torch.equal(out, saturated.dequantize(CPU, torch.float32).transpose(-1, -2)[0])


@needs_triton
def test_mxfp4_experts_refuse_unpaired_weights():
    g = torch.Generator().manual_seed(0)
    c13, s13, _ = _mxfp4_weight(2, 16, 64, g)
    c2, s2, _ = _mxfp4_weight(2, 64, 8 * 4, g)
    x, (weights, ids) = torch.randn(1, 64), _routing("random", 1, 2, 1)
    tiles = moe_kernels.MoeTiles(16, 16, 32, 1, 1, True)
    with pytest.raises(ValueError, match="scales for both"):
        moe_kernels.fused_experts(x, c13, c2, None, None, weights, ids, "silu", tiles=tiles,
                                  w13_scales=s13)  # fmt: skip
    with pytest.raises(ValueError, match="do not pair"):
        moe_kernels.fused_experts(x, c13, c2, None, None, weights, ids, "silu", tiles=tiles,
                                  w13_scales=s13[..., :1], w2_scales=s2)  # fmt: skip
    with pytest.raises(ValueError, match="multiples of 32"):
        moe_kernels.fused_experts(x, c13, c2, None, None, weights, ids, "silu",
                                  tiles=moe_kernels.MoeTiles(16, 16, 16, 1, 1, True),
                                  w13_scales=s13, w2_scales=s2)  # fmt: skip


@needs_triton
@pytest.mark.parametrize("case", [c for c in CASES if c[1] <= 8], ids=lambda c: f"{c[1]}x{c[2]}")
def test_pairwise_experts_add_into_out(case):
    """``accumulate``: the experts' sum added to ``out`` in place (the fused decode's residual
    stream) equals out + the sum in float64; the sorted path refuses it."""
    routing, tokens, num_experts, top_k, activation = case
    w13, w2, b13, b2 = _experts(activation, num_experts)
    weights, ids = _routing(routing, tokens, num_experts, top_k)
    g = torch.Generator().manual_seed(2)
    x, stream = torch.randn(tokens, w13.shape[2], generator=g), torch.randn(tokens, w2.shape[1])
    f64 = [None if t is None else t.double() for t in (x, w13, w2, b13, b2, weights)]
    expected = stream.double() + reference.fused_experts(*f64[:5], f64[5], ids, activation)
    tiles = moe_kernels.MoeTiles(16, 16, 32, 1, 1, True)
    out = moe_kernels.fused_experts(x, w13, w2, b13, b2, weights, ids, activation, tiles=tiles,
                                    out=stream, accumulate=True)  # fmt: skip
    assert out is stream
    torch.testing.assert_close(stream.double(), expected, atol=2e-4, rtol=2e-4)
    with pytest.raises(ValueError, match="pairwise path only"):
        sorted_tiles = moe_kernels.MoeTiles(16, 32, 32, 1, 1, False)
        moe_kernels.fused_experts(x, w13, w2, b13, b2, weights, ids, activation,
                                  tiles=sorted_tiles, out=stream, accumulate=True)  # fmt: skip


@needs_triton
@pytest.mark.parametrize("block_m", [16, 32])
@pytest.mark.parametrize("routing", ["random", "one_expert", "two_experts"])
def test_align_by_expert_invariants(routing, block_m):
    num_experts, top_k, tokens = 7, 2, 40
    _, ids = _routing(routing, tokens, num_experts, top_k)
    sorted_ids, block_expert = moe_kernels.align_by_expert(ids, num_experts, block_m)
    pairs = tokens * top_k
    assert sorted_ids.numel() == moe_kernels.sorted_capacity(pairs, num_experts, block_m)
    assert (
        sorted_ids.numel() % block_m == 0 and block_expert.numel() == sorted_ids.numel() // block_m
    )
    real = sorted_ids[sorted_ids < pairs]
    assert sorted(real.tolist()) == list(range(pairs))  # every pair exactly once
    assert ((sorted_ids == pairs) | (sorted_ids < pairs)).all()  # the rest is the sentinel
    flat = ids.reshape(-1)
    for b, expert in enumerate(block_expert.tolist()):
        rows = sorted_ids[b * block_m : (b + 1) * block_m]
        rows = rows[rows < pairs]
        if expert < 0:
            assert rows.numel() == 0
        else:  # a block holds one expert's pairs, in the order they came (stable)
            assert rows.numel() > 0 and (flat[rows] == expert).all()
            assert rows.tolist() == sorted(rows.tolist())
    counts = torch.bincount(flat, minlength=num_experts)
    assert (block_expert >= 0).sum() == ((counts + block_m - 1) // block_m).sum()


def test_routing_rules():
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.5], [3.0, 3.5, 0.0, -2.0]])
    # Qwen3-MoE: softmax over all experts, top-k, renormalised (or not)
    weights, ids = route(logits, 2, softmax_first=True, renormalize=True)
    assert ids.tolist() == [[1, 3], [1, 0]]
    top = torch.softmax(logits, -1).gather(1, ids)
    torch.testing.assert_close(weights, top / top.sum(-1, keepdim=True))
    weights, _ = route(logits, 2, softmax_first=True, renormalize=False)
    torch.testing.assert_close(weights, top)
    # gpt-oss: top-k of the logits, softmax over those k
    weights, ids = route(logits, 2, softmax_first=False, renormalize=False)
    torch.testing.assert_close(weights, torch.softmax(logits.gather(1, ids), -1))


def test_dummy_moe_model_builds_and_runs():
    """--load-format dummy on a preset shrunk to two layers: init and one forward."""
    config = resolve_model("gpt-oss-20b", "dummy").config.replace(
        num_hidden_layers=2, layer_types=("sliding_attention", "full_attention"),
        hidden_size=64, intermediate_size=32, vocab_size=300, num_attention_heads=8,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
    )  # fmt: skip
    from nanograph.loader import init_dummy_weights

    model = build_model(config, torch.float32, CPU)
    init_dummy_weights(model, seed=0)
    assert model.model.layers[0].mlp.backend.name == "torch_native"  # auto on CPU
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("arch", ARCHS)
def test_transformers_reference_from_our_weights(arch):
    """``transformers_model(state_dict=model.hf_state_dict())``, the benchmarks' peer and the
    GPU tests' reference, holds our weights: per-expert names are stacked where transformers
    holds experts fused, gpt-oss' transposed experts are views."""
    from test_model_reference import run_chunks

    from nanograph.loader import init_dummy_weights
    from nanograph.models.reference import transformers_model

    config = ModelConfig.from_hf_dict(TINY[arch])
    model = build_model(config, torch.float32, CPU)
    init_dummy_weights(model, seed=1)
    hf = transformers_model(config, state_dict=model.hf_state_dict())
    kv = KVCache(config, num_pages=16, page_size=4, dtype=torch.float32, device=CPU)
    ids = _prompts()[0]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(run_chunks(model, kv, ids, [len(ids)]), ref, atol=1e-4, rtol=1e-4)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("experts, top_k", [(6, 2), (5, 5), (128, 8), (32, 4)])
def test_routing_kernel_matches_torch(experts, top_k, dtype):
    logits = torch.randn(5, experts, generator=torch.Generator().manual_seed(experts)).to(dtype)
    for softmax_first, renormalize in ((True, True), (True, False), (False, False)):
        expected = route(logits, top_k, softmax_first, renormalize)
        weights, ids = moe_kernels.route(logits, top_k, softmax_first, renormalize)
        # the same experts; ties aside (none here) torch.topk orders them the same way
        assert torch.equal(ids, expected[1]), (softmax_first, renormalize)
        assert weights.dtype == dtype
        torch.testing.assert_close(weights, expected[0], atol=1e-6, rtol=1e-2 if dtype ==
                                   torch.bfloat16 else 1e-6)  # fmt: skip


def test_transformers5_in_memory_weights_load(hf_models):
    """A transformers-5 Qwen3-MoE holds its experts fused (``mlp.experts.gate_up_proj``); its
    ``state_dict()`` loads as well as the per-expert checkpoint."""
    hf, folder = hf_models["qwen3_moe"]
    config = read_hf_config(folder)
    from_folder = build_model(config, torch.float32, CPU)
    load_weights(from_folder, iter_hf_weights(folder, config), progress=False)
    in_memory = build_model(config, torch.float32, CPU)
    load_weights(in_memory, hf.state_dict().items(), progress=False)
    for (name, a), b in zip(from_folder.named_parameters(), in_memory.parameters()):
        assert torch.equal(a, b), name


def test_unknown_expert_tensor_is_a_clear_error(hf_models):
    from nanograph.loader import ModelLoadError

    config = read_hf_config(hf_models["qwen3_moe"][1])
    model = build_model(config, torch.float32, CPU)
    for name in ("model.layers.0.mlp.experts.1.fc.weight", "model.layers.0.mlp.experts.x.up"):
        with pytest.raises(ModelLoadError, match="has no place in the model"):
            load_weights(model, [(name, torch.zeros(1))], progress=False)


def test_mxfp4_dequantization_matches_transformers():
    """Every byte and a spread of scales, bit for bit against transformers' own dequantization
    (the ``[E, in, out]`` layout included)."""
    mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
    from nanograph.loader.mxfp4 import Mxfp4Tensor

    g = torch.Generator().manual_seed(0)
    blocks = torch.arange(256, dtype=torch.uint8).repeat(12)[torch.randperm(3072, generator=g)]
    blocks = blocks.reshape(3, 16, 4, 16)  # 3 experts, 16 outputs, 4 groups of 32 inputs
    scales = torch.randint(110, 145, (3, 16, 4), generator=g, dtype=torch.uint8)
    packed = Mxfp4Tensor(blocks, scales)
    assert packed.shape == (3, 128, 16)
    for dtype in (torch.float32, torch.bfloat16):
        ours = packed.dequantize(CPU, dtype)
        theirs = mxfp4.convert_moe_packed_tensors(blocks, scales, dtype=dtype)
        assert ours.dtype == dtype and ours.shape == packed.shape
        assert torch.equal(ours, theirs), dtype


@pytest.fixture(scope="module")
def mxfp4_folder(hf_models, tmp_path_factory):
    folder = tmp_path_factory.mktemp("mxfp4") / "gpt-oss"
    save_mxfp4_copy(hf_models["gpt_oss"][1], folder)
    return folder


def test_mxfp4_checkpoint_loads_as_transformers_dequantizes_it(hf_models, mxfp4_folder):
    """The released gpt-oss checkpoints' form (MXFP4 experts, a pair's halves in two shards):
    our weights equal transformers' dequantized ones exactly, and so do the logits."""
    import transformers
    from test_model_reference import run_chunks

    hf = transformers.AutoModelForCausalLM.from_pretrained(
        mxfp4_folder, quantization_config=transformers.Mxfp4Config(dequantize=True),
        dtype=torch.float32,
    ).eval()  # fmt: skip
    config = read_hf_config(mxfp4_folder)
    model = build_model(config, torch.float32, CPU)
    load_weights(model, iter_hf_weights(mxfp4_folder, config), progress=False)
    theirs = dict(hf.named_parameters())
    for name, ours in model.hf_state_dict().items():
        assert torch.equal(ours, theirs[name]), name
    original = hf_models["gpt_oss"][0].model.layers[0].mlp.experts.gate_up_proj
    assert not torch.equal(theirs["model.layers.0.mlp.experts.gate_up_proj"], original)
    kv = KVCache(config, num_pages=16, page_size=4, dtype=torch.float32, device=CPU)
    ids = _prompts()[0]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(run_chunks(model, kv, ids, [len(ids)]), ref, atol=1e-4, rtol=1e-4)
    llm = LLM(str(mxfp4_folder), page_size=4, kv_cache_bytes=2**20, progress=False)
    [out] = llm.generate([ids], GREEDY)
    with torch.no_grad():
        expected = hf.generate(
            torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=GREEDY.max_tokens, do_sample=False, eos_token_id=None, pad_token_id=0,
        )  # fmt: skip
    assert out.token_ids == expected[0, len(ids) :].tolist()


def _mxfp4_llm(folder, **kw):
    args = dict(moe_backend="triton", page_size=4, kv_cache_bytes=2**20, progress=False)
    return LLM(str(folder), **{**args, **kw})


def _greedy_with_logprobs(llm, prompts):
    """Greedy tokens, and each step's top-5 log-probabilities (tiny random models often
    repeat one token: the log-probabilities are what tells two models apart)."""
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, logprobs=5)
    outs = llm.generate(prompts, params)
    tops = [[[lp for _, lp in step.top] for step in o.logprobs] for o in outs]
    return [o.token_ids for o in outs], torch.tensor(tops)


@needs_triton
def test_mxfp4_experts_stay_packed_and_match_their_dequantized_model(mxfp4_folder):
    """``quantization="mxfp4"``: the experts hold the checkpoint's codes and scales as they
    are (a quarter of float32's bytes and less), and the model computes what the dequantized
    one computes with the same kernels: logits to float32 rounding, the same greedy tokens."""
    from safetensors import safe_open
    from test_model_reference import run_chunks

    packed = _mxfp4_llm(mxfp4_folder, quantization="mxfp4")
    dense = _mxfp4_llm(mxfp4_folder)
    experts = packed.engine.model.model.layers[1].mlp
    assert experts.w13.dtype == experts.w13_scales.dtype == torch.uint8
    name = "model.layers.1.mlp.experts.down_proj"
    with safe_open(mxfp4_folder / "model-1.safetensors", "pt") as f:
        assert torch.equal(experts.w2, f.get_tensor(name + "_blocks").flatten(-2))
    with safe_open(mxfp4_folder / "model-2.safetensors", "pt") as f:
        assert torch.equal(experts.w2_scales, f.get_tensor(name + "_scales"))
    assert packed.engine.weights_bytes < dense.engine.weights_bytes
    config = packed.engine.model_config
    assert config.mxfp4_experts
    assert config.active_weights_bytes(4) < config.replace(
        mxfp4_experts=False
    ).active_weights_bytes(4)
    ids = _prompts()[0]  # 19 tokens: the sorted regime (57 pairs)
    logits = []
    for llm in (packed, dense):
        kv = KVCache(config, num_pages=16, page_size=4, dtype=torch.float32, device=CPU)
        logits.append(run_chunks(llm.engine.model, kv, ids, [len(ids)]))
    torch.testing.assert_close(logits[0], logits[1], atol=1e-5, rtol=1e-5)
    prompts = _prompts()  # greedy decode: the pairwise regime
    tokens, tops = _greedy_with_logprobs(packed, prompts)
    dense_tokens, dense_tops = _greedy_with_logprobs(dense, prompts)
    assert tokens == dense_tokens
    torch.testing.assert_close(tops, dense_tops, atol=1e-5, rtol=1e-5)


@needs_triton
def test_mxfp4_dummy_experts(tiny_model_dir):
    """Random MXFP4 experts for benchmarks: codes of every value under one modest scale."""
    llm = _mxfp4_llm(tiny_model_dir("gpt_oss"), load_format="dummy", quantization="mxfp4")
    experts = llm.engine.model.model.layers[0].mlp
    assert bool((experts.w13_scales == 120).all()) and experts.w2.unique().numel() > 200
    [out] = llm.generate([_prompts()[1]], GREEDY)
    assert out.ok and len(out.token_ids) == GREEDY.max_tokens


@needs_triton
def test_mxfp4_experts_refuse_what_cannot_hold_them(tiny_model_dir, mxfp4_folder):
    from nanograph.loader import ModelLoadError

    with pytest.raises(ValueError, match="quantization must be one of"):
        _mxfp4_llm(mxfp4_folder, quantization="int4")
    with pytest.raises(ValueError, match="gpt-oss' format; qwen3_moe"):
        _mxfp4_llm(tiny_model_dir("qwen3_moe"), quantization="mxfp4")
    with pytest.raises(ValueError, match="gpt-oss' format; llama"):
        _mxfp4_llm(tiny_model_dir("llama"), quantization="mxfp4")
    with pytest.raises(ValueError, match="run on the triton MoE backend, not torch_native"):
        _mxfp4_llm(mxfp4_folder, quantization="mxfp4", moe_backend="torch_native")
    with pytest.raises(ModelLoadError, match="drop --quantization mxfp4"):
        _mxfp4_llm(tiny_model_dir("gpt_oss"), quantization="mxfp4")  # a bf16 checkpoint


@needs_triton
def test_mxfp4_experts_tp2_equal_tp1(tmp_path):
    """Each rank keeps its part of the packed pairs: gate/up by output rows, down by whole
    scale groups of its input (an expert width of 64: 32 a rank). A width that leaves a rank
    part of a group is refused."""
    from conftest import make_hf_model

    dense = tmp_path / "dense"
    make_hf_model("gpt_oss", intermediate_size=64).save_pretrained(dense)
    save_mxfp4_copy(dense, tmp_path / "mxfp4")
    prompts = _prompts()
    outs = []
    for tp in (1, 2):
        with _mxfp4_llm(tmp_path / "mxfp4", quantization="mxfp4", tensor_parallel_size=tp,
                        distributed_timeout_s=60) as llm:  # fmt: skip
            outs.append(_greedy_with_logprobs(llm, prompts))
    assert outs[0][0] == outs[1][0]
    torch.testing.assert_close(outs[0][1], outs[1][1], atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="multiples of 32"):
        ModelConfig.from_hf_dict({**TINY["gpt_oss"], "intermediate_size": 64}).replace(
            mxfp4_experts=True, intermediate_size=16
        )


@needs_triton
def test_gemv_bench_times_mxfp4_experts_beside_bf16(monkeypatch):
    """``bench gemv``'s experts of a gpt-oss layer (run here on the CPU, one fake sample a
    timing): the MXFP4 arm runs its default tiles and every swept down tile, and its result is
    the dequantized experts' to bf16 rounding."""
    from nanograph.bench import gemv as bench_gemv

    monkeypatch.setattr(bench_gemv, "graphed_samples", lambda fn, rep_ms: [fn() or 1.0])
    monkeypatch.setattr(bench_gemv, "ROUTINGS", 2)
    # two tiles under the 32K-element cap and one over it (skipped): each interpreted trial
    # costs seconds, and the full grid's 20-odd made this CI's slowest test
    monkeypatch.setattr(bench_gemv, "DOWN_TILES", [(4, 128, 4, 2), (8, 256, 8, 3), (32, 512, 4, 2)])
    config = ModelConfig.from_hf_dict({**TINY["gpt_oss"], "intermediate_size": 64})
    result = bench_gemv.measure_experts(config, sweep=True, rep_ms=1, device="cpu")
    mx = result["mxfp4"]
    assert mx["triton_us"] == 500.0 and mx["weight_bytes"] == 3 * 3 * 64 * 64 * 17 / 32
    assert mx["max_abs_diff_vs_dequantized"] <= 1e-2 * mx["dequantized_max_abs"]
    assert [t["down"] for t in mx["sweep"]] == [t["down"] for t in result["sweep"]]
    assert {t["down"] for t in mx["sweep"]} == {(4, 128, 4, 2), (8, 256, 8, 3)}
    assert mx["best_us"] == 500.0


@needs_triton
def test_bench_decode_and_prefill_take_mxfp4_experts(mxfp4_folder, tmp_path):
    """``bench decode / prefill --quantization mxfp4`` on the CPU: the engines keep the experts
    packed, and the roofline counts their bytes at 17/32 of a byte a weight."""
    import json

    from nanograph.cli import main

    common = ["--models", str(mxfp4_folder), "--arms", "none", "--moe-backend", "triton",
              "--quantization", "mxfp4"]  # fmt: skip
    out = tmp_path / "decode.json"
    assert main(["bench", "decode", *common, "--batches", "1", "--prompt-len", "8",
                 "--new-tokens", "3", "--repeats", "1", "--out", str(out)]) == 0  # fmt: skip
    (entry,) = json.loads(out.read_text())["models"].values()
    packed = read_hf_config(mxfp4_folder).replace(mxfp4_experts=True)
    assert entry["arms"]["eager"]["active_weights_bytes"] == packed.active_weights_bytes(4)
    out = tmp_path / "prefill.json"
    assert main(["bench", "prefill", *common, "--lengths", "16", "--peer-lengths", "",
                 "--repeats", "1", "--load-format", "auto", "--out", str(out)]) == 0  # fmt: skip
    with pytest.raises(SystemExit, match="peer takes dense weights"):
        main(["bench", "prefill", *common, "--lengths", "16", "--peer-lengths", "16",
              "--out", str(out)])  # fmt: skip


def test_mxfp4_checkpoint_missing_scales_is_a_clear_error(mxfp4_folder, tmp_path):
    import json
    import shutil

    from nanograph.loader import ModelLoadError

    broken = tmp_path / "broken"
    shutil.copytree(mxfp4_folder, broken)
    (broken / "model-2.safetensors").unlink()
    index = json.loads((broken / "model.safetensors.index.json").read_text())
    index["weight_map"] = {
        k: v for k, v in index["weight_map"].items() if v != "model-2.safetensors"
    }
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    config = read_hf_config(broken)
    model = build_model(config, torch.float32, CPU)
    with pytest.raises(ModelLoadError, match="_proj_blocks' has no '.*_proj_scales'"):
        load_weights(model, iter_hf_weights(broken, config), progress=False)
