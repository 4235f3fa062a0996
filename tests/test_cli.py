"""The command line: help documents every flag; generate answers and reports errors."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from conftest import requires_smollm2

from nanograph.cli import ENGINE_HELP, build_parser, main
from nanograph.engine.config import EngineConfig


def test_help_documents_every_engine_flag(capsys):
    help_text = build_parser()._subparsers._group_actions[0].choices["generate"].format_help()
    for f in dataclasses.fields(EngineConfig):
        if ENGINE_HELP.get(f.name):
            assert "--" + f.name.replace("_", "-") in help_text
    for flag in ("--prompt", "--max-tokens", "--temperature", "--top-k", "--top-p", "--min-p",
                 "--stop", "--sampling-seed", "--prompt-ids"):  # fmt: skip
        assert flag in help_text


def test_vllm_and_sglang_flag_names_set_our_settings(capsys, tiny_model_dir):
    """--gpu-memory-utilization / --mem-fraction-static are --mem-fraction; --enforce-eager /
    --disable-cuda-graph turn every graph path off, and refuse a path set to a backend; the
    same names work as LLM(...) arguments."""
    from nanograph import LLM
    from nanograph.cli import engine_config_from

    def config(*flags: str) -> EngineConfig:
        return engine_config_from(build_parser().parse_args(["serve", *flags]))

    assert config("--gpu-memory-utilization", "0.6").mem_fraction == 0.6
    assert config("--mem-fraction-static", "0.7").mem_fraction == 0.7
    assert config().mem_fraction == EngineConfig.mem_fraction
    window = config("--speculative-algorithm", "ngram", "--prompt-lookup-max", "6",
                    "--speculative-ngram-min-match-window-size", "2")  # fmt: skip
    assert (window.speculative_ngram_min_match_window_size,
            window.speculative_ngram_max_match_window_size) == (2, 6)  # fmt: skip
    named = config("--tp-size", "2", "--context-length", "64", "--max-running-requests", "3",
                   "--block-size", "8", "--disable-radix-cache", "--random-seed", "5")  # fmt: skip
    assert (named.tensor_parallel_size, named.max_model_len, named.max_num_seqs, named.page_size,
            named.disable_prefix_caching, named.seed) == (2, 64, 3, 8, True, 5)  # fmt: skip
    assert config("--max-num-batched-tokens", "96").chunked_prefill_size == 96  # vLLM's name
    assert config("--chat-template", "t.jinja").chat_template == "t.jinja"
    # vLLM's negated switch: given, it decides; given against ours, an error
    assert not config().disable_prefix_caching
    assert not config("--enable-prefix-caching").disable_prefix_caching
    assert config("--no-enable-prefix-caching").disable_prefix_caching
    assert config("--no-enable-prefix-caching", "--disable-radix-cache").disable_prefix_caching
    with pytest.raises(ValueError, match="is the opposite of disable_prefix_caching"):
        config("--enable-prefix-caching", "--disable-prefix-caching")
    paths = ("decode_cuda_graph", "prefill_cuda_graph", "speculative_draft_cuda_graph")
    for switch in ("--enforce-eager", "--disable-cuda-graph"):
        assert [getattr(config(switch), p) for p in paths] == ["none"] * 3
    assert [getattr(config(), p) for p in paths] == ["auto"] * 3
    assert main(["generate", "--prompt-ids", "1,2", "--model", str(tiny_model_dir("qwen3")),
                 "--enforce-eager", "--decode-cuda-graph", "full"]) == 2  # fmt: skip
    assert "enforce_eager turns every CUDA graph off" in capsys.readouterr().err
    llm = LLM(str(tiny_model_dir("qwen3")), enforce_eager=True, gpu_memory_utilization=0.5,
              progress=False)  # fmt: skip
    assert llm.engine.config.mem_fraction == 0.5
    assert [getattr(llm.engine.config, p) for p in paths] == ["none"] * 3
    try:
        LLM(str(tiny_model_dir("qwen3")), gpu_memory_utilization=0.5, mem_fraction=0.6)
    except ValueError as e:
        assert "disagree" in str(e)
    else:
        raise AssertionError("conflicting names were accepted")


def test_bad_flags_are_clear_errors(capsys, tiny_model_dir):
    assert main(["generate", "--prompt", "hi", "--model", "no-such-model"]) == 2
    assert "no-such-model" in capsys.readouterr().err
    assert main(["generate", "--prompt-ids", "1,2", "--model", str(tiny_model_dir("qwen3")),
                 "--temperature", "-1"]) == 2  # fmt: skip
    assert "temperature" in capsys.readouterr().err
    assert main(["generate", "--prompt-ids", "1,2", "--model", str(tiny_model_dir("qwen3")),
                 "--repetition-penalty", "0"]) == 2  # fmt: skip
    assert "repetition_penalty must be a number > 0.0" in capsys.readouterr().err
    assert main(["generate", "--prompt-ids", "1,2", "--model", str(tiny_model_dir("qwen3")),
                 "--max-tokens", "4", "--min-tokens", "5"]) == 2  # fmt: skip
    assert "min_tokens must be an integer in [0, 4]" in capsys.readouterr().err
    assert main(["generate", "--prompt-ids", "1,x", "--model", str(tiny_model_dir("qwen3"))]) == 2
    assert "comma-separated integers" in capsys.readouterr().err


def test_serve_tool_call_flags(capsys):
    """--tool-call-parser takes vLLM's name (hermes), SGLang's (qwen25, qwen) and qwen3 for the
    one format; vLLM's --enable-auto-tool-choice is accepted, and refused without a parser (as
    vLLM refuses it) before any model loads."""
    import pytest

    parse = build_parser().parse_args
    for name in ("hermes", "qwen25", "qwen", "qwen3"):
        args = parse(["serve", "--tool-call-parser", name, "--enable-auto-tool-choice"])
        assert (args.tool_call_parser, args.enable_auto_tool_choice) == (name, True)
    args = parse(["serve"])
    assert (args.tool_call_parser, args.enable_auto_tool_choice) == (None, False)
    with pytest.raises(SystemExit):
        parse(["serve", "--tool-call-parser", "mistral"])
    capsys.readouterr()
    assert main(["serve", "--enable-auto-tool-choice", "--model", "no-such-model"]) == 2
    assert "--enable-auto-tool-choice needs --tool-call-parser" in capsys.readouterr().err


def test_serve_reasoning_parser_flag():
    """--reasoning-parser takes vLLM's and SGLang's names of the two rules; unset by default."""
    import pytest

    parse = build_parser().parse_args
    for name in ("qwen3", "deepseek-r1", "deepseek_r1", "qwen3-thinking"):
        assert parse(["serve", "--reasoning-parser", name]).reasoning_parser == name
    assert parse(["serve"]).reasoning_parser is None
    with pytest.raises(SystemExit):
        parse(["serve", "--reasoning-parser", "granite"])


def test_serve_hands_the_parsers_to_the_app(monkeypatch):
    from types import SimpleNamespace

    import pytest

    import nanograph.serve.app
    import nanograph.serve.server

    class Built(Exception):
        pass

    def build_app(front, name, api_key, shutdown_timeout, tool_call_parser, reasoning_parser,
                  on_engine_failure):  # fmt: skip
        assert callable(on_engine_failure)  # what shuts the server down if the engine dies
        raise Built(f"{tool_call_parser} {reasoning_parser}")

    monkeypatch.setattr(nanograph.serve.app, "build_app", build_app)
    monkeypatch.setattr(nanograph.serve.server, "_front",
                        lambda config, args: SimpleNamespace(close=lambda: None))  # fmt: skip
    with pytest.raises(Built, match="^qwen25 None$"):
        main(["--debug", "serve", "--tool-call-parser", "qwen25"])
    with pytest.raises(Built, match="^None deepseek-r1$"):
        main(["--debug", "serve", "--reasoning-parser", "deepseek-r1"])


def test_generate_token_ids_on_a_model_without_tokenizer(capsys, tiny_model_dir):
    code = main(["generate", "--model", str(tiny_model_dir("qwen3")), "--prompt-ids", "1,2,3",
                 "--max-tokens", "5", "--ignore-eos"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0
    assert captured.out.strip().startswith("[") and captured.out.count(",") == 4
    assert "KV pool" in captured.err


def test_generate_n_prints_each_completion_of_each_prompt(capsys, tiny_model_dir):
    from nanograph import LLM, SamplingParams

    model = str(tiny_model_dir("qwen3"))
    assert main(["generate", "--model", model, "--prompt-ids", "5,6,7", "--prompt-ids", "8,9",
                 "--max-tokens", "4", "--ignore-eos", "--temperature", "1", "--sampling-seed",
                 "3", "--n", "2"]) == 0  # fmt: skip
    captured = capsys.readouterr()
    params = SamplingParams(max_tokens=4, temperature=1, ignore_eos=True, seed=3, n=2)
    outs = LLM(model, progress=False).generate([[5, 6, 7], [8, 9]], params)
    expected = "".join(f"--- [{i}.{c.index}] ---\n{c.token_ids}\n"
                       for i, o in enumerate(outs) for c in o.outputs)  # fmt: skip
    assert captured.out == expected
    assert "4 (0 failed), 16 tokens" in captured.err
    assert main(["generate", "--model", model, "--prompt-ids", "5", "--n", "0"]) == 2
    assert "n must be an integer in [1, 128]" in capsys.readouterr().err


def test_generate_with_penalties_equals_the_api(capsys, tiny_model_dir):
    from nanograph import LLM, SamplingParams

    model = str(tiny_model_dir("qwen3"))
    assert main(["generate", "--model", model, "--prompt-ids", "5,6,7,5,6", "--max-tokens", "8",
                 "--ignore-eos", "--presence-penalty", "-0.5", "--frequency-penalty", "0.3",
                 "--repetition-penalty", "1.2"]) == 0  # fmt: skip
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, presence_penalty=-0.5,
                            frequency_penalty=0.3, repetition_penalty=1.2)  # fmt: skip
    expected = LLM(model, progress=False).generate([[5, 6, 7, 5, 6]], params)[0].token_ids
    assert capsys.readouterr().out.strip() == str(expected)


def test_generate_with_speculative_flags(capsys, tiny_model_dir):
    """The flags mirror EngineConfig: the answer is the one without speculation, and the
    summary says how many drafts were accepted."""
    base = ["generate", "--model", str(tiny_model_dir("qwen3")), "--prompt-ids", "5,6,7,5,6",
            "--max-tokens", "8", "--ignore-eos"]  # fmt: skip
    assert main(base) == 0
    plain = capsys.readouterr().out
    flags = ["--speculative-algorithm", "draft_model", "--speculative-num-draft-tokens", "3",
             "--speculative-draft-model-path", str(tiny_model_dir("qwen3"))]  # fmt: skip
    assert main(base + flags) == 0
    captured = capsys.readouterr()
    assert captured.out == plain
    assert "speculative" in captured.err and "drafts accepted" in captured.err


@requires_smollm2
def test_readme_main_job():
    out = subprocess.run(
        [sys.executable, "-m", "nanograph", "generate", "--prompt",
         "What is the capital of France?", "--max-tokens", "32"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout
    assert "tok/s" in out.stderr


def test_bench_size_writes_json(tmp_path):
    import json

    out = tmp_path / "size.json"
    assert main(["bench", "size", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["backends"]) == {"eager", "full", "breakable", "tc_piecewise"}
    assert "breakable" in report["backends"]["breakable"]["modules"]
    assert report["env"]["command"].startswith("nanograph")


def test_bench_host_profiles_an_arm(tmp_path):
    import json

    out = tmp_path / "host.json"
    argv = ["bench", "host", "--model", "smollm2-135m", "--arms", "none", "--tokens", "16",
            "--repeats", "1", "--top", "5", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    arm = json.loads(out.read_text())["arms"]["eager"]  # "none" is the eager arm's alias
    assert arm["median_ms"] > 0 and len(arm["samples_ms"]) == 1
    assert "tottime" in arm["profile"] and "linear" in arm["profile"]


def test_bench_floor_decode_step(tmp_path):
    import json

    out = tmp_path / "floor.json"
    argv = ["bench", "floor", "--model", "smollm2-135m", "--lengths", "24", "--decode-batch",
            "2", "--repeats", "2", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    step = json.loads(out.read_text())["lengths"]["24"]
    assert step["floor_ms"] > 0 and step["back_to_back_ms"] > 0
    assert step["kernels"] == len(step["top_ms"]) or len(step["top_ms"]) == 12


def test_bench_startup_reports_each_arm(tmp_path, tiny_model_dir):
    import json

    out = tmp_path / "startup.json"
    argv = ["bench", "startup", "--model", str(tiny_model_dir("qwen3")), "--load-format", "auto",
            "--dtypes", "float32", "--graphs", "auto", "--short", "4", "--long", "9",
            "--new-tokens", "2", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    arms = json.loads(out.read_text())["arms"]
    assert set(arms) == {"float32/auto/cold", "float32/auto/warm"}
    for arm in arms.values():
        assert arm["ready_s"] > 0 and arm["load_s"] > 0
        assert [r["tokens"] for r in arm["requests"].values()] == [4, 9, 4]
