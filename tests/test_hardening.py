"""No input can poison the engine: each case a user found at 114d90d, as a test.

Every test ends by checking that the engine is left as usable as before: nothing queued or
running, every KV page back in the pool, and a valid greedy request still answers.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import requires_smollm2

from nanograph import LLM, SamplingParams
from nanograph.cli import main

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def smol():
    return LLM("smollm2-135m", max_model_len=96, progress=False)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return LLM(str(tiny_model_dir("qwen3")), page_size=4, kv_cache_bytes=2**20, progress=False)


def assert_clean(llm: LLM, prompt=(1, 2, 3)) -> None:
    """Nothing left behind, and a valid request still works."""
    engine = llm.engine
    assert not engine.has_work()
    # every page free, or cached with no request reading it (prefix caching keeps pages)
    assert engine.scheduler.num_available_pages == engine.kv_cache.allocator.num_usable
    out = llm.generate([list(prompt)], GREEDY)[0]
    assert out.ok and len(out.token_ids) == GREEDY.max_tokens


@pytest.mark.parametrize(
    "field, value",
    [
        ("seed", "abc"), ("seed", 1.5), ("seed", 2**64), ("seed", True),
        ("temperature", math.nan), ("temperature", math.inf), ("temperature", "0.5"),
        ("top_p", math.nan), ("top_p", 0.0), ("min_p", -math.inf), ("min_p", None),
        ("top_k", 2.0), ("top_k", -2), ("max_tokens", 0), ("max_tokens", 3.0),
        ("max_tokens", True), ("stop", [""]), ("stop", [1]), ("stop", 5),
        ("stop_token_ids", ["a"]), ("stop_token_ids", [-1]), ("ignore_eos", "yes"),
    ],
)  # fmt: skip
def test_sampling_params_refuse_bad_values_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_sampling_params_normalise_what_they_accept():
    import numpy as np

    p = SamplingParams(max_tokens=np.int64(3), temperature=1, seed=-5, stop="x", top_k=0)
    assert p.max_tokens == 3 and type(p.max_tokens) is int
    assert p.temperature == 1.0 and type(p.temperature) is float
    assert p.stop == ("x",) and p.seed == -5
    assert SamplingParams(temperature=1e-9).greedy  # a subnormal divisor would give NaN draws


def test_a_request_that_raises_in_the_sampler_fails_alone(tiny):
    """The seed check moved to SamplingParams; should anything still raise inside a step (here
    a seed forced past the check), that request fails and the batch and engine go on."""
    bad = SamplingParams(max_tokens=6, temperature=0.7, ignore_eos=True)
    object.__setattr__(bad, "seed", "abc")  # what SamplingParams(seed="abc") used to let in
    good = [[5, 6, 7], [9, 10, 11, 12]]
    alone = [o.token_ids for o in tiny.generate(good, GREEDY)]
    outs = tiny.generate([good[0], [1, 2, 3], good[1]], [GREEDY, bad, GREEDY])
    assert [o.finish_reason for o in outs] == ["length", "error", "length"]
    assert "internal error" in outs[1].error
    assert [outs[0].token_ids, outs[2].token_ids] == alone
    assert_clean(tiny)


def test_a_forward_that_raises_fails_only_its_culprit(tiny, monkeypatch):
    """A model error triggered by one request's tokens: each request reruns alone, the culprit
    fails, the others produce the tokens they produce alone."""
    good = [[5, 6, 7], [9, 10, 11, 12]]
    alone = [o.token_ids for o in tiny.generate(good, GREEDY)]
    model = tiny.engine.model
    original = type(model).forward

    def forward(self, ids, positions, *args, **kwargs):
        if (ids == 255).any():
            raise RuntimeError("poisoned token")
        return original(self, ids, positions, *args, **kwargs)

    monkeypatch.setattr(type(model), "forward", forward)
    outs = tiny.generate([good[0], [1, 255, 3], good[1]], GREEDY)
    monkeypatch.undo()
    assert [o.finish_reason for o in outs] == ["length", "error", "length"]
    assert "poisoned token" in outs[1].error
    assert [outs[0].token_ids, outs[2].token_ids] == alone
    assert_clean(tiny)


def test_an_interrupted_generate_leaves_nothing_behind(tiny, monkeypatch):
    engine = tiny.engine
    calls = {"n": 0}
    original = type(engine).step

    def step(self):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(type(engine), "step", step)
    with pytest.raises(KeyboardInterrupt):
        tiny.generate([[1, 2, 3], [4, 5, 6, 7]], GREEDY)
    monkeypatch.undo()
    assert_clean(tiny)


def test_bad_prompts_fail_alone_and_leave_nothing_behind(tiny):
    outs = tiny.generate([[1, 2, 3], [], [1, -4], [2**40], "text", [1.5, 2], None], GREEDY)
    assert outs[0].ok
    assert all(o.finish_reason == "error" and o.error for o in outs[1:])
    assert "no tokenizer" in outs[4].error
    assert_clean(tiny)


def test_token_lists_of_python_ints_other_integers_and_neither():
    """A list of Python ints takes a one-pass check (a per-token one was on a long prompt's
    latency); other integer types are converted to Python ints; bools and floats are refused,
    alone or mixed with ints."""
    import numpy as np

    from nanograph.engine.prompts import is_single_prompt, prompt_token_ids

    assert prompt_token_ids(None, [5, 1, 7]) == [5, 1, 7]
    assert prompt_token_ids(None, (5, 1)) == [5, 1]
    converted = prompt_token_ids(None, [np.int64(5), 1])
    assert converted == [5, 1] and all(type(t) is int for t in converted)
    for bad in ([1, True], [True], [1, 2.0]):
        with pytest.raises(ValueError, match="list of integer token ids"):
            prompt_token_ids(None, bad)
    assert is_single_prompt([1, 2]) and is_single_prompt([np.int64(1), 2])
    assert not is_single_prompt([[1], [2]]) and not is_single_prompt([True, 1])


@requires_smollm2
def test_vllm_prompt_dicts_are_prompts_not_their_keys(smol):
    """vLLM's TextPrompt / TokensPrompt dicts answer as the string or ids inside them, alone or
    in a batch (a dict was iterated as its keys: generate({"prompt": "hi"}) answered the word
    "prompt"); other dicts fail alone, saying what a prompt dict takes."""
    ids = [1, 2, 3]
    plain = [o.token_ids for o in smol.generate(["Name a colour.", ids], GREEDY)]
    assert smol.generate({"prompt": "Name a colour."}, GREEDY)[0].token_ids == plain[0]
    assert smol.generate({"prompt_token_ids": ids}, GREEDY)[0].token_ids == plain[1]
    batch = [{"prompt": "Name a colour."}, {"prompt_token_ids": ids}]
    assert [o.token_ids for o in smol.generate(batch, GREEDY)] == plain
    bad = [
        {"role": "user", "content": "one message, not in a list"},
        {"prompt": "x", "multi_modal_data": {}},
        {"prompt_token_ids": "1 2 3"},
        {"prompt": 7},
        {"prompt_token_ids": []},
    ]
    outs = smol.generate([*bad, ids], GREEDY)
    assert [o.ok for o in outs] == [False] * len(bad) + [True]
    assert outs[-1].token_ids == plain[1]
    assert "a conversation is a list of {'role', 'content'} dicts" in outs[0].error
    assert "multi_modal_data in a prompt dict is not supported" in outs[1].error
    assert "prompt_token_ids must be a list" in outs[2].error
    assert "'prompt' must be a string" in outs[3].error
    assert "the prompt is empty" in outs[4].error
    assert_clean(smol)


@requires_smollm2
def test_lone_surrogates_and_broken_messages_fail_alone(smol):
    valid = "Name a colour."
    alone = smol.generate(valid, GREEDY)[0].token_ids
    batch = [
        valid,
        "bad \udcff text",
        [{"content": "no role"}],
        [{"role": "user", "content": 7}],
        [{"role": "user", "content": "x\ud800"}],
        [],
    ]
    outs = smol.generate(batch, GREEDY)
    assert outs[0].token_ids == alone
    assert [o.finish_reason for o in outs[1:]] == ["error"] * 5
    assert "surrogate" in outs[1].error and "role" in outs[2].error
    assert "content" in outs[3].error and "surrogate" in outs[4].error
    assert_clean(smol, smol.tokenizer.encode("Hello"))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--attention-backend", "triton"], "needs CUDA"),
        (["--debug-cuda-graph"], "nothing is captured"),
        (["--max-model-len", "0"], "max_model_len"),
        (["--messages", "[1,2,3]"], "--messages takes"),
        (["--messages", "[{\"role\": \"user\""], "not valid JSON"),
        (["--temperature", "nan"], "temperature"),
        (["--sampling-seed", "-99999999999999999999"], "seed"),
    ],
)  # fmt: skip
def test_cli_errors_are_one_line_without_traceback(argv, message, tiny_model_dir):
    model = ["--model", str(tiny_model_dir("qwen3")), "--prompt-ids", "1,2"]
    # a user's environment: the kernel tests' TRITON_INTERPRET (set at their import) would make
    # triton attention legitimate on CPU
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-m", "nanograph", "generate", *model, *argv, "--quiet"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=env,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert "Traceback" not in out.stderr


def test_cli_batch_keeps_order_and_reports_a_failure_once(capsys, tiny_model_dir):
    argv = ["generate", "--model", str(tiny_model_dir("qwen3")), "--prompt-ids", "1,2",
            "--prompt-ids", "999999", "--prompt-ids", "3,4,5", "--max-tokens", "3",
            "--ignore-eos", "--quiet"]  # fmt: skip
    assert main(argv) == 1
    out, err = capsys.readouterr()
    blocks = out.split("--- [")[1:]
    assert [b.split("]")[0] for b in blocks] == ["0", "1", "2"]
    assert "error: token id 999999 is outside the vocabulary" in blocks[1]
    assert blocks[0].count(",") == 2 and blocks[2].count(",") == 2
    assert err.count("999999") == 0 and "1 of 3 prompts failed" in err


def test_cli_version():
    out = subprocess.run([sys.executable, "-m", "nanograph", "--version"], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip().startswith("nanograph ")


@requires_smollm2
def test_a_stop_string_at_the_very_start_leaves_empty_text(smol):
    """The first generated text is the stop string: the answer is empty, not the stop string."""
    first = smol.generate("Count: 1, 2, 3,", GREEDY)[0]
    stop = first.text[:2] or first.text
    out = smol.generate("Count: 1, 2, 3,", SamplingParams(max_tokens=6, temperature=0.0,
                                                          stop=[stop]))[0]  # fmt: skip
    assert out.finish_reason == "stop" and stop not in out.text and out.text == ""


@pytest.mark.parametrize("length", [3, 200])
def test_first_bad_token_names_the_first_entry_outside_the_vocabulary(length):
    """Short prompts (the walk) and long ones (types in one pass, numpy's min and max) find the
    same first culprit: out of range either side, past int64, a bool, a float, None."""
    from nanograph.engine.prompts import first_bad_token

    good = list(range(length))
    assert first_bad_token(good, length) is None
    for bad in (-1, length, 2**70, True, 1.0, None):
        ids = [*good[:-1], bad, bad]
        assert first_bad_token(ids, length) == length - 1, bad


def test_start_up_gives_the_cyclic_gc_back_whether_loading_works_or_fails(tiny_model_dir, tmp_path):
    """Loading runs with the cyclic GC paused; an engine that starts, and one whose model
    fails to load, both leave it as the caller had it."""
    import gc

    assert gc.isenabled()
    LLM(str(tiny_model_dir("qwen3")), page_size=4, kv_cache_bytes=2**20, progress=False)
    assert gc.isenabled()
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(Exception):  # noqa: B017 (the loader's own error type is not the point)
        LLM(str(tmp_path), progress=False)
    assert gc.isenabled()
    gc.disable()  # a caller that runs without it keeps it off
    try:
        LLM(str(tiny_model_dir("qwen3")), page_size=4, kv_cache_bytes=2**20, progress=False)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_weights_that_do_not_fit_the_gpu_fail_before_allocating(monkeypatch):
    """A model too large for the GPU's free memory is refused with the sizes and the ways out,
    before anything is allocated (checked here with CUDA's free-memory query faked)."""
    import torch

    from nanograph.loader import resolve_model
    from nanograph.models import build_model

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2**33, 2**34))
    # 1 GiB cached by torch's allocator and unused: free for the weights too
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 2 * 2**30)
    config = resolve_model("qwen3-8b", "dummy").config  # 16.4 GB of bf16 weights
    with pytest.raises(MemoryError, match=r"weights need 15\.\d GiB in torch\.bfloat16 but "
                       r"cuda has 9\.0 GiB free .*--tensor-parallel-size"):  # fmt: skip
        build_model(config, torch.bfloat16, torch.device("cuda"))
