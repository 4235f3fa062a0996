"""Speculative decoding in the engine: greedy outputs token-identical to speculation off (real
SmolLM2 weights and tiny random models), with chunked prefill, preemption, prefix caching,
stop conditions and sampled requests; KV roll-back; bad settings refused."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_pages_back, make_llm, requires_smollm2

from nanograph import LLM, SamplingParams
from nanograph.engine.config import EngineConfig, resolve_aliases
from nanograph.engine.request import Request

PER_PAGE = 4 * 2 * 2 * 2 * 16 * 4  # page_size x k/v x layers x kv heads x head_dim x fp32


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return tiny_model_dir("qwen3")


def speculative(tiny_model_dir, tiny, algorithm: str, drafter: str = "self", **kw) -> dict:
    """Engine arguments for ``algorithm``; draft_model drafts with the target itself ("self")
    or with another tiny model of the same vocabulary ("other": low acceptance)."""
    args = dict(speculative_algorithm=algorithm, speculative_num_draft_tokens=3) | kw
    if algorithm == "draft_model":
        path = tiny if drafter == "self" else tiny_model_dir("llama")
        args["speculative_draft_model_path"] = str(path)
    return args


ARMS = [("ngram", "self"), ("draft_model", "self"), ("draft_model", "other")]


def repetitive_prompts(g: torch.Generator, n: int) -> list[list[int]]:
    """Prompts with repeats in them (n-gram drafts find matches) and random ones."""
    out = []
    for i in range(n):
        unit = torch.randint(0, 256, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g)
        body = unit.repeat(int(torch.randint(1, 5, (1,), generator=g))).tolist()
        tail = torch.randint(0, 256, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g)
        out.append(body + tail.tolist() if i % 3 else tail.tolist())
    return out


@requires_smollm2
@pytest.mark.parametrize("algorithm", ["ngram", "draft_model"])
def test_smollm2_greedy_output_equals_speculation_off(algorithm):
    """Real weights, varied prompts (code, counting, prose): the same tokens as plain greedy
    decoding; the draft model is SmolLM2 itself, so it is (almost) always right."""
    prompts = [
        "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
        "1, 2, 3, 4, 5, 6, 7, 8, 9,",
        "The capital of France is",
        "Once upon a time, there was a little girl who lived in a village near the forest.",
        "<ul>\n  <li>apple</li>\n  <li>banana</li>\n  <li>",
    ]
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    reference = [o.token_ids for o in LLM(progress=False).generate(prompts, params)]
    extra = {"speculative_draft_model_path": "smollm2-135m"} if algorithm == "draft_model" else {}
    llm = LLM(progress=False, speculative_algorithm=algorithm, speculative_num_draft_tokens=4,
              **extra)  # fmt: skip
    assert [o.token_ids for o in llm.generate(prompts, params)] == reference
    stats = llm.engine.speculative.stats
    assert stats.accepted_tokens > 0 and stats.mean_accepted_length > 1
    assert 0 <= stats.all_accepted <= stats.requests
    if algorithm == "draft_model":  # self-draft: the drafter proposes the target's tokens
        assert stats.accepted_tokens >= 0.9 * stats.draft_tokens
        assert stats.all_accepted >= 0.5 * stats.requests
    assert_pages_back(llm)


@pytest.mark.parametrize(("algorithm", "drafter"), ARMS)
@pytest.mark.parametrize("seed", [0, 1])
def test_random_workloads_equal_speculation_off(tiny_model_dir, tiny, algorithm, drafter, seed):
    """Random prompts (with repeats), max_tokens, chunk sizes, seat limits and tight pools,
    with prefix caching on: every greedy request gets the tokens of a roomy engine without
    speculation, and every page (target and drafter) comes back."""
    g = torch.Generator().manual_seed(200 + seed)
    n = int(torch.randint(4, 9, (1,), generator=g))
    batch = repetitive_prompts(g, n)
    batch += [batch[0] + [7, 7]]  # a prompt sharing a cached head
    params = [SamplingParams(max_tokens=int(m), temperature=0.0, ignore_eos=True)
              for m in torch.randint(1, 24, (len(batch),), generator=g)]  # fmt: skip
    reference = [o.token_ids for o in make_llm(tiny).generate(batch, params)]
    pages = int(torch.randint(30, 48, (1,), generator=g))
    llm = make_llm(
        tiny,
        kv_cache_bytes=pages * PER_PAGE * (2 if algorithm == "draft_model" else 1),
        chunked_prefill_size=int(torch.randint(4, 40, (1,), generator=g)),
        max_num_seqs=int(torch.randint(1, 6, (1,), generator=g)),
        **speculative(tiny_model_dir, tiny, algorithm, drafter),
    )
    outs = llm.generate(batch, params)
    assert [o.token_ids for o in outs] == reference
    assert all(o.finish_reason == "length" for o in outs)
    assert_pages_back(llm)
    assert not llm.engine.speculative.drafter.states  # nothing kept for finished requests
    kv = llm.engine.draft_kv
    if kv is not None:
        assert kv.allocator.num_free == kv.allocator.num_usable


@pytest.mark.parametrize(("algorithm", "drafter"), ARMS)
def test_preemption_under_speculation(tiny_model_dir, tiny, algorithm, drafter):
    g = torch.Generator().manual_seed(7)
    batch = repetitive_prompts(g, 8)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    reference = [o.token_ids for o in make_llm(tiny).generate(batch, params)]
    scale = 2 if algorithm == "draft_model" else 1
    small = make_llm(tiny, kv_cache_bytes=20 * PER_PAGE * scale,
                     **speculative(tiny_model_dir, tiny, algorithm, drafter))  # fmt: skip
    outs = small.generate(batch, params)
    assert [o.token_ids for o in outs] == reference
    assert sum(o.num_preemptions for o in outs) > 0
    assert_pages_back(small)


@pytest.mark.parametrize(("algorithm", "drafter"), ARMS)
def test_stop_conditions_act_on_accepted_tokens(tiny_model_dir, tiny, algorithm, drafter):
    """Stop tokens, max_tokens and the context length cut the accepted tokens exactly where
    plain decoding stops."""
    g = torch.Generator().manual_seed(3)
    batch = repetitive_prompts(g, 4)
    plain = make_llm(tiny, max_model_len=40)
    spec = make_llm(tiny, max_model_len=40, **speculative(tiny_model_dir, tiny, algorithm, drafter))
    free = plain.generate(batch, SamplingParams(max_tokens=30, temperature=0.0))
    for out, prompt in zip(free, batch):
        cases = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in (1, 2, 5)]
        if len(out.token_ids) > 3:
            cases.append(SamplingParams(max_tokens=30, temperature=0.0,
                                        stop_token_ids=(out.token_ids[3],)))  # fmt: skip
        cases.append(SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True))  # context
        for p in cases:
            want = plain.generate([prompt], p)[0]
            got = spec.generate([prompt], p)[0]
            assert (got.token_ids, got.finish_reason) == (want.token_ids, want.finish_reason), p
    assert_pages_back(spec)


@pytest.mark.parametrize(("algorithm", "drafter"), ARMS)
def test_sampled_requests_finish_with_valid_tokens(tiny_model_dir, tiny, algorithm, drafter):
    """Sampled and greedy requests in one batch: greedy ones still equal plain decoding, sampled
    ones produce max_tokens in-vocabulary tokens (their distribution is the target's: see
    test_spec_acceptance), and a seeded request repeats itself."""
    g = torch.Generator().manual_seed(11)
    batch = repetitive_prompts(g, 6)
    greedy = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    sampled = SamplingParams(max_tokens=16, temperature=0.8, top_k=50, top_p=0.9, seed=5,
                             ignore_eos=True)  # fmt: skip
    params = [greedy if i % 2 else sampled for i in range(len(batch))]
    reference = make_llm(tiny).generate(batch, greedy)
    llm = make_llm(tiny, **speculative(tiny_model_dir, tiny, algorithm, drafter))
    outs = llm.generate(batch, params)
    for i, (out, ref) in enumerate(zip(outs, reference)):
        assert len(out.token_ids) == 16 and all(0 <= t < 256 for t in out.token_ids)
        if i % 2:
            assert out.token_ids == ref.token_ids
    again = llm.generate([batch[0]], sampled)[0]
    assert again.token_ids == llm.generate([batch[0]], sampled)[0].token_ids
    assert_pages_back(llm)


def test_rejected_drafts_give_their_pages_back(tiny_model_dir, tiny):
    """After each step a request holds pages for its tokens only: the pages the scheduler gave
    for drafts that were rejected are back in the pool (the drafter here is a different model,
    so most drafts are rejected)."""
    llm = make_llm(tiny, disable_prefix_caching=True,
                   **speculative(tiny_model_dir, tiny, "draft_model", "other",
                                 speculative_num_draft_tokens=8))  # fmt: skip
    engine = llm.engine
    request = engine.add_request(list(range(1, 11)), SamplingParams(max_tokens=40, temperature=0))
    rejected = 0
    while request.status.value != "finished":
        before = engine.speculative.stats.draft_tokens - engine.speculative.stats.accepted_tokens
        engine.step()
        rejected += (
            engine.speculative.stats.draft_tokens - engine.speculative.stats.accepted_tokens
            - before
        )  # fmt: skip
        if request.status.value != "finished":
            assert len(request.pages) == engine.kv_cache.pages_needed(request.num_tokens)
            assert request.num_computed == request.num_tokens - 1
    assert rejected > 0
    assert_pages_back(llm)


def test_only_accepted_tokens_enter_the_prefix_cache(tiny_model_dir, tiny):
    """A finished request's cached pages hold exactly its prompt and accepted output: a new
    request made of those tokens hits the cache for all of its whole pages."""
    llm = make_llm(tiny, **speculative(tiny_model_dir, tiny, "draft_model", "other"))
    prompt = list(range(1, 14))
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    out = llm.generate([prompt], params)[0]
    follow_up = prompt + out.token_ids + [3]
    short = SamplingParams(max_tokens=2, temperature=0)
    again = llm.generate([follow_up], short)[0]
    assert again.num_cached_tokens == (len(prompt) + len(out.token_ids)) // 4 * 4
    plain = make_llm(tiny).generate([follow_up], short)[0]
    assert again.token_ids == plain.token_ids


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(speculative_algorithm="eagle"), "must be one of"),
        (dict(speculative_algorithm="draft_model"), "needs speculative_draft_model_path"),
        (dict(speculative_draft_model_path="x"), "add speculative_algorithm='draft_model'"),
        (dict(speculative_algorithm="ngram", speculative_num_draft_tokens=0), "1..16"),
        (dict(speculative_algorithm="ngram", speculative_num_draft_tokens=17), "1..16"),
        (dict(speculative_algorithm="ngram", tensor_parallel_size=2), "one rank"),
        (dict(speculative_algorithm="ngram", prompt_lookup_min=0), "got min 0 and max 4"),
        (dict(speculative_algorithm="ngram", prompt_lookup_min=3, prompt_lookup_max=2), "max 2"),
        (dict(speculative_ngram_max_match_window_size=2), "add speculative_algorithm='ngram'"),
    ],
)
def test_bad_speculative_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**resolve_aliases(kwargs))


def test_ngram_window_reaches_the_drafter_and_keeps_outputs(tiny):
    """The n-gram window (SGLang's names, vLLM's prompt_lookup_* as aliases) is the drafter's:
    a window of exactly 3 tokens drafts only after a repeated 3-gram, and greedy outputs stay
    those of speculation off."""
    g = torch.Generator().manual_seed(11)
    batch = repetitive_prompts(g, 6)
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    reference = [o.token_ids for o in make_llm(tiny).generate(batch, params)]
    llm = make_llm(tiny, speculative_algorithm="ngram", prompt_lookup_min=3, prompt_lookup_max=3)
    drafter = llm.engine.speculative.drafter
    assert (drafter.min_n, drafter.max_n) == (3, 3)
    assert [o.token_ids for o in llm.generate(batch, params)] == reference
    request = Request(0, [1, 2, 3, 9, 1, 2, 3], SamplingParams())
    assert drafter.propose([request], [2]).drafts == [[9, 1]]
    request = Request(1, [5, 2, 3, 9, 1, 2, 3], SamplingParams())  # only "2 3" repeats
    assert drafter.propose([request], [2]).drafts == [[]]


def test_draft_cuda_graph_needs_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="needs CUDA"):
        EngineConfig(speculative_algorithm="ngram", speculative_draft_cuda_graph="full")


def test_draft_model_with_another_vocabulary_is_refused(tiny_model_dir, tiny):
    with pytest.raises(ValueError, match="vocabulary"):
        make_llm(tiny, speculative_algorithm="draft_model",
                 speculative_draft_model_path="smollm2-135m")  # fmt: skip


def test_draft_loop_in_one_graph_drafts_what_the_target_decodes(tiny):
    """The draft runner's loop graph (all k-1 steps, metadata advanced on the device) run on
    CPU with the interpreted Triton attention, in a process of its own (tests/spec_draft_loop.py):
    drafting for itself, every draft is accepted, the output equals plain decoding, and the
    batch shrinks from 3 requests to 1 through the loop's shapes (2, 4; sentinel slots)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}  # fmt: skip
    run = subprocess.run([sys.executable, str(root / "tests" / "spec_draft_loop.py"), str(tiny)],
                         capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["identical"]
    assert result["replays"] >= 3 and result["fallbacks"] == 0 and result["eager_steps"] == 0
    assert result["accepted_tokens"] == result["draft_tokens"] > 0


def test_server_metrics_report_acceptance(tiny_model_dir, tiny):
    """The front's stats carry the speculative counters and /metrics exposes them (the
    nanograph_spec_decode_* families, vLLM's names); with speculation off there are none."""
    pytest.importorskip("prometheus_client")
    from types import SimpleNamespace

    from prometheus_client.parser import text_string_to_metric_families

    from nanograph.engine.serving_loop import ServingLoop
    from nanograph.serve.metrics import ServerMetrics

    def scrape(llm) -> dict[str, float]:
        stats = ServingLoop(llm.engine, lambda block: [], lambda *a: None).snapshot()
        text = ServerMetrics(SimpleNamespace(stats=stats)).render().decode()
        return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name.startswith("nanograph_spec_decode")}  # fmt: skip

    prompts = repetitive_prompts(torch.Generator().manual_seed(4), 4)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    spec = make_llm(tiny, **speculative(tiny_model_dir, tiny, "draft_model"))
    spec.generate(prompts, params)
    stats = spec.engine.speculative.stats
    assert stats.draft_tokens > 0
    assert scrape(spec) == {
        "nanograph_spec_decode_num_draft_tokens_total": stats.draft_tokens,
        "nanograph_spec_decode_num_accepted_tokens_total": stats.accepted_tokens,
        "nanograph_spec_decode_num_verifications_total": stats.requests,
        "nanograph_spec_decode_num_emitted_tokens_total": stats.emitted_tokens,
        "nanograph_spec_decode_mean_accepted_length": pytest.approx(stats.mean_accepted_length),
    }
    assert scrape(make_llm(tiny)) == {}
