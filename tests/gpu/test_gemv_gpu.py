"""The batch-1 decode GEMV and the few-row products on CUDA: against a float64 product at the
model's shapes, and a decode through the engine with them (the default) against cuBLAS, graphs
captured with each."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CUDA = torch.device("cuda")
# (N, K) of qwen3-8b's q/k/v, o, gate/up and down projections, an odd N, and qwen3-0.6b's
# q/k/v, o and down (the few-row products split o's and down's K range over 4 programs a tile),
# and the MoE routers of qwen3-30b-a3b and gpt-oss-20b (one row a program)
SHAPES = [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (1000, 4096),
          (4096, 1024), (1024, 2048), (1024, 3072), (128, 2048), (32, 2880)]  # fmt: skip


@pytest.mark.parametrize("silu_mul", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_gemv_matches_float64(shape, silu_mul):
    from nanograph.kernels import fused
    from nanograph.kernels.gemv import gemv

    n, k = shape
    g = torch.Generator(device=CUDA).manual_seed(n)
    x = torch.randn(1, 2 * k if silu_mul else k, device=CUDA, generator=g).bfloat16()
    w = (torch.randn(n, k, device=CUDA, generator=g) / k**0.5).bfloat16()
    out = gemv(x, w, silu_mul=silu_mul)
    row = fused.silu_and_mul(x) if silu_mul else x
    expected = row.double() @ w.double().T
    # bf16 output: one rounding of values of size ~1
    torch.testing.assert_close(out.double(), expected, rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("silu_out", [False, True])
@pytest.mark.parametrize("m", [2, 5, 8, 16])
@pytest.mark.parametrize("shape", SHAPES)
def test_gemm_rows_matches_float64(shape, m, silu_out):
    """Every tile ``choose_tiles`` picks at qwen3-8b's shapes (both stage counts; the gate/up
    activation in the epilogue, gate and up rounded to bf16 first as the plain product writes
    them), 2 to 16 rows, and an odd N."""
    from nanograph.kernels import fused
    from nanograph.kernels.rows import gemm_rows

    n, k = shape
    g = torch.Generator(device=CUDA).manual_seed(n + m)
    x = torch.randn(m, k, device=CUDA, generator=g).bfloat16()
    w = (torch.randn(2 * n if silu_out else n, k, device=CUDA, generator=g) / k**0.5).bfloat16()
    out = gemm_rows(x, w, silu_out=silu_out)
    expected = x.double() @ w.double().T
    if silu_out:
        expected = fused.silu_and_mul(expected.bfloat16()).double()
    assert out.shape == (m, n)
    torch.testing.assert_close(out.double(), expected, rtol=1e-2, atol=2e-2)


def test_split_k_products_replay_in_a_graph():
    """A split-K few-row product (qwen3-0.6b's o: 16 weight tiles x 4 programs) captured once
    and replayed on new rows: each replay matches float64, and every tile's counter is back
    to zero after each (the next launch relies on it)."""
    from nanograph.kernels.counters import _COUNTERS
    from nanograph.kernels.rows import choose_tiles, gemm_rows

    assert choose_tiles(1024, 2048, torch.cuda.current_device()).split_k > 1
    g = torch.Generator(device=CUDA).manual_seed(3)
    w = (torch.randn(1024, 2048, device=CUDA, generator=g) / 2048**0.5).bfloat16()
    x = torch.zeros(5, 2048, device=CUDA, dtype=torch.bfloat16)
    out = torch.empty(5, 1024, device=CUDA, dtype=torch.bfloat16)
    gemm_rows(x, w, out=out)  # eager first: the graph lane's counters, compiles
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        gemm_rows(x, w, out=out)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            gemm_rows(x, w, out=out)
    torch.cuda.synchronize()
    for seed in range(3):
        x.copy_(torch.randn(5, 2048, device=CUDA, generator=g.manual_seed(seed)))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out.double(), x.double() @ w.double().T, rtol=1e-2, atol=2e-2)
        assert all(int(buf.abs().sum()) == 0 for bufs in _COUNTERS.values() for buf in bufs)


def test_decode_with_the_gemv_matches_cublas():
    """qwen3-0.6b (random weights), full decode graphs at batch 1 and 2: greedy decoding with
    the GEMV (batch 1) and the few-row products (batch 2 and the prefill's two sampled rows)
    against cuBLAS. bf16 sums in another order may flip a near-tie, after which the two
    sequences differ: up to each sequence's first difference the tokens' log-probabilities
    agree, and the first difference is a near-tie in both runs (the two tokens' log-probabilities
    within a small margin). The Triton products ran only when on."""
    from nanograph import LLM, SamplingParams
    from nanograph.kernels import gemv as gemv_module
    from nanograph.kernels import rows as rows_module
    from nanograph.layers import ops

    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 151936, (n,), generator=g).tolist() for n in (40, 70)]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=2)
    outputs = {}
    for on in (False, True):
        ops.use_triton_gemv(on)
        try:
            launches = (gemv_module._launch, rows_module._launch)
            before = [launch.direct_launches for launch in launches]
            llm = LLM("qwen3-0.6b", load_format="dummy", cuda_graph_bs=(1, 2), max_num_seqs=2,
                      mem_fraction=0.3, progress=False, cuda_graph_capture="startup")  # fmt: skip
            # the second prompt alone first (batch 1), then both (batch 2)
            outputs[on] = llm.generate(prompts[1:], params) + llm.generate(prompts, params)
            ran = [launch.direct_launches - b for launch, b in zip(launches, before)]
            del llm
        finally:
            ops.use_triton_gemv(True)
        assert [r > 0 for r in ran] == [on, on]
    compared = 0
    for plain, triton_out in zip(outputs[False], outputs[True]):
        for a, b in zip(plain.logprobs, triton_out.logprobs):
            if a.top[0][0] != b.top[0][0]:  # the first difference: a near-tie in both runs
                for lp in (a, b):
                    assert lp.top[0][1] - lp.top[1][1] < 0.2, (a, b)
                assert {a.top[0][0], b.top[0][0]} == {a.top[0][0], a.top[1][0]}
                break
            assert abs(a.logprob - b.logprob) < 0.1, (a, b)
            compared += 1
    print(f"\n{compared} positions agree before any near-tie flip")
    assert compared >= 8


@pytest.mark.parametrize("shape", [(151936, 1024), (151936, 4096), (201088, 2880), (1000, 1024)])
def test_lm_head_logits_equal_the_product_cast_to_float32(shape):
    """``ops.logits`` of one row (the GEMV writing float32 rounded to bf16, in the LM head's
    tiles above ``LM_HEAD_ROWS``) equals the bf16 GEMV's product cast, bit for bit, and is
    close to a float64 product."""
    from nanograph.kernels.gemv import gemv
    from nanograph.layers import ops

    n, k = shape
    g = torch.Generator(device=CUDA).manual_seed(n + k)
    x = torch.randn(1, k, device=CUDA, generator=g).bfloat16()
    w = (torch.randn(n, k, device=CUDA, generator=g) / k**0.5).bfloat16()
    logits = ops.logits(x, w)
    assert logits.dtype == torch.float32 and logits.shape == (1, n)
    assert torch.equal(logits, gemv(x, w).float())
    torch.testing.assert_close(logits.double(), x.double() @ w.double().T, rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("rows", [1, 3, 64])
@pytest.mark.parametrize("width", [151936, 201088, 4096, 1000])
def test_argmax_equals_torch(rows, width):
    """The device argmax against torch's on logits-like rows: random, heavy ties (bf16-rounded
    values cast to float32, as the LM head writes them), a -inf row, the maximum repeated in
    every part; twice each, so the counters are found zeroed again."""
    from nanograph.kernels.argmax import argmax

    g = torch.Generator(device=CUDA).manual_seed(rows * width)
    x = torch.randn(rows, width, device=CUDA, generator=g)
    cases = [x, x.bfloat16().float(), (x * 4).round(), torch.full_like(x, float("-inf"))]
    for logits in cases:
        for _ in range(2):
            assert torch.equal(argmax(logits), logits.argmax(dim=-1))
    assert torch.equal(argmax(x.bfloat16()), x.bfloat16().argmax(dim=-1))
