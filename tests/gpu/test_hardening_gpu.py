"""Hardening on CUDA: preemption under KV pressure in float32 with graphs on, and no kernel
compiled on a request's path (every variant is compiled at start-up)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def prompts(n: int, seed: int, vocab: int = 256, lo: int = 3, hi: int = 60) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi, (n,), generator=g).tolist()
    return [torch.randint(0, vocab, (k,), generator=g).tolist() for k in lengths]


def test_kv_pressure_float32_graphs_equal_an_ample_pool(tiny_model_dir):
    """A pool of 20 pages of 8 for 8 requests of up to 90 tokens: requests are preempted and
    recomputed, through full decode and breakable prefill graphs, in float32; greedy tokens
    equal an engine whose pool holds everything, and every page comes back."""
    from nanograph import LLM, SamplingParams

    path = str(tiny_model_dir("qwen3"))
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    batch = prompts(8, seed=5)
    common = dict(dtype="float32", page_size=8, max_num_seqs=8, chunked_prefill_size=64,
                  cuda_graph_max_bs=8, progress=False, cuda_graph_capture="startup")  # fmt: skip
    ample = LLM(path, **common)
    ref = [o.token_ids for o in ample.generate(batch, params)]
    small = LLM(path, max_total_tokens=160, **common)
    assert small.engine.kv_cache.allocator.num_usable == 20
    assert small.engine.runner.graph_runners.keys() == {"decode", "prefill"}
    outs = small.generate(batch, params)
    assert sum(o.num_preemptions for o in outs) > 0
    assert [o.token_ids for o in outs] == ref
    engine = small.engine  # every page free, or cached with no request reading it
    assert engine.scheduler.num_available_pages == engine.kv_cache.allocator.num_usable


def _compiled_variants() -> dict[str, set[str]]:
    """Per Triton kernel of nanograph, the keys of the variants its JIT caches hold on this
    device (a failure names what compiled late: the kernel and its specialization)."""
    from nanograph.kernels import attention_kernel, fused, gemv

    kernels = [
        attention_kernel._paged_attention_kernel, fused._rmsnorm_kernel, fused._silu_and_mul_kernel,
        fused._rope_store_kv_kernel, gemv._gemv_kernel,
    ]  # fmt: skip
    out = {}
    for kernel in kernels:
        caches = getattr(kernel, "device_caches", None)
        if caches is None:
            pytest.skip("this Triton keeps no device_caches on its JIT functions")
        name = getattr(kernel, "__name__", repr(kernel))
        out[name] = {str(key) for entry in caches.values() for key in entry[0]}
    return out


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("graphs", ["auto", "none"])
def test_no_kernel_compiles_on_a_request_path(tiny_model_dir, dtype, graphs):
    """After start-up, batches of every shape (1-24 requests, 1-450 tokens, chunked, decode at
    many batch sizes, eager fallbacks beyond the graph slots) compile nothing new."""
    from nanograph import LLM, SamplingParams

    llm = LLM(str(tiny_model_dir("qwen3")), dtype=dtype, decode_cuda_graph=graphs,
              prefill_cuda_graph=graphs, chunked_prefill_size=256, max_num_seqs=32,
              cuda_graph_max_bs=16, progress=False, cuda_graph_capture="startup")  # fmt: skip
    before = _compiled_variants()
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    for n, (lo, hi) in [(1, (1, 2)), (1, (450, 451)), (3, (2, 40)), (17, (5, 90)), (24, (1, 8)),
                        (5, (100, 400)), (2, (60, 70))]:  # fmt: skip
        outs = llm.generate(prompts(n, seed=n + lo, lo=lo, hi=hi), params)
        assert all(o.ok for o in outs)
        after = _compiled_variants()
        late = {k: sorted(v - before[k]) for k, v in after.items() if v - before[k]}
        assert not late, f"{n} prompts of {lo}-{hi} tokens compiled on a request path: {late}"


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_nothing_compiles_inside_a_capture_or_after_start_up(tmp_path, monkeypatch, arch):
    """Start-up compiles every variant ahead, so no graph capture compiles a kernel or loads
    one from Triton's disk cache (a compile inside a capture is start-up time spent serially,
    and under background capture it is a request's wait), and nor do requests. The MoE model
    (6 experts, top 4) runs the triton experts, whose tiles follow the token count: its
    prefill shapes reach all four sorted row blocks (16 up to 24 tokens, 32 up to 96, 64 up
    to 191, 128 from 192; kernels.moe.choose_tiles), of which attention's warm-up variants and
    the activation peak's chunk alone miss the 64-row block."""
    from conftest import make_hf_model

    from nanograph import LLM, SamplingParams
    from nanograph.bench.compiles import triton_compiles
    from nanograph.runners import graph_runner

    overrides = {"num_experts_per_tok": 4} if arch == "qwen3_moe" else {}
    make_hf_model(arch, **overrides).save_pretrained(tmp_path)
    inside: list[str] = []
    capture_one = graph_runner.GraphRunner._capture_one

    def watched(self, shape):
        with triton_compiles() as log:
            result = capture_one(self, shape)
        assert log.available
        inside.extend(f"{e.kernel} in {self.path} {shape}" for e in log.events)
        return result

    monkeypatch.setattr(graph_runner.GraphRunner, "_capture_one", watched)
    llm = LLM(str(tmp_path), dtype="bfloat16", chunked_prefill_size=256, max_num_seqs=8,
              cuda_graph_max_bs=8, prefill_graph_tokens=(16, 64, 128, 160, 256), progress=False,
              cuda_graph_capture="startup")  # fmt: skip
    assert not inside, f"compiled or loaded inside captures: {inside}"
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    with triton_compiles() as log:
        for n, (lo, hi) in [(1, (100, 101)), (3, (2, 40)), (2, (150, 200)), (8, (1, 8))]:
            assert all(o.ok for o in llm.generate(prompts(n, seed=n + lo, lo=lo, hi=hi), params))
    assert not [e.kernel for e in log.events], "compiled or loaded on a request path"


def test_activation_peak_covers_a_chunk_of_context_long_requests(small_qwen3):
    """With a context shorter than the chunk the scheduler still fills a forward with a
    chunk's tokens from several requests, so the memory plan's activation peak is such a
    forward's (about one chunk-long request's), not one context-long request's (what it
    measured before stop 62: an eighth of the tokens here, where the old plan's peak was the
    third arm's). Part of a peak does not scale with the tokens (on an H100: ~8.6 of 15 MB at
    1,024 tokens in one request), and 9 requests sample 9 rows' logits, so the bounds compare
    the arms, not the token counts: the short context's plan about one long request's, and
    well above one context-long request's (2.5x on an H100; the old plan gave 1x)."""
    import gc

    from nanograph import LLM

    path = small_qwen3("peak")
    common = dict(dtype="bfloat16", decode_cuda_graph="none", prefill_cuda_graph="none",
                  progress=False)  # fmt: skip
    peaks = {}
    for name, flags in {
        "short context": dict(max_model_len=128, chunked_prefill_size=1024),
        "long context": dict(chunked_prefill_size=1024),
        "one context-long request": dict(max_model_len=128, chunked_prefill_size=127),
    }.items():  # fmt: skip
        llm = LLM(path, **common, **flags)
        peaks[name] = llm.engine.memory.activation_peak
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    print(peaks)
    assert peaks["short context"] >= 0.75 * peaks["long context"], peaks
    assert peaks["short context"] > 1.5 * peaks["one context-long request"], peaks


_COLD_START = """
import json, sys, time
from nanograph import LLM, SamplingParams
from nanograph.bench.compiles import triton_compiles
import nanograph.engine.startup as startup

ahead_done = []
compile_ahead = startup.compile_kernels

def timed(*args, **kwargs):
    seconds = compile_ahead(*args, **kwargs)
    ahead_done.append(time.perf_counter())
    return seconds

startup.compile_kernels = timed
with triton_compiles() as log:
    llm = LLM(sys.argv[1], dtype=sys.argv[2], progress=False, cuda_graph_capture="startup",
              max_num_seqs=16, cuda_graph_max_bs=16, chunked_prefill_size=256)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    llm.generate([[1, 2, 3], list(range(300))], params)
end = ahead_done[0] - log.started
compiled = [(e.kernel, e.at_s) for e in log.events if not e.cache_hit]
print(json.dumps({"attention_ahead": sum(1 for n, at in compiled if "attention" in n and at <= end),
                  "late": [n for n, at in compiled if at > end]}))
"""


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_cold_start_compiles_every_attention_variant_ahead(tiny_model_dir, tmp_path, dtype):
    """With an empty Triton cache, every attention variant compiles in the start-up's
    parallel pass: nothing of attention compiles later (capture, warm-up, requests)."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton"))
    done = subprocess.run(
        [sys.executable, "-c", _COLD_START, str(tiny_model_dir("qwen3")), dtype],
        env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["attention_ahead"] >= (2 if dtype == "bfloat16" else 1), result
    assert not [n for n in result["late"] if "attention" in n], result
