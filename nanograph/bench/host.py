"""``nanograph bench host``: where the host time of a prefill or decode goes, per graph backend.

For each arm, an engine (dummy weights) runs one workload repeatedly: ``prefill`` (one request
of --tokens prompt tokens, one output token, the prefill ladder exactly that length) or
``decode`` (--batch requests, --new-tokens tokens each, decode graphs on that arm). Reported:
the wall time per call (median after warm-up) and a cProfile of the same calls, the functions
with the most own time first. When graphs replay, host time beyond the GPU's is what the
profile shows; comparing arms shows what a break or a piece costs on this machine's CPU.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats

import torch

from nanograph.bench.common import (
    ARMS,
    STARTUP_CAPTURE,
    default_out,
    environment,
    free_engine,
    generate,
    graph_flag,
    median,
    parse_arms,
    timed,
    write,
)


def engine_for(model: str, workload: str, arm: str, tokens: int, batch: int, new_tokens: int,
               moe_backend: str = "auto"):  # fmt: skip
    from nanograph import LLM

    if workload == "prefill":
        from nanograph.bench.prefill import engine_for as prefill_engine

        return prefill_engine(model, arm, [tokens], moe_backend=moe_backend)
    return LLM(
        model, load_format="dummy", decode_cuda_graph=graph_flag(arm), prefill_cuda_graph="none",
        moe_backend=moe_backend,
        cuda_graph_bs=(batch,), max_num_seqs=batch, max_model_len=tokens + new_tokens + 16,
        progress=False, disable_prefix_caching=True,  # repeated prompts must be recomputed
        **STARTUP_CAPTURE,
    )  # fmt: skip


def profile_arm(args: argparse.Namespace, arm: str) -> dict:
    from nanograph import SamplingParams

    llm = engine_for(args.model, args.workload, arm, args.tokens, args.batch, args.new_tokens,
                     args.moe_backend)  # fmt: skip
    g = torch.Generator().manual_seed(0)
    vocab = llm.engine.model_config.vocab_size
    count = 1 if args.workload == "prefill" else args.batch
    prompts = [torch.randint(0, vocab, (args.tokens,), generator=g).tolist() for _ in range(count)]
    new_tokens = 1 if args.workload == "prefill" else args.new_tokens
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)

    def call() -> None:
        generate(llm, prompts, params)

    seconds = timed(call, args.repeats, warmup=3)
    before = _allocator_counts()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.repeats):
        call()
    profiler.disable()
    after = _allocator_counts()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.top)
    free_engine(llm)
    per_call_ms = 1000 * median(seconds)
    return {
        "samples_ms": [1000 * s for s in seconds],
        "median_ms": per_call_ms,
        "per_token_ms": per_call_ms / new_tokens,
        "profile": text.getvalue(),
        # device allocations a call makes: cudaMalloc/cudaFree inside a forward (the caching
        # allocator short of cached blocks) cost host time and synchronise the device
        "allocator_per_call": {k: (after[k] - before[k]) / args.repeats for k in after},
    }


_ALLOCATOR_KEYS = ("num_device_alloc", "num_device_free", "num_alloc_retries")


def _allocator_counts() -> dict[str, int]:
    if not torch.cuda.is_available():
        return {}
    stats = torch.cuda.memory_stats()
    return {k: stats.get(k, 0) for k in _ALLOCATOR_KEYS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nanograph bench host", description=__doc__)
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--workload", choices=("prefill", "decode"), default="prefill")
    parser.add_argument(
        "--arms", default=None,
        help=f"graph backends of the workload's path, of {', '.join(ARMS)} ('none' = eager) "
        "[full,breakable on CUDA, eager on CPU]",
    )  # fmt: skip
    parser.add_argument("--tokens", type=int, default=256, help="prompt tokens")
    parser.add_argument("--batch", type=int, default=1, help="decode requests")
    parser.add_argument("--new-tokens", type=int, default=64, help="decode tokens per request")
    parser.add_argument("--moe-backend", default="auto", help="experts of MoE models")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--top", type=int, default=25, help="profile rows per arm")
    parser.add_argument("--out", default=default_out("host.json"))
    args = parser.parse_args(argv)
    default_arms = "full,breakable" if torch.cuda.is_available() else "eager"
    args.arms = parse_arms("host", args.arms or default_arms)
    report = {"bench": "host", "env": environment(), "config": vars(args), "arms": {}}
    for arm in args.arms:
        result = report["arms"][arm] = profile_arm(args, arm)
        write(args.out, report)
        print(f"== {args.model} {args.workload} {arm}: {result['median_ms']:.2f} ms per call "
              f"({result['per_token_ms']:.3f} ms per token)")  # fmt: skip
        if result["allocator_per_call"]:
            counts = ", ".join(f"{k} {v:g}" for k, v in result["allocator_per_call"].items())
            print(f"== allocator per call: {counts}")
        print(result["profile"])
    return 0
