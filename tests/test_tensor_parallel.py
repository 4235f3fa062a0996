"""Tensor parallelism on CPU (gloo, 2 processes): TP=2 greedy tokens equal TP=1 (dense and MoE,
chunked prefill, preemption), sharding rules, the env:// (torchrun) rendezvous, and failures
that end every rank with the failing rank named instead of hanging."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import assert_pages_back, make_llm, save_mxfp4_copy

from nanograph import SamplingParams
from nanograph.distributed import TensorParallelError
from nanograph.distributed.sharding import shard_config, shard_tensor, vocab_rows
from nanograph.models.config import ModelConfig

TIMEOUT = 60  # distributed_timeout_s of every engine here: a hang would fail, not stall CI
GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 30, (n,), generator=g).tolist()
    return [torch.randint(0, 256, (k,), generator=g).tolist() for k in lengths]


def tokens(path, batch, params=GREEDY, **kw) -> tuple[list[list[int]], int]:
    """Greedy tokens of ``batch`` and the preemptions it took; closes the engine."""
    with make_llm(path, distributed_timeout_s=TIMEOUT, **kw) as llm:
        outs = llm.generate(batch, params)
        assert all(o.ok for o in outs), [o.error for o in outs]
        if kw.get("tensor_parallel_size", 1) > 1:
            assert_pages_back(llm)
        return [o.token_ids for o in outs], sum(o.num_preemptions for o in outs)


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_tp2_equals_tp1_with_chunking_and_preemption(tiny_model_dir, arch):
    """A tight pool (15 usable pages of 4 tokens) preempts; 7-token chunks split prompts."""
    path = tiny_model_dir(arch)
    batch = prompts(6, seed=1)
    kw = dict(chunked_prefill_size=7, max_total_tokens=60)
    ref, preempted = tokens(path, batch, **kw)
    out, preempted_tp = tokens(path, batch, tensor_parallel_size=2, **kw)
    assert out == ref
    assert preempted > 0 and preempted_tp == preempted


def assert_tp2_equals_tp1_with_logprobs(path, batch) -> None:
    """Greedy tokens, each step's top-5 log-probabilities and the prompts' scores (their
    rows' logits gathered beside the sampled ones) of TP=2 equal TP=1's: a tiny random MoE
    often repeats one token, so tokens alone can miss a wrong shard."""
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=5,
                            prompt_logprobs=3)  # fmt: skip
    runs = []
    for tp in (1, 2):
        with make_llm(path, distributed_timeout_s=TIMEOUT, tensor_parallel_size=tp) as llm:
            outs = llm.generate(batch, params)
            runs.append(([o.token_ids for o in outs],
                         torch.tensor([[[lp for _, lp in step.top] for step in o.logprobs]
                                       for o in outs]),
                         torch.tensor([s.logprob for o in outs
                                       for s in o.prompt_logprobs[1:]])))  # fmt: skip
    assert runs[0][0] == runs[1][0]
    torch.testing.assert_close(runs[0][1], runs[1][1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(runs[0][2], runs[1][2], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss"])
def test_moe_tp2_equals_tp1(tiny_model_dir, arch):
    """Experts split by their width, routers replicated, gpt-oss biases added once."""
    assert_tp2_equals_tp1_with_logprobs(tiny_model_dir(arch), prompts(3, seed=2))


def test_mxfp4_experts_tp2_equals_tp1(tiny_model_dir, tmp_path):
    """MXFP4 experts are dequantized whole, then cut to each rank's part."""
    path = tmp_path / "mxfp4"
    save_mxfp4_copy(tiny_model_dir("gpt_oss"), path)
    assert_tp2_equals_tp1_with_logprobs(path, prompts(3, seed=5))


def test_tp4_replicates_kv_heads(tiny_model_dir):
    """Tiny Llama has 2 KV heads: with 4 ranks each KV head lives on two ranks."""
    path = tiny_model_dir("llama")
    batch = prompts(2, seed=3)
    assert tokens(path, batch, tensor_parallel_size=4)[0] == tokens(path, batch)[0]


def test_serial_schedule_and_sampling_match(tiny_model_dir):
    """Seeded sampling on rank 0 and the serial schedule (no tokens taken from the device)."""
    path = tiny_model_dir("qwen3")
    batch = prompts(3, seed=4)
    params = SamplingParams(max_tokens=8, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True)
    ref = tokens(path, batch, params)[0]
    out = tokens(path, batch, params, tensor_parallel_size=2, disable_overlap_schedule=True)[0]
    assert out == ref


def test_structured_outputs_tp2_equal_tp1(tiny_with_tokenizer):
    """Rank 0 holds the forms' matchers and masks the gathered logits; under the overlap
    schedule it reads each step's tokens while the next forward runs on every rank."""
    pytest.importorskip("xgrammar")
    forms = [{"regex": "(ab|ba)[xy]{3}|c[0-9]{2}"}, {"choice": ["yes", "no", "maybe so"]}]
    params = [SamplingParams(max_tokens=12, temperature=0.0, structured_outputs=f) for f in forms]
    batch = prompts(3, seed=6)
    runs = []
    for tp in (1, 2):
        with make_llm(tiny_with_tokenizer, distributed_timeout_s=TIMEOUT,
                      tensor_parallel_size=tp) as llm:  # fmt: skip
            outs = llm.generate(batch, params + [GREEDY])
            assert all(o.ok for o in outs), [o.error for o in outs]
            runs.append([(o.token_ids, o.text) for o in outs])
    assert runs[0] == runs[1]
    assert runs[1][1][1] in ("yes", "no", "maybe so")


def test_each_rank_reports_its_memory(tiny_model_dir):
    with make_llm(tiny_model_dir("qwen3"), tensor_parallel_size=2) as llm:
        reports = llm.engine.rank_memory
        full = make_llm(tiny_model_dir("qwen3")).engine.memory
    assert [r.rank for r in reports] == [0, 1] and all(r.ranks == 2 for r in reports)
    # each rank holds its shard: less than the whole model, and the KV pool of its KV heads
    assert all(r.weights < full.weights for r in reports)
    assert "memory of rank 1 (of 2)" in reports[1].table()


# ---- sharding rules (no processes) ----------------------------------------------------------
def test_shard_config_refuses_what_does_not_divide(tiny_model_dir):
    from nanograph.loader import read_hf_config

    config = read_hf_config(tiny_model_dir("qwen3"))
    with pytest.raises(ValueError, match=r"tensor_parallel_size=3 must divide num_attention"):
        shard_config(config, 3)
    local = shard_config(config, 2)
    assert (local.num_attention_heads, local.num_key_value_heads) == (2, 1)
    assert local.intermediate_size == config.intermediate_size // 2


def test_tp3_fails_every_rank_with_the_reason(tiny_model_dir):
    """An error every rank hits at start-up ends all of them (agreed), naming the ranks."""
    with pytest.raises(TensorParallelError, match=r"rank 0: ValueError: tensor_parallel_size=3"):
        make_llm(tiny_model_dir("qwen3"), tensor_parallel_size=3, distributed_timeout_s=TIMEOUT)


def test_shards_reassemble_the_checkpoint():
    config = ModelConfig(
        architecture="llama", vocab_size=10, hidden_size=8, intermediate_size=12,
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=2,
        max_position_embeddings=16, o_proj_bias=True,
    )  # fmt: skip
    p = "model.layers.0."
    full = {
        f"{p}self_attn.q_proj.weight": torch.randn(8, 8),
        f"{p}self_attn.o_proj.weight": torch.randn(8, 8),
        f"{p}self_attn.o_proj.bias": torch.randn(8),
        f"{p}mlp.down_proj.weight": torch.randn(8, 12),
        "model.embed_tokens.weight": torch.randn(10, 8),
        f"{p}input_layernorm.weight": torch.randn(8),
    }
    for size in (2, 4):
        for name, tensor in full.items():
            parts = [shard_tensor(name, tensor, config, r, size) for r in range(size)]
            if name.endswith("o_proj.bias"):  # added once: rank 0's, zeros elsewhere
                assert torch.equal(sum(parts), tensor)
            elif "layernorm" in name:
                assert all(torch.equal(part, tensor) for part in parts)
            else:
                dim = 1 if "o_proj" in name or "down_proj" in name else 0
                whole = torch.cat(parts, dim=dim)
                assert torch.equal(whole.narrow(dim, 0, tensor.shape[dim]), tensor)
    assert vocab_rows(10, 4) == 3  # padded: the last rank holds 1 real row and 2 zero rows
    k = torch.arange(4.0)[:, None].expand(4, 8)  # 2 KV heads of head_dim 2: rows 0-1, 2-3
    kv_rows = [shard_tensor(f"{p}self_attn.k_proj.weight", k, config, r, 4)[:, 0] for r in range(4)]
    assert [row.tolist() for row in kv_rows] == [[0, 1], [0, 1], [2, 3], [2, 3]]


# ---- env:// (torchrun's rendezvous), two local processes ------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch_ranks(
    models: list[Path], out: Path, script: str = "tp_rank.py"
) -> list[subprocess.CompletedProcess]:
    """Runs ``tests/SCRIPT MODEL OUT`` once per model, as env:// ranks 0, 1, ..."""
    port = _free_port()
    root = Path(__file__).resolve().parents[1]
    procs = []
    for rank, model in enumerate(models):
        env = dict(
            os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
            LOCAL_RANK=str(rank), WORLD_SIZE=str(len(models)),
            # a rank that aborts (the rare "terminate called without an active exception" of
            # rank 0 at exit) prints its threads' Python stacks into the assertion's output
            PYTHONFAULTHANDLER="1",
            PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
        )  # fmt: skip
        procs.append(
            subprocess.Popen(
                [sys.executable, str(root / "tests" / script), str(model), str(out)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )  # fmt: skip
        )
    done = []
    for proc in procs:
        try:
            stdout, _ = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise AssertionError("a rank hung") from None
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout))
    return done


def test_agreements_across_ranks(tmp_path):
    """A capture failure on rank 1 alone is an error on both ranks, naming rank 1; page counts
    agree on the smallest; different ladders are refused on both ranks."""
    ranks = _launch_ranks([tmp_path, tmp_path], tmp_path / "unused", script="tp_agree.py")
    assert [r.returncode for r in ranks] == [0, 0], [r.stdout[-2000:] for r in ranks]
    for r in ranks:
        assert (
            "failure: decode capture of bs=8 failed on rank 1: MemoryError: out of memory in "
            "capture" in r.stdout
        )
        assert "none: None" in r.stdout and "min: 90" in r.stdout
        assert (
            "equal: graph shapes differ between ranks: rank 0 has (1, 2, 4), rank 1 has (1, 2)"
            in r.stdout
        )


def test_env_rendezvous_two_processes(tiny_model_dir, tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    from tp_rank import PARAMS, PROMPTS

    path = tiny_model_dir("qwen3")
    ranks = _launch_ranks([path, path], tmp_path / "out.json")
    assert [r.returncode for r in ranks] == [0, 0], [r.stdout[-2000:] for r in ranks]
    assert json.loads((tmp_path / "out.json").read_text()) == tokens(path, PROMPTS, PARAMS)[0]


def test_rank_failing_at_start_up_ends_every_rank(tiny_model_dir, tmp_path):
    """Rank 1's checkpoint folder has no weights: both ranks exit non-zero, naming rank 1."""
    broken = tmp_path / "no-weights"
    broken.mkdir()
    (broken / "config.json").write_text((tiny_model_dir("qwen3") / "config.json").read_text())
    ranks = _launch_ranks([tiny_model_dir("qwen3"), broken], tmp_path / "out.json")
    assert all(r.returncode != 0 for r in ranks)
    named = "loading the model failed on rank 1: ModelLoadError"
    assert all(named in r.stdout for r in ranks), [r.stdout[-2000:] for r in ranks]
    assert not (tmp_path / "out.json").exists()


def test_worker_that_dies_fails_the_engine(tiny_model_dir):
    """A worker killed mid-run: rank 0's next step raises, naming the rank, without a hang."""
    llm = make_llm(tiny_model_dir("qwen3"), tensor_parallel_size=2, distributed_timeout_s=TIMEOUT)
    from nanograph.distributed import launch

    (worker,) = launch._launches[id(llm.engine.tp)].workers.values()
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(timeout=TIMEOUT)
    outs = llm.generate(prompts(2), GREEDY)
    assert all(o.finish_reason == "error" for o in outs)
    assert "rank 1" in outs[0].error and "restart the engine" in outs[0].error
    assert "rank 1" in llm.engine.broken  # what ends a server's loop (test_serve_front.py)
    llm.close()


def test_serve_with_two_ranks(tiny_model_dir):
    """``nanograph serve --tensor-parallel-size 2``: one command, streamed tokens equal TP=1
    offline, and SIGTERM stops rank 0 and its worker cleanly."""
    pytest.importorskip("fastapi")
    import httpx
    from serving import ServerProcess

    path = tiny_model_dir("qwen3")
    batch = prompts(1, seed=5)
    expected = tokens(path, batch)[0][0]
    server = ServerProcess(
        "--model", str(path), "--tensor-parallel-size", "2", "--kv-cache-bytes", str(4 * 2**20),
        "--page-size", "4", "--distributed-timeout-s", str(TIMEOUT), "--quiet",
    )  # fmt: skip
    try:
        body = {"prompt": batch[0], "max_tokens": GREEDY.max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True, "return_token_ids": True}  # fmt: skip
        r = httpx.post(f"{server.base}/v1/completions", json=body, timeout=TIMEOUT)
        events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        choices = [json.loads(e)["choices"][0] for e in events[:-1]]
        assert [t for c in choices for t in c.get("token_ids", [])] == expected
    finally:
        assert server.stop(timeout=TIMEOUT) == 0, server.output()[-3000:]
