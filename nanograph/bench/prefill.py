"""``nanograph bench prefill``: prefill-only latency per graph backend, side by side.

One request at a time, one output token, decode graphs off in every arm, so the time is one
prefill forward plus the engine's per-request work. Arms: eager, full, breakable, tc_piecewise,
each an engine whose prefill ladder is exactly the measured lengths (no padding), and the peer
a user would pick instead: the same architecture and weights in transformers under
``torch.compile(mode="reduce-overhead")`` (its compile time recorded per length).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from nanograph.bench.common import environment, figure, free_engine, median, timed, write

ARMS = ("eager", "full", "breakable", "tc_piecewise")


def engine_for(model: str, arm: str, lengths: list[int], **extra):
    from nanograph import LLM

    return LLM(
        model, load_format="dummy", decode_cuda_graph="none",
        prefill_cuda_graph="none" if arm == "eager" else arm,
        prefill_graph_tokens=tuple(lengths), chunked_prefill_size=max(lengths),
        max_num_seqs=2, max_model_len=max(lengths) + 16, progress=False, **extra,
    )  # fmt: skip


def build_seconds(llm) -> dict[str, float]:
    runner = llm.engine.runner.graph_runners.get("prefill")
    if runner is None:
        return {"total": 0.0, "compile": 0.0}
    compile_s = sum(g.stats.compile_s for g in runner.graphs.values())
    return {"total": sum(r.capture_s for r in runner.records.values()), "compile": compile_s}


def measure_arm(
    model: str, arm: str, lengths: list[int], repeats: int, moe_backend: str = "auto",
    keep_weights: bool = True,
) -> tuple[dict, dict | None]:  # fmt: skip
    """The arm's latencies, and its weights under Hugging Face names for the peer (copies on
    the device: ``keep_weights=False`` skips them when there is no peer)."""
    from nanograph import SamplingParams

    llm = engine_for(model, arm, lengths, moe_backend=moe_backend)
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    g = torch.Generator().manual_seed(0)
    vocab = llm.engine.model_config.vocab_size
    result = {"build_s": build_seconds(llm), "load_s": llm.engine.load_seconds,
              "samples_ms": {}, "median_ms": {}, "tokens_per_s": {}}  # fmt: skip
    for length in lengths:
        prompt = torch.randint(0, vocab, (length,), generator=g).tolist()
        samples = [1000 * s for s in timed(lambda p=prompt: llm.generate([p], params), repeats)]
        result["samples_ms"][length] = samples
        result["median_ms"][length] = median(samples)
        result["tokens_per_s"][length] = length / (median(samples) / 1000)
    runner = llm.engine.runner.graph_runners.get("prefill")
    if runner is not None:
        result["replays"], result["fallbacks"] = runner.replays, runner.fallbacks
    hf_state = None
    if keep_weights:
        hf_state = {name: t.clone() for name, t in llm.engine.model.hf_state_dict().items()}
    free_engine(llm)
    return result, hf_state


def measure_peer(model: str, hf_state: dict, lengths: list[int], repeats: int) -> dict:
    """transformers + torch.compile(reduce-overhead) on the same weights."""
    import time

    from nanograph.loader import resolve_model
    from nanograph.models.reference import transformers_model

    config = resolve_model(model, "dummy").config
    hf = transformers_model(config, torch.bfloat16, "cuda", hf_state)
    compiled = torch.compile(hf, mode="reduce-overhead", dynamic=False)
    result = {"compile_s": {}, "samples_ms": {}, "median_ms": {}}
    g = torch.Generator().manual_seed(0)
    for length in lengths:
        ids = torch.randint(0, config.vocab_size, (1, length), generator=g).cuda()

        def step(ids=ids):
            with torch.inference_mode():
                return compiled(input_ids=ids, use_cache=False).logits[:, -1].argmax(-1).tolist()

        start = time.perf_counter()
        step()
        step()  # reduce-overhead records its CUDA graph on the second call
        result["compile_s"][length] = time.perf_counter() - start
        samples = [1000 * s for s in timed(step, repeats, warmup=1)]
        result["samples_ms"][length], result["median_ms"][length] = samples, median(samples)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nanograph bench prefill", description=__doc__)
    parser.add_argument("--models", default="qwen3-0.6b,qwen3-8b")
    parser.add_argument("--lengths", default="256,512,1024,2048,4096,8192")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument(
        "--peer-lengths",
        default="256,2048",
        help="lengths for the transformers peer ('' = skip it)",
    )
    parser.add_argument("--moe-backend", default="auto", help="experts of MoE models")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default="benchmarks/results/prefill.json")
    args = parser.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    report = {"bench": "prefill", "env": environment(), "config": vars(args), "models": {}}
    for model in args.models.split(","):
        entry = report["models"][model] = {"arms": {}}
        hf_state = None
        for arm in args.arms.split(","):
            entry["arms"][arm], hf_state = measure_arm(
                model, arm, lengths, args.repeats, args.moe_backend, bool(args.peer_lengths)
            )
            write(args.out, report)
            medians = entry["arms"][arm]["median_ms"].items()
            print(f"{model} {arm}: " + ", ".join(f"{n}={ms:.2f}ms" for n, ms in medians))
        if args.peer_lengths and hf_state is not None:
            peer_lengths = [int(x) for x in args.peer_lengths.split(",")]
            entry["peer"] = measure_peer(model, hf_state, peer_lengths, args.repeats)
            torch._dynamo.reset()  # drop the compiled peer before the next model
            torch.cuda.empty_cache()
            print(f"{model} transformers+compile: {entry['peer']['median_ms']}")
        eager = entry["arms"].get("eager", {}).get("median_ms", {})
        entry["speedup_over_eager"] = {
            arm: {n: eager[n] / ms for n, ms in data["median_ms"].items() if n in eager}
            for arm, data in entry["arms"].items()
        }
        write(args.out, report)
        series = {arm: (lengths, [d["median_ms"][n] for n in lengths])
                  for arm, d in entry["arms"].items()}  # fmt: skip
        if "peer" in entry:
            ps = sorted(entry["peer"]["median_ms"])
            series["transformers+compile"] = (ps, [entry["peer"]["median_ms"][n] for n in ps])
        figure(Path(args.out).with_name(f"{Path(args.out).stem}_{model}.png"),
               f"prefill latency, {model} ({report['env']['device']})", "prompt tokens",
               "latency (ms)", series)  # fmt: skip
    print(speedup_table(report))
    return 0


def speedup_table(report: dict) -> str:
    lines = []
    for model, entry in report["models"].items():
        lines.append(f"{model}: speedup over eager (latency ms)")
        for arm, per_length in entry["speedup_over_eager"].items():
            cells = "  ".join(
                f"{n}:{s:.2f}x({entry['arms'][arm]['median_ms'][n]:.1f})"
                for n, s in per_length.items()
            )
            lines.append(f"  {arm:<13} {cells}")
    return "\n".join(lines)
