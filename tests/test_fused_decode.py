"""The fused batch-1 decode path on CPU (TRITON_INTERPRET=1): the GEMV's RMSNorm prologue,
SiLU-and-mul epilogue and residual epilogue against float64 references, and a tiny Qwen3 and
Llama whose greedy tokens are the same with the fused path forced on ("always") and off.

TRITON_INTERPRET is read when a kernel is decorated, so it is set before
``nanograph.kernels.gemv`` is imported (reloaded if something imported it earlier). Skipped on
a machine with CUDA: tests/gpu/test_fused_decode_gpu.py covers the compiled kernels there.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("CUDA present: tests/gpu cover the compiled kernels", allow_module_level=True)
os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

if "nanograph.kernels.gemv" in sys.modules:
    gemv = importlib.reload(sys.modules["nanograph.kernels.gemv"])
else:
    gemv = importlib.import_module("nanograph.kernels.gemv")
if "nanograph.kernels.moe" in sys.modules:  # the MoE layer's experts (triton backend)
    importlib.reload(sys.modules["nanograph.kernels.moe"])
if "nanograph.kernels.rows" in sys.modules:  # the few-row products (fused few rows)
    importlib.reload(sys.modules["nanograph.kernels.rows"])
from nanograph.kernels import reference  # noqa: E402
from nanograph.layers import ops  # noqa: E402

TOLERANCE = {torch.float32: 2e-4, torch.bfloat16: 3e-2}
# 8 output rows a program and 16-wide K blocks: odd N and K cover partial tiles on both edges
TILES = gemv.GemvTiles(block_n=8, block_k=16, num_warps=1, num_stages=1)


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.double()


def count_calls(monkeypatch, module, names, calls: dict | None = None) -> dict[str, int]:
    """Counts every call of ``module.<name>`` for ``names`` in ``calls`` (the real one runs)."""
    calls = {} if calls is None else calls
    for name in names:
        calls[name] = 0
        real = getattr(module, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n", "k"), [(37, 70), (5, 16), (64, 33)])
def test_norm_prologue_matches_float64(dtype, n, k):
    """gemv(x, w, norm_weight) == rmsnorm(x) @ w^T: the un-normalised row, normalised on load
    (1/rms over the whole row, K blocks that do not divide K)."""
    g = torch.Generator().manual_seed(n * k)
    x = (3 * torch.randn(1, k, generator=g)).to(dtype)  # rms far from 1: the norm matters
    w = torch.randn(n, k, generator=g).to(dtype)
    norm_w = (1 + 0.3 * torch.randn(k, generator=g)).to(dtype)
    out = gemv.gemv(x, w, norm_weight=norm_w, eps=1e-5, tiles=TILES)
    want = reference.gemv(_f64(x), _f64(w), norm_weight=_f64(norm_w), eps=1e-5)
    assert out.dtype == dtype and out.shape == (1, n)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol * 8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n", "k"), [(37, 70), (128, 48)])
def test_norm_prologue_writes_the_normed_row(dtype, n, k):
    """A MoE router's GEMV: gemv(x, w, norm_weight, normed_out) == rmsnorm(x) @ w^T,
    and ``normed_out`` holds rmsnorm(x) as the norm kernel writes it (the experts' input), in
    full though each program normalises only the row it multiplies (here 5 and 16 programs
    over several K blocks)."""
    g = torch.Generator().manual_seed(n + k)
    x = (3 * torch.randn(1, k, generator=g)).to(dtype)
    w = torch.randn(n, k, generator=g).to(dtype)
    norm_w = (1 + 0.3 * torch.randn(k, generator=g)).to(dtype)
    normed = torch.full((1, k), float("nan"), dtype=dtype)
    out = gemv.gemv(x, w, norm_weight=norm_w, eps=1e-5, normed_out=normed, tiles=TILES)
    want = reference.gemv(_f64(x), _f64(w), norm_weight=_f64(norm_w), eps=1e-5)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol * 8)
    # the norm kernel's row: equal in float32, within one unit of the last place in bf16
    ulp = 0.0 if dtype == torch.float32 else 2.0**-7
    torch.testing.assert_close(normed, reference.rmsnorm(x, norm_w, 1e-5), rtol=ulp, atol=0)
    torch.testing.assert_close(normed.double(), reference.rmsnorm(_f64(x), _f64(norm_w), 1e-5),
                               rtol=tol, atol=tol)  # fmt: skip
    with pytest.raises(ValueError, match="needs norm_weight"):
        gemv.gemv(x, w, normed_out=normed)
    with pytest.raises(ValueError, match=f"normed_out must be a contiguous \\[1, {k}\\]"):
        gemv.gemv(x, w, norm_weight=norm_w, normed_out=torch.empty(1, k + 1, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bias_epilogue_matches_float64(dtype):
    """A bias (q/k/v and o of Qwen2 and gpt-oss, gpt-oss's router) is added before the
    product's one rounding, alone, behind the norm prologue, and before a residual add (which
    then adds the rounded biased product, as the unfused path adds F.linear's output)."""
    g = torch.Generator().manual_seed(11)
    n, k = 45, 50
    x = (3 * torch.randn(1, k, generator=g)).to(dtype)
    w = torch.randn(n, k, generator=g).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype)
    norm_w = (1 + 0.3 * torch.randn(k, generator=g)).to(dtype)
    residual = torch.randn(1, n, generator=g).to(dtype)
    tol = TOLERANCE[dtype]
    cases = [
        (dict(), dict()),
        (dict(norm_weight=norm_w, eps=1e-5), dict(norm_weight=_f64(norm_w), eps=1e-5)),
        (dict(residual=residual.clone()), dict(residual=_f64(residual))),
    ]
    for args, ref_args in cases:
        out = gemv.gemv(x, w, bias=bias, tiles=TILES, **args)
        want = reference.gemv(_f64(x), _f64(w), bias=_f64(bias), **ref_args)
        torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol * 8)
    with pytest.raises(ValueError, match=f"bias must be a contiguous \\[{n}\\]"):
        gemv.gemv(x, w, bias=torch.zeros(n + 1, dtype=dtype))


@pytest.mark.parametrize("silu_mul", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_residual_epilogue_matches_float64(dtype, silu_mul):
    """gemv(x, w, residual=r) adds the product into r in place and returns r (with silu_mul,
    the down projection's shape: the activation of [1, 2K] first)."""
    g = torch.Generator().manual_seed(7 + silu_mul)
    n, k = 45, 50
    x = torch.randn(1, 2 * k if silu_mul else k, generator=g).to(dtype)
    w = torch.randn(n, k, generator=g).to(dtype)
    residual = torch.randn(1, n, generator=g).to(dtype)
    want = reference.gemv(_f64(x), _f64(w), silu_mul=silu_mul, residual=_f64(residual))
    before = residual.clone()
    out = gemv.gemv(x, w, silu_mul=silu_mul, residual=residual, tiles=TILES)
    assert out is residual and not torch.equal(residual, before)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(residual.double(), want, rtol=tol, atol=tol * 8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("inter", "k", "block_n"), [(37, 70, 8), (24, 33, 4), (3, 16, 2)])
def test_norm_and_silu_epilogue_matches_float64(dtype, inter, k, block_n):
    """gemv(x, w_gate_up, norm_weight, silu_out) == silu_and_mul(rmsnorm(x) @ w^T): a program
    takes matching gate and up rows (n and inter + n) and writes only the activation."""
    g = torch.Generator().manual_seed(inter * k)
    x = (3 * torch.randn(1, k, generator=g)).to(dtype)
    w = torch.randn(2 * inter, k, generator=g).to(dtype)
    norm_w = (1 + 0.3 * torch.randn(k, generator=g)).to(dtype)
    tiles = gemv.GemvTiles(block_n=block_n, block_k=16, num_warps=1, num_stages=1)
    out = gemv.gemv(x, w, norm_weight=norm_w, silu_out=True, tiles=tiles)
    want = reference.gemv(_f64(x), _f64(w), norm_weight=_f64(norm_w), silu_out=True)
    assert out.dtype == dtype and out.shape == (1, inter)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol * 8)


def test_gemv_refuses_bad_fusion_arguments():
    x, w = torch.randn(1, 8), torch.randn(4, 8)
    with pytest.raises(ValueError, match="not both"):
        gemv.gemv(torch.randn(1, 16), w, silu_mul=True, norm_weight=torch.ones(8))
    with pytest.raises(ValueError, match="norm_weight must be a contiguous"):
        gemv.gemv(x, w, norm_weight=torch.ones(9))
    with pytest.raises(ValueError, match="residual must be a contiguous"):
        gemv.gemv(x, w, residual=torch.zeros(1, 5))
    with pytest.raises(ValueError, match="residual must be a contiguous"):
        gemv.gemv(x, w, residual=torch.zeros(1, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="silu_out needs an even number"):
        gemv.gemv(x, torch.randn(5, 8), silu_out=True)
    with pytest.raises(ValueError, match="silu_out needs an even number"):
        gemv.gemv(x, w, silu_out=True, residual=torch.zeros(1, 2))
    with pytest.raises(ValueError, match="give no out"):
        gemv.gemv(x, w, residual=torch.zeros(1, 4), out=torch.zeros(1, 4))
    with pytest.raises(ValueError, match="fused decode mode"):
        ops.set_fused_decode("on")


@pytest.mark.parametrize(
    ("arch", "backend"),
    [("qwen3", "torch_native"), ("llama", "torch_native"), ("qwen3_moe", "torch_native"),
     ("qwen2", "torch_native"), ("gpt_oss", "torch_native"), ("qwen3", "triton")],
)  # fmt: skip
def test_fused_decode_gives_the_unfused_greedy_tokens(tiny_model_dir, monkeypatch, arch,
                                                      backend):  # fmt: skip
    """A tiny random model in float32, two requests decoded one at a time (batch 1) and then
    together: greedy tokens with every one-row forward fused equal those of the unfused path,
    and the fused GEMVs ran only when on (four per layer per one-row forward; a MoE layer: the
    q/k/v and o GEMVs, its router's normalising on load, then its experts adding into the
    stream; Qwen2's q/k/v and gpt-oss's q/k/v, o and router with their biases, gpt-oss's
    sliding window and sinks in its attention). With Triton attention every decode layer's
    attention kernel, fused or not, rotates q/k and stores the new key and value
    (``forward_rope``), as often in both modes."""
    from nanograph import LLM, SamplingParams
    from nanograph.attention.triton_backend import TritonAttention
    from nanograph.models.moe import MoE

    if backend == "triton" and "nanograph.kernels.attention" in sys.modules:
        # interpreted: the kernel's module, then the one that binds it
        importlib.reload(sys.modules["nanograph.kernels.attention_kernel"])
        importlib.reload(sys.modules["nanograph.kernels.attention"])
    moe = arch in ("qwen3_moe", "gpt_oss")
    calls = {"norm_linear": 0, "linear_add": 0, "forward_add": 0, "forward_rope": 0}
    real_rope = TritonAttention.forward_rope

    def counted_rope(self, *args):
        calls["forward_rope"] += 1
        return real_rope(self, *args)

    monkeypatch.setattr(TritonAttention, "forward_rope", counted_rope)
    real_add = MoE.forward_add

    def counted_add(self, *args):
        calls["forward_add"] += 1
        return real_add(self, *args)

    monkeypatch.setattr(MoE, "forward_add", counted_add)
    count_calls(monkeypatch, ops, ("norm_linear", "linear_add"), calls)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (9, 14)]
    # four tokens: each request's later three are one-row decode forwards (the fused path);
    # the interpreter makes every fused step cost seconds in CI
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    tokens, rope_calls = {}, []
    for mode in ("off", "always"):
        ops.set_fused_decode(mode)
        try:
            llm = LLM(str(tiny_model_dir(arch)), dtype="float32", page_size=4,
                      kv_cache_bytes=2**20, progress=False, attention_backend=backend,
                      **({"moe_backend": "triton"} if moe else {}))  # fmt: skip
            alone = [llm.generate([p], params)[0].token_ids for p in prompts]
            together = [o.token_ids for o in llm.generate(prompts, params)]
            tokens[mode] = (alone, together)
        finally:
            ops.set_fused_decode("auto")
        layers = llm.engine.model_config.num_hidden_layers
        fused_calls = calls["linear_add"]  # o and down; o only in a MoE layer
        # q/k/v and gate/up; a MoE layer: q/k/v and its router, normalising on load
        assert calls["norm_linear"] == (2 if moe else 1) * fused_calls
        assert (fused_calls > 0) == (mode == "always")
        assert fused_calls % ((1 if moe else 2) * layers) == 0
        assert calls["forward_add"] == (fused_calls if moe else 0)
        rope_calls.append(calls["forward_rope"] - sum(rope_calls))
    assert tokens["always"] == tokens["off"]
    assert rope_calls[0] == rope_calls[1] and (rope_calls[0] > 0) == (backend == "triton")
    assert all(len(t) == 4 for t in tokens["off"][0])


def test_tc_piecewise_traces_a_one_row_forward_unfused(tiny_model_dir):
    """dynamo traces a one-token forward whole with the fused path forced on: the layers see
    they are being compiled before anything dynamo cannot trace (the fused path is eager-only;
    a failed trace used to leave batch-1 decode uncaptured under tc_piecewise)."""
    from test_model_reference import TORCH_NATIVE

    from nanograph.attention.op import ForwardContext, forward_context
    from nanograph.engine.kv_cache import KVCache
    from nanograph.graph.piecewise_compiler import PiecewiseCompiler, trace_and_split
    from nanograph.loader import iter_hf_weights, load_weights, read_hf_config
    from nanograph.models import build_model
    from nanograph.runners.attention_inputs import eager_inputs
    from nanograph.runners.forward_batch import ForwardBatch

    cpu = torch.device("cpu")
    folder = tiny_model_dir("qwen3")
    config = read_hf_config(folder)
    model = build_model(config, torch.float32, cpu)
    load_weights(model, iter_hf_weights(folder, config), progress=False)
    kv = KVCache(config, num_pages=4, page_size=4, dtype=torch.float32, device=cpu)
    batch = ForwardBatch.build([[7]], [0], [kv.allocator.allocate(1)], kv.page_size, [True])
    tokens, positions = torch.tensor(batch.input_ids), torch.tensor(batch.positions)
    context = ForwardContext(TORCH_NATIVE, eager_inputs(batch, cpu)[2], kv.k, kv.v)
    ops.set_fused_decode("always")
    try:
        with torch.no_grad(), forward_context(context):
            expected = model(tokens, positions)  # eager: the fused path
            compiler = PiecewiseCompiler("eager")
            compiled = trace_and_split(lambda: model(tokens, positions), compiler)
            got = compiled()
    finally:
        ops.set_fused_decode("auto")
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert compiler.splits == {"nanograph::attend": config.num_hidden_layers}


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_fused_rows_give_the_unfused_greedy_tokens(tiny_model_dir, monkeypatch, arch):
    """A tiny random model in float32, two requests decoded together (two-row forwards): greedy
    tokens with the fused few-row path forced on equal the unfused path's, and its products
    (two adding a layer a forward, two normalising but in the first layer, whose input norm
    runs on its own) ran only when on."""
    from nanograph import LLM, SamplingParams

    calls = count_calls(monkeypatch, ops, ("norm_rows_linear", "rows_linear_add"))
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (9, 14)]
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    tokens = {}
    for mode in ("off", "always"):
        ops.set_fused_rows(mode)
        try:
            llm = LLM(str(tiny_model_dir(arch)), dtype="float32", page_size=4,
                      kv_cache_bytes=2**20, progress=False)  # fmt: skip
            tokens[mode] = [o.token_ids for o in llm.generate(prompts, params)]
        finally:
            ops.set_fused_rows("auto")
        layers = llm.engine.model_config.num_hidden_layers
        forwards, rest = divmod(calls["rows_linear_add"], 2 * layers)
        assert rest == 0 and calls["norm_rows_linear"] == forwards * (2 * layers - 1)
        assert (forwards > 0) == (mode == "always")
    assert tokens["always"] == tokens["off"]
    assert all(len(t) == 4 for t in tokens["off"])


def test_set_fused_rows_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match="fused rows mode"):
        ops.set_fused_rows("on")
