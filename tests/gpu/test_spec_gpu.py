"""Speculative decoding on CUDA graphs: every verify/draft backend combination against the same
speculation with eager runners and against plain decoding, batches that shrink between steps,
verify forwards with padded rows, and the runners' own pools.

float32 keeps the comparison about graphs, not bf16 rounding. Tokens are compared as agreement
rates (as tests/gpu/test_runners_gpu.py does): a graph pads a forward to its captured shape,
and a GEMM over more rows may take another cuBLAS algorithm, so a near-tie can flip; the
runner-level test compares logits of the same padded batch to float32 tolerance instead.
A small random Qwen3 (target) and a smaller one of the same vocabulary (drafter); the
self-draft arm drafts with the target's own weights.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

K = 3
SMALL = dict(
    dtype="float32", page_size=16, chunked_prefill_size=256, prefill_cuda_graph="none",
    cuda_graph_bs=(1, 2, 4, 8), max_num_seqs=16, mem_fraction=0.3, progress=False,
)  # fmt: skip
BACKENDS = ("full", "breakable", "tc_piecewise")


@pytest.fixture(scope="module")
def target_dir(small_qwen3):
    return small_qwen3("spec-target", layers=4, hidden=512, seed=0)


@pytest.fixture(scope="module")
def drafter_dir(small_qwen3):
    return small_qwen3("spec-drafter", layers=2, hidden=256, seed=1)


def workload(seed: int):
    """Prompts with repeats (n-gram drafts match) and without; max_tokens that end requests
    at different steps (the batch shrinks) and near their limit (fewer drafts than k: verify
    rows of different lengths in one forward, padded up to the shape)."""
    from nanograph import SamplingParams

    g = torch.Generator().manual_seed(seed)
    prompts = []
    for i, n in enumerate((300, 40, 7, 128, 90, 16, 64, 33, 5, 70)):
        unit = torch.randint(0, 4096, (max(1, n // 4),), generator=g)
        prompts.append(unit.repeat(4).tolist()[:n] if i % 2 else
                       torch.randint(0, 4096, (n,), generator=g).tolist())  # fmt: skip
    params = [SamplingParams(max_tokens=m, temperature=0, ignore_eos=True)
              for m in (24, 9, 17, 30, 5, 12, 20, 8, 2, 1)]  # fmt: skip
    return prompts, params


def generate(llm, seed: int) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(*workload(seed))]


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    assert [len(t) for t in a] == [len(t) for t in b]
    pairs = [(x, y) for ta, tb in zip(a, b) for x, y in zip(ta, tb)]
    return sum(x == y for x, y in pairs) / len(pairs)


def free(llm) -> None:
    """Drops an engine and gives its memory back before the next one sizes its KV pool."""
    import gc

    del llm
    gc.collect()
    torch.cuda.empty_cache()


@pytest.fixture(scope="module")
def plain_tokens(target_dir):
    from nanograph import LLM

    llm = LLM(target_dir, decode_cuda_graph="none", **SMALL)
    tokens = {seed: generate(llm, seed) for seed in (0, 1)}
    free(llm)
    return tokens


def spec_args(algorithm: str, drafter: str, target_dir: str, drafter_dir: str) -> dict:
    args = dict(speculative_algorithm=algorithm, speculative_num_draft_tokens=K)
    if algorithm == "draft_model":
        args["speculative_draft_model_path"] = target_dir if drafter == "self" else drafter_dir
    return args


ARMS = [("ngram", "-"), ("draft_model", "self"), ("draft_model", "small")]


@pytest.fixture(scope="module")
def eager_spec_tokens(target_dir, drafter_dir):
    """Each arm with every runner eager: the reference graphs must reproduce."""
    from nanograph import LLM

    out = {}
    for algorithm, drafter in ARMS:
        llm = LLM(target_dir, decode_cuda_graph="none", speculative_draft_cuda_graph="none",
                  **spec_args(algorithm, drafter, target_dir, drafter_dir), **SMALL)  # fmt: skip
        out[algorithm, drafter] = {seed: generate(llm, seed) for seed in (0, 1)}
        free(llm)
    return out


# each backend in each role, and three mixed pairs (all nine would take ~2x the device time)
COMBOS = [(b, b) for b in BACKENDS] + [
    ("full", "breakable"), ("breakable", "tc_piecewise"), ("tc_piecewise", "full"),
]  # fmt: skip


@pytest.mark.parametrize(("algorithm", "drafter"), ARMS)
@pytest.mark.parametrize(("verify", "draft"), COMBOS)
def test_backend_combination_equals_eager_speculation_and_plain_decoding(
    target_dir, drafter_dir, plain_tokens, eager_spec_tokens, algorithm, drafter, verify, draft
):
    from nanograph import LLM

    if algorithm == "ngram" and draft != verify:
        pytest.skip("ngram has no draft runners: one case per verify backend")
    llm = LLM(target_dir, decode_cuda_graph=verify, speculative_draft_cuda_graph=draft,
              **spec_args(algorithm, drafter, target_dir, drafter_dir), **SMALL)  # fmt: skip
    for seed in (0, 1):
        got = generate(llm, seed)
        same = agreement(got, eager_spec_tokens[algorithm, drafter][seed])
        # plain decoding, one token per step: the same tokens up to rounding between a k+1-row
        # verify and a one-row decode
        plain = agreement(got, plain_tokens[seed])
        print(f"\n{algorithm}/{drafter} verify={verify} draft={draft} seed={seed}: agreement "
              f"with eager speculation {same:.3f}, with plain decoding {plain:.3f}, "
              f"{llm.engine.speculative.stats.as_dict()}")  # fmt: skip
        assert same >= 0.95 and plain >= 0.95
    runners = llm.engine.runner.graph_runners
    assert runners["verify"].backend.name == verify and runners["verify"].replays > 0
    if algorithm == "draft_model":
        drafts = llm.engine.draft_runner.graph_runners
        assert drafts["draft"].backend.name == draft and drafts["draft"].replays > 0
        # greedy batches under full/breakable replay ONE graph for all k-1 draft steps
        assert drafts["draft"].loop_steps == (K - 1 if draft in ("full", "breakable") else 0)
        assert drafts["draft_extend"].replays > 0
        # one pool per runner: target and draft graphs never share memory
        pools = [r.pool for r in (*runners.values(), *drafts.values())]
        assert len({id(p) for p in pools}) == len(pools)
        if drafter == "self":
            stats = llm.engine.speculative.stats
            assert stats.accepted_tokens >= 0.9 * stats.draft_tokens
    free(llm)


def test_padded_verify_rows_replay_like_eager(target_dir):
    """The verify runner against the eager forward on the same batches: requests of 1..k+1
    rows in one forward, batches that shrink and grow between replays (sentinel slots), each
    padded to the next captured shape. Logits of every row agree to float32 rounding."""
    from nanograph import LLM
    from nanograph.runners.forward_batch import ForwardBatch

    llm = LLM(target_dir, decode_cuda_graph="full", speculative_algorithm="ngram",
              speculative_num_draft_tokens=K, **SMALL)  # fmt: skip
    engine = llm.engine
    runner = engine.runner
    verify = runner.graph_runners["verify"]
    kv, page = engine.kv_cache, engine.config.page_size
    g = torch.Generator().manual_seed(3)
    for rows in ([K + 1, 1, 2, K + 1, 3], [2, 1], [K + 1] * 8, [1], [3, K + 1, 1, 1, 2, 2, 4]):
        cached = [int(c) for c in torch.randint(1, 200, (len(rows),), generator=g)]
        pages = [kv.allocator.allocate(kv.pages_needed(c + r)) for c, r in zip(cached, rows)]
        ids = [torch.randint(0, 4096, (r,), generator=g).tolist() for r in rows]
        batch = ForwardBatch.build(ids, cached, pages, page, [True] * len(rows))
        batch = dataclasses.replace(batch, sample_rows=list(range(batch.num_tokens)))
        assert verify.dispatch(batch) is not None
        eager = runner.model.compute_logits(runner.eager_forward(batch))
        before = verify.replays
        graphed = runner.forward(batch, path="verify")
        assert verify.replays == before + 1
        torch.testing.assert_close(graphed, eager, rtol=1e-4, atol=1e-4)
        for p in pages:
            kv.allocator.free(p)


def test_draft_loop_compiles_one_advance_variant(target_dir, drafter_dir):
    """The draft loop's input advance compiles one variant for every captured batch size (1,
    2, 4, 8: a step's drafts are a row of [steps, slots], 8-byte aligned at odd slot counts),
    which the memory plan's probe capture compiles: the draft runner's own captures compile
    nothing (a variant per slot count made its start-up capture several times the target's)."""
    from nanograph import LLM
    from nanograph.kernels import draft_inputs

    for cache in draft_inputs._advance_kernel.device_caches.values():
        cache[0].clear()  # compiled variants (earlier engines' too): count this engine's
    draft_inputs._launch.runners.clear()
    llm = LLM(target_dir, decode_cuda_graph="full", speculative_draft_cuda_graph="full",
              **spec_args("draft_model", "small", target_dir, drafter_dir), **SMALL)  # fmt: skip
    assert llm.engine.draft_runner.graph_runners["draft"].loop_steps == K - 1
    generate(llm, seed=5)
    variants = sum(len(cache[0]) for cache in draft_inputs._advance_kernel.device_caches.values())
    assert variants == 1
    free(llm)


def test_capture_records_and_memory_report(target_dir, drafter_dir):
    """Every speculative runner reports its capture time and pool in the memory report; the
    draft runners' capture is recorded beside the target's (the bench compares them)."""
    from nanograph import LLM

    llm = LLM(target_dir, decode_cuda_graph="full", speculative_draft_cuda_graph="full",
              **spec_args("draft_model", "small", target_dir, drafter_dir), **SMALL)  # fmt: skip
    report = llm.engine.memory_report()
    assert {"decode", "verify", "draft", "draft_extend"} <= set(report.graph_pools)
    for runner in (*llm.engine.runner.graph_runners.values(),
                   *llm.engine.draft_runner.graph_runners.values()):  # fmt: skip
        assert set(runner.records) == set(runner.shapes) and not runner.failed
