"""Tensor parallelism on two GPUs (NCCL): TP=2 greedy tokens equal TP=1 eager under every graph
backend, with the all-reduces captured inside the decode and prefill graphs; 1,000 decode
replays with NCCL in the graph leave device memory where it was. Skipped without 2 GPUs."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")

GRAPH_BACKENDS = ["full", "breakable", "tc_piecewise"]


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 17, 40, 90)]


def run(path, backend: str, tp: int) -> tuple[list[list[int]], dict]:
    from nanograph import LLM, SamplingParams

    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    with LLM(
        str(path), dtype="float32", mem_fraction=0.3, progress=False, tensor_parallel_size=tp,
        decode_cuda_graph=backend, prefill_cuda_graph=backend, cuda_graph_bs=(1, 4),
        prefill_graph_tokens=(64, 256), max_num_seqs=4, distributed_timeout_s=120,
    ) as llm:  # fmt: skip
        outs = llm.generate(prompts(), params)
        return [o.token_ids for o in outs], llm.engine.runner.forward_counts()


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    return run(tiny_model_dir("qwen3"), "none", 1)[0]


@pytest.mark.parametrize("backend", GRAPH_BACKENDS)
def test_tp2_graphs_equal_tp1_eager(tiny_model_dir, reference, backend):
    tokens, counts = run(tiny_model_dir("qwen3"), backend, 2)
    print(f"\nTP=2 {backend}: forwards {counts}")
    assert counts["decode"]["graph"] > 0 and counts["prefill"]["graph"] > 0  # NCCL replayed
    assert tokens == reference


def test_moe_tp2_full_graphs_equal_tp1_eager(tiny_model_dir):
    path = tiny_model_dir("qwen3_moe")
    tokens, counts = run(path, "full", 2)
    assert counts["decode"]["graph"] > 0
    assert tokens == run(path, "none", 1)[0]


def test_nccl_in_graphs_replays_1000_steps_without_memory_growth():
    from nanograph import LLM, SamplingParams

    with LLM(
        "qwen3-0.6b", load_format="dummy", tensor_parallel_size=2, mem_fraction=0.5,
        progress=False, decode_cuda_graph="full", cuda_graph_bs=(1,), max_model_len=1200,
        distributed_timeout_s=120,
    ) as llm:  # fmt: skip
        prompt = [[1, 2, 3, 4, 5, 6, 7, 8]]
        llm.generate(prompt, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
        runner = llm.engine.runner.graph_runners["decode"]
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        replays = runner.replays
        out = llm.generate(prompt, SamplingParams(max_tokens=1000, temperature=0, ignore_eos=True))
        torch.cuda.synchronize()
        after = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    print(f"\n1000 TP=2 decode replays: allocated/reserved {before} -> {after}")
    assert len(out[0].token_ids) == 1000
    assert runner.replays - replays >= 999
    assert after == before
