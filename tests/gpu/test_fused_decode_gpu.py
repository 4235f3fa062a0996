"""The fused batch-1 decode on CUDA: the GEMV's RMSNorm prologue and residual epilogue against
float64 at qwen3-0.6b's and qwen3-8b's shapes; a decode with full graphs fused against unfused
(greedy agreement in bf16); and the kernels one eager decode forward launches, fused and not.
The fused few-row layers (2 to 8 rows): their products against float64, and a decode step's
logits from their graphs against the unfused path's."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CUDA = torch.device("cuda")
# (N, K) of the normalised products (q/k/v, gate/up) of qwen3-0.6b and qwen3-8b, and an odd one
NORM_SHAPES = [(4096, 1024), (6144, 1024), (6144, 4096), (24576, 4096), (1000, 4095)]
# (N, K) of the products with a residual add (o, down), and an odd one
RESIDUAL_SHAPES = [(1024, 2048), (1024, 3072), (4096, 4096), (4096, 12288), (1001, 4096)]


def _randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator(device=CUDA).manual_seed(seed)
    return (scale * torch.randn(shape, device=CUDA, generator=g)).bfloat16()


@pytest.mark.parametrize("shape", NORM_SHAPES)
def test_norm_prologue_matches_float64(shape):
    from nanograph.kernels import reference
    from nanograph.kernels.gemv import gemv

    n, k = shape
    x = _randn(1, k, seed=n, scale=4.0)
    w = _randn(n, k, seed=n + 1, scale=k**-0.5)
    norm_w = 1 + _randn(k, seed=n + 2, scale=0.2)
    out = gemv(x, w, norm_weight=norm_w, eps=1e-6)
    want = reference.gemv(x.double(), w.double(), norm_weight=norm_w.double(), eps=1e-6)
    # bf16: the normalised row and the output are each rounded once (values of size ~1)
    torch.testing.assert_close(out.double(), want, rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("shape", [(3072, 1024), (12288, 4096), (1001, 4095)])
def test_norm_and_silu_epilogue_matches_float64(shape):
    """The MLP's gate/up at qwen3-0.6b's and qwen3-8b's shapes (and odd ones): the normalised
    row times the packed [2I, K] weight, only silu(gate) * up written."""
    from nanograph.kernels import reference
    from nanograph.kernels.gemv import gemv

    inter, k = shape
    x = _randn(1, k, seed=inter, scale=4.0)
    w = _randn(2 * inter, k, seed=inter + 1, scale=k**-0.5)
    norm_w = 1 + _randn(k, seed=inter + 2, scale=0.2)
    out = gemv(x, w, norm_weight=norm_w, eps=1e-6, silu_out=True)
    want = reference.gemv(x.double(), w.double(), norm_weight=norm_w.double(), eps=1e-6,
                          silu_out=True)  # fmt: skip
    assert out.shape == (1, inter)
    torch.testing.assert_close(out.double(), want, rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("silu_mul", [False, True])
@pytest.mark.parametrize("shape", RESIDUAL_SHAPES)
def test_residual_epilogue_matches_float64(shape, silu_mul):
    from nanograph.kernels import reference
    from nanograph.kernels.gemv import gemv

    n, k = shape
    x = _randn(1, 2 * k if silu_mul else k, seed=n)
    w = _randn(n, k, seed=n + 1, scale=k**-0.5)
    residual = _randn(1, n, seed=n + 2, scale=4.0)
    want = reference.gemv(x.double(), w.double(), silu_mul=silu_mul, residual=residual.double())
    out = gemv(x, w, silu_mul=silu_mul, residual=residual)
    assert out is residual
    # the sum is rounded to bf16 at |values| up to ~16: 0.0625 ulp
    torch.testing.assert_close(residual.double(), want, rtol=1e-2, atol=6e-2)


@pytest.mark.parametrize(
    ("shape", "kind"), [((5120, 2880), "norm"), ((2880, 4096), "residual"), ((32, 2880), "router")]
)
def test_bias_epilogue_matches_float64(shape, kind):
    """gpt-oss's biased products at its shapes: q/k/v (norm prologue + bias), o (bias, then the
    residual add) and the router (norm + bias, the normalised row written for the experts)."""
    from nanograph.kernels import reference
    from nanograph.kernels.gemv import gemv

    n, k = shape
    x = _randn(1, k, seed=n, scale=3.0)
    w = _randn(n, k, seed=n + 1, scale=k**-0.5)
    bias = _randn(n, seed=n + 2)
    norm_w = _randn(k, seed=n + 3, scale=0.1) + 1
    args, ref = {"bias": bias}, {"bias": bias.double()}
    if kind in ("norm", "router"):
        args |= {"norm_weight": norm_w, "eps": 1e-5}
        ref |= {"norm_weight": norm_w.double(), "eps": 1e-5}
    if kind == "router":
        args["normed_out"], ref["normed_out"] = torch.empty_like(x), torch.empty_like(x).double()
    if kind == "residual":
        residual = _randn(1, n, seed=n + 4, scale=4.0)
        args["residual"], ref["residual"] = residual, residual.double()
    want = reference.gemv(x.double(), w.double(), **ref)
    out = gemv(x, w, **args)
    torch.testing.assert_close(out.double(), want, rtol=1e-2, atol=6e-2)
    if kind == "router":
        torch.testing.assert_close(args["normed_out"].double(), ref["normed_out"], rtol=1e-2,
                                   atol=1e-2)  # fmt: skip


def _engine(graph: str):
    from nanograph import LLM

    return LLM("qwen3-0.6b", load_format="dummy", decode_cuda_graph=graph,
               cuda_graph_bs=(1, 2), max_num_seqs=2, mem_fraction=0.3, progress=False,
               cuda_graph_capture="startup")  # fmt: skip


def test_decode_fused_matches_unfused(monkeypatch):
    """qwen3-0.6b (random weights), full decode graphs at batch 1 and 2: greedy tokens fused
    equal those unfused for nearly every position (bf16 sums in another order may flip a
    near-tie), and the fused GEMVs ran only when on."""
    from conftest import fused_decode_agreement

    from nanograph import SamplingParams
    from nanograph.layers import ops

    calls = []
    real = ops.norm_linear
    monkeypatch.setattr(ops, "norm_linear", lambda *a, **k: calls.append(1) or real(*a, **k))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 151936, (n,), generator=g).tolist() for n in (40, 70)]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    agree = fused_decode_agreement(lambda: _engine("full"), prompts, params, calls)
    print(f"\ngreedy agreement, fused vs unfused: {agree:.3f}")
    assert agree > 0.9


@pytest.mark.parametrize(
    "hidden, n, silu_out",
    [(1024, 4096, False), (1024, 6144, True), (4096, 6144, False), (4096, 24576, True)],
)
@pytest.mark.parametrize("m", [2, 5, 8])
def test_rows_norm_handover_matches_float64(hidden, n, silu_out, m):
    """The few-row products taking an RMSNorm in, at qwen3-0.6b's and qwen3-8b's shapes (the
    tiles ``choose_tiles`` gives; o's split-K at 0.6b): o adds into the stream and readies the
    norm (``gemm_rows_normed``), q/k/v or gate/up takes it (``norm``), against float64."""
    from nanograph.kernels import reference
    from nanograph.kernels.rows import gemm_rows, gemm_rows_normed

    stream = _randn(m, hidden, seed=m, scale=4.0)
    attended = _randn(m, 2048 if hidden == 1024 else 4096, seed=m + 1)
    w_o = _randn(hidden, attended.shape[1], seed=m + 2, scale=attended.shape[1] ** -0.5)
    g = 1 + _randn(hidden, seed=m + 3, scale=0.1)
    w = _randn(n, hidden, seed=m + 4, scale=hidden**-0.5)
    want = stream.double() + (attended.double() @ w_o.double().T).bfloat16().double()
    normed = gemm_rows_normed(attended, w_o, stream, (g, 1e-6))
    # the sum is rounded to bf16 at |values| up to ~16: 0.0625 ulp
    torch.testing.assert_close(stream.double(), want, rtol=1e-2, atol=6e-2)
    h = reference.rmsnorm(stream.double(), g.double(), 1e-6)
    expected = h @ w.double().T
    if silu_out:
        expected = reference.silu_and_mul(expected)
    got = gemm_rows(normed.scaled, w, silu_out=silu_out, norm=normed)
    torch.testing.assert_close(got.double(), expected, rtol=2e-2, atol=2e-2)


def test_fused_rows_as_close_to_float32_as_unfused(monkeypatch):
    """qwen3-0.6b (random weights): prefills of 2, 5 and 8 tokens (forwards the fused few-row
    layers take; a small decode batch's are the same products) in bf16 with the fused layers
    (the default on CUDA) and without, against the same weights in float32. The fused path
    rounds the stream times the norm's weight where the unfused one rounds the normalised row:
    its logits are as close to float32's as the unfused ones (within 1.5x: 28 random layers
    amplify either rounding), and its products ran only when on."""
    from nanograph import LLM
    from nanograph.bench.floor import step_batch
    from nanograph.layers import ops

    calls = []
    real = ops.norm_rows_linear
    monkeypatch.setattr(ops, "norm_rows_linear",
                        lambda *a, **k: calls.append(1) or real(*a, **k))  # fmt: skip
    engines = {
        dtype: LLM(
            "qwen3-0.6b",
            load_format="dummy",
            dtype=dtype,
            decode_cuda_graph="none",
            prefill_cuda_graph="none",
            max_num_seqs=2,
            mem_fraction=0.2,
            progress=False,
        )  # fmt: skip
        for dtype in ("bfloat16", "float32")
    }
    bf16, fp32 = (engines[d].engine.runner for d in ("bfloat16", "float32"))
    with torch.no_grad():
        for (name, p), (_, q) in zip(bf16.model.named_parameters(), fp32.model.named_parameters()):
            assert q.dtype == torch.float32, name
            q.copy_(p.float())  # the bf16 weights, exactly
    for tokens in (2, 5, 8):
        batches = {}
        for dtype, llm in engines.items():
            torch.manual_seed(tokens)  # the same prompt in both
            batches[dtype] = step_batch(llm, tokens)
        calls.clear()
        want = fp32.forward(batches["float32"][0]).double()
        assert not calls
        got = {}
        for mode in ("auto", "off"):
            ops.set_fused_rows(mode)
            try:
                got[mode] = bf16.forward(batches["bfloat16"][0]).double()
            finally:
                ops.set_fused_rows("auto")
            assert bool(calls) == (mode == "auto")
            calls.clear()
        for dtype, (_, pages) in batches.items():
            for p in pages:
                engines[dtype].engine.kv_cache.allocator.free(p)
        largest = want.abs().max().item()
        err = {mode: (logits - want).abs().max().item() / largest for mode, logits in got.items()}
        print(f"\n{tokens} tokens: against float32, fused rows {err['auto']:.4f} of the "
              f"largest logit, unfused {err['off']:.4f}")  # fmt: skip
        assert err["auto"] <= 1.5 * err["off"] + 1e-3


def test_fused_decode_launches_two_kernels_fewer_a_layer():
    """One eager decode forward at batch 1: the fused path launches two kernels a layer fewer
    (the norms: layer 0's rmsnorm and add_rmsnorm, every other layer's add_rmsnorm pair; the
    final norm stays) and drops layer 0's residual clone. Rope + KV store is in the attention
    kernel on both paths (the Triton backend rotates in attention in every decode). Neither
    path zero-fills the attention output. Kernels, memsets and copies are counted together:
    which one a fill or a clone is is torch's choice."""
    from nanograph.bench.decode import step_kernels
    from nanograph.layers import ops

    work = {}
    for mode in ("off", "auto"):
        ops.set_fused_decode(mode)
        try:
            llm = _engine("none")
            counts = step_kernels(llm, 1, 64)
            layers = llm.engine.model_config.num_hidden_layers
            del llm
        finally:
            ops.set_fused_decode("auto")
        print(f"\nkernels a decode forward ({mode}): {counts}")
        work[mode] = counts["kernels"] + counts["memsets"] + counts["copies"]
    assert work["off"] - work["auto"] == 2 * layers + 1


def test_auto_fuses_up_to_the_hidden_size_where_fusion_pays():
    """``auto`` fuses a one-row bf16 dense layer up to ``FUSED_DECODE_MAX_HIDDEN`` (qwen3-0.6b)
    and not past it (qwen3-4b's 2560, qwen3-8b's 4096: their normalising gate/up GEMVs cost
    more than the norm kernels they remove), a MoE layer at any size (gpt-oss-20b's 2880);
    ``always`` fuses at any size, ``off`` at none."""
    from nanograph.layers import ops

    small = torch.zeros(1, ops.FUSED_DECODE_MAX_HIDDEN, dtype=torch.bfloat16, device=CUDA)
    large = torch.zeros(1, 2560, dtype=torch.bfloat16, device=CUDA)
    applies = {}
    for mode in ("auto", "always", "off"):
        ops.set_fused_decode(mode)
        try:
            applies[mode] = (
                ops.fused_decode_applies(small), ops.fused_decode_applies(large),
                ops.fused_decode_applies(large, moe=True),
            )  # fmt: skip
        finally:
            ops.set_fused_decode("auto")
    assert applies == {
        "auto": (True, False, True), "always": (True, True, True), "off": (False, False, False)
    }  # fmt: skip
