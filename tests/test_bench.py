"""The benchmarks' contracts on a CPU machine (no timings asserted): where they write, which
arms they accept, what they refuse without CUDA, and what their reports record."""

from __future__ import annotations

import importlib.util
import json
import math
import time

import pytest
import torch

from nanograph.bench.common import git_commit, parse_arms
from nanograph.bench.decode import roofline_tok_s
from nanograph.cli import main

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusals")


def test_bench_size_without_out_leaves_committed_results_alone(tmp_path, monkeypatch):
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)  # as if run from the repo root
    assert main(["bench", "size"]) == 0
    assert list(results.iterdir()) == []
    assert json.loads((tmp_path / "bench-out" / "size.json").read_text())["bench"] == "size"


def test_a_tree_that_differs_from_its_commit_is_recorded_dirty(tmp_path, monkeypatch):
    """The device runs a copied tree over a .git that can be stale: its results must not carry
    that commit as if it were exact."""
    import subprocess

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                       check=True, capture_output=True)  # fmt: skip

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("commit", "-qm", "a")
    monkeypatch.chdir(tmp_path)
    clean = git_commit()
    assert len(clean) >= 7 and not clean.endswith("+dirty")
    (tmp_path / "untracked.txt").write_text("results")  # outputs beside the tree are fine
    assert git_commit() == clean
    (tmp_path / "a.py").write_text("x = 2\n")
    assert git_commit() == clean + "+dirty"


def test_eager_arm_has_one_name():
    assert parse_arms("decode", "eager,none:serial", ("serial",)) == ["eager", "eager:serial"]
    with pytest.raises(ValueError, match="unknown arm 'eagre'"):
        parse_arms("prefill", "eagre")
    with pytest.raises(ValueError, match="unknown arm 'eager:fast'"):
        parse_arms("decode", "eager:fast", ("serial", "cublas"))


@needs_no_cuda
@pytest.mark.parametrize(
    "argv",
    [
        ["prefill", "--arms", "eager,full"],
        ["decode", "--arms", "breakable"],
        ["host", "--arms", "tc_piecewise"],
        ["floor", "--graph", "full"],
        ["startup", "--graphs", "breakable"],
    ],
)
def test_graph_arms_are_refused_on_cpu_in_one_line(argv, capsys, tmp_path):
    out = tmp_path / "out.json"
    # --models must name real models (checked first); --model is only read when it loads
    models = ["--models", "qwen3-0.6b"] if argv[0] in ("prefill", "decode") else ["--model", "x"]
    assert main(["bench", *argv, *models, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"bench {argv[0]}" in err and "CUDA" in err and f"{argv[1]} eager" in err
    assert not out.exists()  # refused by the bench, before loading anything


@needs_no_cuda
@pytest.mark.parametrize(
    "argv", [["decode", "--models", "qwen3-0.6b", "--arms", "none:fused"], ["floor", "--model", "x",
             "--graph", "eager", "--fused-decode", "always"]],
)  # fmt: skip
def test_forcing_the_fused_layer_is_refused_on_cpu_in_one_line(argv, capsys, tmp_path):
    """``:fused`` / ``--fused-decode always`` run the fused layer's Triton kernels at any
    hidden size: without CUDA they are refused before anything loads."""
    out = tmp_path / "out.json"
    assert main(["bench", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "need a CUDA device" in err
    assert not out.exists()


@needs_no_cuda
@pytest.mark.parametrize("bench", ["build", "memory", "attention", "graph", "gemv", "coverage"])
def test_cuda_only_benches_refuse_on_cpu_in_one_line(bench, capsys, tmp_path):
    out = tmp_path / "out.json"
    assert main(["bench", bench, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs a CUDA device" in err
    assert not out.exists()


LISTS = [("decode", "--batches"), ("prefill", "--lengths"), ("prefill", "--peer-lengths"),
         ("spec", "--batches"), ("floor", "--lengths"), ("build", "--tokens")]  # fmt: skip


@pytest.mark.parametrize("bench, flag", LISTS)
def test_a_list_that_is_not_integers_is_refused_naming_its_flag(bench, flag, capsys, tmp_path):
    out = tmp_path / "out.json"
    with pytest.raises(SystemExit) as e:
        main(["bench", bench, flag, "256,abc", "--out", str(out)])
    assert e.value.code == 2 and not out.exists()
    assert f"argument {flag}: expected comma-separated integers, got '256,abc'" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("bench", ["decode", "prefill", "coverage", "memory", "build", "gemv"])
def test_a_typo_in_the_last_model_is_refused_before_the_first_runs(bench, capsys, tmp_path):
    out = tmp_path / "out.json"
    with pytest.raises(SystemExit) as e:
        main(["bench", bench, "--models", "qwen3-0.6b,qwen3-06b", "--out", str(out)])
    assert e.value.code == 2 and not out.exists()
    assert "argument --models: unknown model 'qwen3-06b': not a preset" in capsys.readouterr().err


def test_roofline_divides_by_the_bandwidth_it_is_given():
    assert roofline_tok_s(weights_bytes=2_000, bandwidth_bytes_s=10_000.0) == 5.0


def test_busy_time_attributes_overlapping_kernels_once():
    """Kernels overlapping under PDL: each is charged only past every kernel before it, gaps
    are idle, and the charges sum to the union of the spans."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from nanograph.bench.floor import busy_time

    def kernel(name, start, end, kind=DeviceType.CUDA):
        return SimpleNamespace(name=name, device_type=kind,
                               time_range=SimpleNamespace(start=start, end=end))  # fmt: skip

    events = [kernel("gemv", 900, 2000), kernel("attn", 0, 1000), kernel("host", 0, 9000,
              DeviceType.CPU), kernel("norm", 1200, 1500), kernel("gemv", 2500, 3000)]  # fmt: skip
    busy, idle = busy_time(events, cuda=True)
    assert busy == pytest.approx({"attn": 1.0, "gemv": 1.5})
    assert idle == pytest.approx(0.5)


def test_bench_decode_runs_on_cpu_with_a_measured_roofline(tiny_model_dir, tmp_path):
    out = tmp_path / "decode.json"
    argv = ["bench", "decode", "--models", str(tiny_model_dir("llama")), "--arms",
            "none,none:unfused", "--batches", "1", "--prompt-len", "8", "--new-tokens", "4",
            "--repeats", "1", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(out.read_text())
    bandwidth = report["copy_bandwidth_bytes_s"]
    assert bandwidth > 0
    (entry,) = report["models"].values()
    # the alias is reported under the one name; the unfused arm beside it
    assert list(entry["arms"]) == ["eager", "eager:unfused"]
    weights = entry["arms"]["eager"]["active_weights_bytes"]
    assert entry["roofline_batch1_tok_s"] == pytest.approx(bandwidth / weights)


@needs_no_cuda
def test_bench_floor_profiles_engine_steps_on_cpu(tiny_model_dir, tmp_path):
    """--engine-steps: the engine's decode steps (generate N + 1 tokens minus 1) per step; no
    graph replay time without CUDA; --trace writes their Chrome trace. --fused-decode off is
    undone when the bench returns."""
    out, trace = tmp_path / "floor.json", tmp_path / "steps_trace.json"
    argv = ["bench", "floor", "--model", str(tiny_model_dir("llama")), "--lengths", "8",
            "--decode-batch", "1", "--repeats", "1", "--engine-steps", "3",
            "--fused-decode", "off", "--trace", str(trace), "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert json.loads(trace.read_text())["traceEvents"]
    (entry,) = json.loads(out.read_text())["lengths"].values()
    assert entry["replay_ms"] is None
    steps = entry["engine_steps"]
    # a difference of two wall times: its sign is the machine's load, not the bench's (no
    # timing assertion), so only that it was computed
    assert steps["steps"] == 3 and math.isfinite(steps["wall_ms"]) and steps["busy_top_ms"]
    from nanograph.layers import ops

    assert ops._FUSED_DECODE == "auto"


@needs_no_cuda
def test_bench_prefill_on_cpu_runs_eager_and_a_fair_peer(tiny_model_dir, tmp_path):
    out = tmp_path / "prefill.json"
    argv = ["bench", "prefill", "--models", str(tiny_model_dir("llama")), "--lengths", "8,24",
            "--repeats", "1", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    (entry,) = json.loads(out.read_text())["models"].values()
    assert list(entry["arms"]) == ["eager"]  # graph arms are not defaults on CPU
    peer = entry["peer"]
    assert peer["attn_implementation"] == "sdpa" and peer["logits_to_keep"] == 1
    assert peer["compile"] is None and peer["dtype"] == "float32"
    assert sorted(peer["median_ms"]) == ["24", "8"]  # every length, side by side
    assert set(entry["speedup_over_peer"]["eager"]) == {"8", "24"}
    if importlib.util.find_spec("matplotlib"):
        assert list(tmp_path.glob("prefill_tiny-llama*.png"))


def test_clock_sampler_reads_nvidia_smi_rows_while_its_block_runs(tmp_path):
    """The sampler runs the given nvidia-smi with the clock, power and throttle-reason query
    and summarises the rows it printed: medians, and the share of samples at the power cap
    (0x4) or slowed by hardware; rows it cannot read (N/A fields, a cut line) are left out."""
    from nanograph.bench.clocks import ClockSampler

    args = tmp_path / "args.txt"
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$@" > {args}\n'
        'echo "1980, 80.0, 0x0000000000000000"\n'  # the row before the block: left out
        "sleep 0.3\n"
        'printf "1785, 690.5, 0x0000000000000004\\n1980, 300.0, 0x0000000000000000\\n"\n'
        'printf "1770, 694.0, 0x000000000000000C\\n[N/A], [N/A], [N/A]\\n1980, 2"\n'
        "exec sleep 30\n"
    )
    fake.chmod(0o755)
    with ClockSampler(command=str(fake), period_ms=50) as clocks:
        assert args.exists()  # the sampler is running when the block starts
        time.sleep(0.6)
    got = clocks.summary()
    assert "--query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active" in args.read_text()
    assert "--loop-ms=50" in args.read_text()
    assert got == {"sm_mhz": 1785.0, "power_w": 690.5, "power_capped": 2 / 3, "thermal": 0.0,
                   "hw_slowdown": 1 / 3, "samples": 3}  # fmt: skip


def test_clock_sampler_with_period_0_starts_nothing(tmp_path):
    from nanograph.bench.clocks import ClockSampler

    args = tmp_path / "args"
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f'#!/bin/sh\necho "$@" > {args}\necho "1980, 80.0, 0x0"\nexec sleep 30\n')
    fake.chmod(0o755)
    with ClockSampler(command=str(fake), period_ms=0) as clocks:
        pass
    assert not args.exists() and clocks.summary() == {}


def test_clock_sampler_records_nothing_without_a_gpu_to_sample(monkeypatch):
    from nanograph.bench import clocks

    monkeypatch.setattr(clocks.shutil, "which", lambda name: None)
    with clocks.ClockSampler() as sampler:
        pass
    assert sampler.summary() == {}
    assert clocks.summarize(["[N/A], [N/A], [N/A]", ""]) == {}


def test_bench_prefill_engine_recomputes_a_repeated_prompt(tiny_model_dir):
    from nanograph.bench.prefill import engine_for

    llm = engine_for(str(tiny_model_dir("llama")), "eager", [8, 16])
    assert llm.engine.config.disable_prefix_caching  # else every repeat is a cache hit


def test_a_bench_refuses_to_time_a_rejected_request(tiny_model_dir, tmp_path, capsys):
    """A prompt as long as the context is rejected by the engine in microseconds: a bench that
    timed it would report that as the prefill's latency."""
    argv = ["bench", "host", "--model", str(tiny_model_dir("llama")), "--tokens", "512",
            "--repeats", "1", "--out", str(tmp_path / "host.json")]  # fmt: skip
    assert main(argv) != 0
    assert "1 of 1 requests failed, first: the prompt has 512 tokens" in capsys.readouterr().err


def test_bench_host_profiles_the_moe_backend_it_is_given(tiny_model_dir, tmp_path, monkeypatch):
    from nanograph.bench import prefill

    backends = []
    real = prefill.engine_for
    monkeypatch.setattr(
        prefill, "engine_for", lambda *a, **kw: backends.append(kw) or real(*a, **kw)
    )
    out = tmp_path / "host.json"
    argv = ["bench", "host", "--model", str(tiny_model_dir("qwen3_moe")), "--tokens", "8",
            "--moe-backend", "torch_native", "--repeats", "1", "--top", "1000",  # every row
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert backends == [{"moe_backend": "torch_native"}]
    assert "(native_moe)" in json.loads(out.read_text())["arms"]["eager"]["profile"]


def test_bench_prefill_frees_an_arms_engine_before_building_the_next(tiny_model_dir, monkeypatch):
    """Each arm's engine is gone before the next one loads: a loop that kept its name bound
    held two models' weights at once (gpt-oss-20b's second arm ran out of an H100's memory)."""
    import argparse
    import gc
    import weakref

    from nanograph.bench import prefill

    built = []

    def engine_for(*args, **kwargs):
        gc.collect()
        assert all(ref() is None for ref in built), "the previous arm's engine is still alive"
        llm = real_engine_for(*args, **kwargs)
        built.append(weakref.ref(llm.engine))
        return llm

    real_engine_for = prefill.engine_for
    monkeypatch.setattr(prefill, "engine_for", engine_for)
    args = argparse.Namespace(arms=["eager", "eager"], load_format="auto", moe_backend="auto",
                              quantization=None, peer_lengths="", repeats=1,
                              clock_period_ms=20, eager_beside=False)  # fmt: skip
    entry = prefill.measure_model(str(tiny_model_dir("llama")), args, [8])
    assert len(built) == 2 and entry["arms"]["eager"]["median_ms"]


def test_bench_prefill_eager_beside_times_an_arms_engine_with_its_graphs_off(
    tiny_model_dir, monkeypatch
):
    """--eager-beside: each non-eager arm's own engine also runs with its graphs off, one call
    of each in turn, and the paired samples' ratios give the speedup. On CPU only the eager
    arm runs, so here it stands in for a graph arm; its calls with graphs off are counted."""
    import argparse

    from nanograph.bench import prefill
    from nanograph.runners.model_runner import ModelRunner

    monkeypatch.setattr(prefill, "EAGER", "an arm this run does not have")
    off = []
    real_graphs_off = ModelRunner.graphs_off

    def graphs_off(self):
        off.append(self)
        return real_graphs_off(self)

    monkeypatch.setattr(ModelRunner, "graphs_off", graphs_off)
    args = argparse.Namespace(arms=["eager"], load_format="auto", moe_backend="auto",
                              quantization=None, peer_lengths="", repeats=3, clock_period_ms=0,
                              eager_beside=True)  # fmt: skip
    entry = prefill.measure_model(str(tiny_model_dir("llama")), args, [8, 12])
    beside = entry["arms"]["eager"]["eager_beside"]
    assert [len(beside["samples_ms"][n]) for n in (8, 12)] == [3, 3]
    assert len(off) == 2 * (3 + 1)  # every sample and (one on CPU) warm-up call, both lengths
    paired = entry["speedup_over_eager_beside"]["eager"]
    assert set(paired) == {8, 12} and all(x > 0 for x in paired.values())
    assert "eager on its own engine, paired" in prefill.speedup_table({"models": {"m": entry}})


def test_graphs_off_runs_every_forward_eagerly_and_restores_the_runners():
    """Inside ``graphs_off`` no graph runner is asked; after it, the runners are back."""
    from types import SimpleNamespace

    from nanograph.runners.model_runner import ModelRunner

    runner = ModelRunner.__new__(ModelRunner)
    graph = SimpleNamespace(path="prefill")
    runner.graph_runners = {"prefill": graph}
    with runner.graphs_off():
        assert runner.graph_runners == {}
    assert runner.graph_runners == {"prefill": graph}
    try:
        with runner.graphs_off():
            raise RuntimeError("a failed forward")
    except RuntimeError:
        pass
    assert runner.graph_runners == {"prefill": graph}


def test_bench_coverage_frees_each_engine_before_building_the_next(monkeypatch, tmp_path):
    import argparse
    import gc
    import weakref

    from nanograph.bench import coverage

    class Engine:  # what run_model touches of an LLM, weakly referable
        def close(self):
            pass

    built = []

    def engine(model, moe, backend, args):
        gc.collect()
        assert all(ref() is None for ref in built), "the previous engine is still alive"
        llm = Engine()
        built.append(weakref.ref(llm))
        return llm

    measured = {"tokens": [[1]], "decode_tok_s_median": 1.0, "prefill_ms_median": 1.0}
    monkeypatch.setattr(coverage, "_engine", engine)
    monkeypatch.setattr(coverage, "_measure", lambda llm, args: measured)
    monkeypatch.setattr(coverage, "_path_record", lambda llm, path: {"captured": True})
    report = {"models": {}}
    args = argparse.Namespace(backends=["full", "breakable"], out=str(tmp_path / "c.json"))
    coverage.run_model("m", "triton", args, report)
    assert len(built) == 3
    assert set(report["models"]["m"]["triton"]) == {"eager", "full", "breakable"}


def test_bench_coverage_times_prefills_that_compute_the_whole_prompt(monkeypatch, tiny_model_dir):
    """The timed prompt repeats; no call may take its prompt from the prefix cache."""
    import argparse

    from nanograph.bench import coverage

    cached, real = [], coverage.generate

    def generate(llm, prompts, params):
        outs = real(llm, prompts, params)
        cached.extend(o.num_cached_tokens for o in outs)
        return outs

    monkeypatch.setattr(coverage, "generate", generate)
    args = argparse.Namespace(decode_batches=[1], prefill_tokens=48, mixed_lengths=[20, 28],
                              decode_prompt=24, new_tokens=3, repeats=3)  # fmt: skip
    llm = coverage._engine(str(tiny_model_dir("qwen3")), coverage.DENSE, "eager", args)
    coverage._measure(llm, args)
    assert len(cached) == 2 + 3 + 5 and not any(cached), cached  # batch, decode, warm-up + 3


def test_bench_spec_runs_on_cpu_and_records_its_cost_model(tiny_model_dir, tmp_path):
    out = tmp_path / "spec.json"
    tiny = str(tiny_model_dir("qwen3"))
    argv = ["bench", "spec", "--target", tiny, "--drafter", str(tiny_model_dir("llama")),
            "--arms", "off,ngram:2,draft:2,self:2", "--batches", "1,2", "--prompt-len", "16",
            "--new-tokens", "6", "--repeats", "1", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert list(report["arms"]) == ["off", "ngram:2", "draft:2", "self:2"]
    for arm, data in report["arms"].items():
        assert set(data["median_tok_s"]) == {"1", "2"} and data["predicted_tok_s"]["2"] > 0
        assert ("verify_over_decode" in data["costs_ms"]["1"]) == (arm != "off")
        assert ("verify_over_decode_back_to_back" in data["costs_ms"]["1"]) == (arm != "off")
    for arm, data in report["arms"].items():  # the catch-up lowers only draft arms' figure
        with_catch_up = data["predicted_with_catch_up_tok_s"]["2"]
        steady = data["predicted_tok_s"]["2"]
        if arm.startswith(("draft", "self")):
            assert data["costs_ms"]["2"]["catch_up"] > 0 and with_catch_up < steady
        else:
            assert "catch_up" not in data["costs_ms"]["2"]
            assert with_catch_up == pytest.approx(steady)
    for arm in ("draft:2", "self:2"):
        costs = report["arms"][arm]["costs_ms"]["2"]
        assert costs["draft_loop_over_k_drafter_steps"] > 0
        assert costs["draft_loop_over_k_drafter_steps_back_to_back"] > 0
        assert costs["draft_loop_one_token"] > 0
        one = costs["draft_loop_one_token_over_k_drafter_steps_back_to_back"]
        two = costs["draft_loop_over_k_drafter_steps_back_to_back"]
        as_run = costs["draft_loop_as_run_over_k_drafter_steps_back_to_back"]
        assert one > 0 and min(one, two) - 1e-9 <= as_run <= max(one, two) + 1e-9  # between
        assert 0 <= report["arms"][arm]["all_accepted_fraction"]["2"] <= 1
        assert "draft_capture_s" in report["arms"][arm]  # empty on CPU: nothing captured
    # the self-draft arm drafts with the target's own (same-seed) weights: nearly all accepted
    assert report["arms"]["self:2"]["acceptance_rate"]["1"] >= 0.9
    # a draft model drafts on every step; n-gram only where the context repeats an n-gram
    for arm in ("ngram:2", "draft:2", "self:2"):
        fraction = report["arms"][arm]["verify_step_fraction"]["2"]
        assert 0 <= fraction <= 1 and (fraction == 1 or arm == "ngram:2")
    assert out.with_suffix(".png").exists() or importlib.util.find_spec("matplotlib") is None


def test_bench_spec_refuses_an_unknown_arm(capsys, tmp_path):
    out = tmp_path / "spec.json"
    assert main(["bench", "spec", "--arms", "off,eagle:2", "--out", str(out)]) == 2
    assert "unknown arm 'eagle:2'" in capsys.readouterr().err and not out.exists()


def test_bench_startup_reports_phases_and_compiles_on_cpu(tiny_model_dir, tmp_path):
    out = tmp_path / "startup.json"
    argv = ["bench", "startup", "--model", str(tiny_model_dir("llama")), "--load-format",
            "auto", "--dtypes", "float32", "--graphs", "eager", "--short", "4", "--long", "9",
            "--new-tokens", "2", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    arms = json.loads(out.read_text())["arms"]
    assert set(arms) == {"float32/eager/cold", "float32/eager/warm"}
    for arm in arms.values():
        assert {"weights", "kv_pool"} <= set(arm["phases"]), arm
        assert sum(arm["phases"].values()) <= arm["ready_s"]
        assert arm["requests"]["long"]["tokens"] == 9
        for window in ("compiles_to_ready", "compiles_after_ready"):
            assert {"compiled", "cache_hits", "compile_s", "top"} <= set(arm[window])


def test_compile_log_windows_every_figure_and_echoes_compiles():
    """Triton's listener gets one event per compile or cache hit; a summary counts only its
    window's events, stage seconds included."""
    import io
    import time
    from types import SimpleNamespace

    knobs = pytest.importorskip("triton").knobs
    from nanograph.bench.compiles import triton_compiles

    def event(name, hit, stage_us):
        stages = [("ttir", stage_us), ("cubin", stage_us)]
        times = SimpleNamespace(ir_initialization=0, store_results=0, lowering_stages=stages)
        return dict(src=None, metadata={"name": name}, times=times, cache_hit=hit)

    echo = io.StringIO()
    with triton_compiles(echo) as log:
        knobs.compilation.listener(**event("early", False, 1_000_000))
        knobs.compilation.listener(**event("early", True, 5))
        time.sleep(0.02)
        split = time.perf_counter() - log.started
        knobs.compilation.listener(**event("late", False, 250_000))
    assert knobs.compilation.listener is None  # the block puts the previous listener back
    before, after = log.summary(until_s=split), log.summary(after_s=split)
    assert (before["compiled"], before["cache_hits"], after["compiled"]) == (1, 1, 1)
    assert before["compile_s"] == pytest.approx(2.0) and after["compile_s"] == pytest.approx(0.5)
    assert after["stage_s"] == pytest.approx({"ttir": 0.25, "cubin": 0.25})
    assert [k["kernel"] for k in after["top"]] == ["late"]
    assert echo.getvalue().count("compiled ") == 2  # compiles echo, cache hits do not


def test_a_tile_sweep_lists_the_fastest_first_and_failures_last(monkeypatch):
    """``bench gemv --sweep``: every candidate is timed once; failures (out of resources) are
    kept after the timed ones, and the best time is the first's."""
    from nanograph.bench import gemv as bench_gemv
    from nanograph.kernels.gemv import GemvTiles

    times = {8: 3.0, 16: 1.5, 32: 2.0}

    def fake_timed_us(product, weights, x, rep_ms):
        return product(x, weights[0])

    def product(a, w, tiles):
        if tiles.block_n == 4:
            raise RuntimeError("out of resources")
        return times[tiles.block_n]

    monkeypatch.setattr(bench_gemv, "_timed_us", fake_timed_us)
    candidates = [GemvTiles(n) for n in (8, 4, 16, 32)]
    trials, best = bench_gemv._sweep(product, candidates, [None], None, 100)
    assert [t["tiles"]["block_n"] for t in trials] == [16, 32, 8, 4]
    assert best == 1.5 and trials[-1]["error"] == "out of resources"
    assert bench_gemv._sweep(product, [GemvTiles(4)], [None], None, 100)[1] is None


def test_bench_structured_gives_a_preset_without_a_tokenizer_a_byte_level_one():
    from nanograph.bench.structured import model_with_tokenizer
    from nanograph.loader.presets import resolve_model

    assert not resolve_model("qwen3-0.6b", "dummy").has_tokenizer
    folder = model_with_tokenizer("qwen3-0.6b", "dummy")
    source = resolve_model(folder, "dummy")
    assert source.has_tokenizer and source.config.vocab_size == 151936
    tokenizer = source.tokenizer()
    ids = tokenizer.encode("ab{", add_special_tokens=False)
    assert len(ids) == 3 and tokenizer.decode(ids) == "ab{"  # a token a byte


def test_bench_structured_times_plain_and_regex_on_the_same_prompts(tiny_with_tokenizer, tmp_path):
    pytest.importorskip("xgrammar")
    out = tmp_path / "structured.json"
    argv = ["bench", "structured", "--model", str(tiny_with_tokenizer), "--load-format", "auto",
            "--batches", "1,2", "--tokens", "6", "--repeats", "2", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(out.read_text())
    for batch in ("1", "2"):
        result = report["batches"][batch]
        # the byte-level tokenizer: the form's 6 letters are 6 tokens, as the plain arm's
        assert result["plain"]["tokens"] == result["regex"]["tokens"] == 6 * int(batch)
        assert len(result["regex"]["tokens_per_s"]) == 2
        assert result["ratio"] == pytest.approx(
            result["regex"]["median_tokens_per_s"] / result["plain"]["median_tokens_per_s"]
        )
