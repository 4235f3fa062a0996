"""``nanograph bench prefill``: prefill-only latency per graph backend and against transformers.

One request at a time, one output token, decode graphs off in every arm, so the time is one
prefill forward plus the engine's per-request work. Arms: eager, full, breakable, tc_piecewise,
each an engine whose prefill ladder is exactly the measured lengths (no padding); without CUDA
only ``eager`` runs (graph arms are refused). The peer is what a user would pick instead: the
same architecture and weights in transformers, in the engine's dtype, with the fastest
attention it ships for the device without extra packages (``sdpa``; recorded), asked for the
last position's logits only (``logits_to_keep=1``, all a prefill needs). On CUDA it runs under
``torch.compile(mode="reduce-overhead")`` (compile time recorded per length); on CPU eagerly.
Each arm's samples are medians after a warm-up call.
"""

from __future__ import annotations

import argparse

import torch

from nanograph.bench.common import (
    ARMS,
    EAGER,
    default_out,
    device,
    environment,
    figure,
    figure_path,
    free_engine,
    graph_flag,
    load_average,
    median,
    parse_arms,
    timed,
    write,
)

PEER_ATTENTION = "sdpa"  # flash_attention_2 would need the flash-attn package


def engine_for(model: str, arm: str, lengths: list[int], load_format: str = "dummy", **extra):
    from nanograph import LLM

    return LLM(
        model, load_format=load_format, decode_cuda_graph="none",
        prefill_cuda_graph=graph_flag(arm),
        prefill_graph_tokens=tuple(lengths), chunked_prefill_size=max(lengths),
        max_num_seqs=2, max_model_len=max(lengths) + 16, progress=False, **extra,
    )  # fmt: skip


def build_seconds(llm) -> dict[str, float]:
    runner = llm.engine.runner.graph_runners.get("prefill")
    if runner is None:
        return {"total": 0.0, "compile": 0.0}
    compile_s = sum(g.stats.compile_s for g in runner.graphs.values())
    return {"total": sum(r.capture_s for r in runner.records.values()), "compile": compile_s}


def prompts(vocab: int, lengths: list[int]) -> dict[int, list[int]]:
    """The same random prompt per length for every arm and the peer."""
    g = torch.Generator().manual_seed(0)
    return {n: torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths}


def measure_arm(model: str, arm: str, lengths: list[int], repeats: int, load_format: str):
    """(result, the engine's weights under Hugging Face names, model config, dtype)."""
    from nanograph import SamplingParams

    llm = engine_for(model, arm, lengths, load_format)
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    result = {"build_s": build_seconds(llm), "load_s": llm.engine.load_seconds,
              "samples_ms": {}, "median_ms": {}, "tokens_per_s": {}}  # fmt: skip
    for length, prompt in prompts(llm.engine.model_config.vocab_size, lengths).items():
        call = lambda p=prompt: llm.generate([p], params)  # noqa: E731
        samples = [1000 * s for s in timed(call, repeats, warmup=1)]
        result["samples_ms"][length] = samples
        result["median_ms"][length] = median(samples)
        result["tokens_per_s"][length] = length / (median(samples) / 1000)
    runner = llm.engine.runner.graph_runners.get("prefill")
    if runner is not None:
        result["replays"], result["fallbacks"] = runner.replays, runner.fallbacks
    result["load_average_after"] = load_average()
    hf_state = {name: t.clone() for name, t in llm.engine.model.hf_state_dict().items()}
    config, dtype = llm.engine.model_config, llm.engine.dtype
    free_engine(llm)
    return result, hf_state, config, dtype


def measure_peer(config, dtype: torch.dtype, hf_state: dict, lengths: list[int],
                 repeats: int) -> dict:  # fmt: skip
    """transformers on the same weights and dtype: last-token logits, sdpa attention, compiled
    (reduce-overhead) on CUDA, eager on CPU."""
    import time

    from nanograph.models.reference import transformers_model

    dev = device()
    hf = transformers_model(config, dtype, dev, hf_state, attn_implementation=PEER_ATTENTION)
    compile_mode = "reduce-overhead" if dev.type == "cuda" else None
    run = torch.compile(hf, mode=compile_mode, dynamic=False) if compile_mode else hf
    result = {
        "attn_implementation": hf.config._attn_implementation, "compile": compile_mode,
        "dtype": str(dtype).removeprefix("torch."), "logits_to_keep": 1,
        "compile_s": {}, "samples_ms": {}, "median_ms": {},
    }  # fmt: skip
    for length, prompt in prompts(config.vocab_size, lengths).items():
        ids = torch.tensor([prompt], device=dev)

        def step(ids=ids):
            with torch.inference_mode():
                out = run(input_ids=ids, use_cache=False, logits_to_keep=1)
                return out.logits[:, -1].argmax(-1).tolist()

        start = time.perf_counter()
        step()
        if compile_mode:
            step()  # reduce-overhead records its CUDA graph on the second call
            result["compile_s"][length] = time.perf_counter() - start
        samples = [1000 * s for s in timed(step, repeats, warmup=1)]
        result["samples_ms"][length], result["median_ms"][length] = samples, median(samples)
    result["load_average_after"] = load_average()
    return result


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="nanograph bench prefill", description=__doc__)
    parser.add_argument("--models", default="qwen3-0.6b,qwen3-8b")
    parser.add_argument("--lengths", default="256,512,1024,2048,4096,8192")
    parser.add_argument(
        "--arms", default=None,
        help=f"comma-separated, of {', '.join(ARMS)} ('none' = eager) [all on CUDA, eager on "
        "CPU]; graph arms need CUDA",
    )  # fmt: skip
    parser.add_argument(
        "--peer-lengths", default=None,
        help="lengths for the transformers peer ('' = skip it) [256,2048 on CUDA, where each "
        "length compiles for ~40 s; every --lengths on CPU]",
    )  # fmt: skip
    parser.add_argument(
        "--load-format", default="dummy",
        help="dummy (random weights) or auto (the model's own, e.g. smollm2-135m's GGUF)",
    )  # fmt: skip
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=default_out("prefill.json"))
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    args.arms = parse_arms("prefill", args.arms or (",".join(ARMS) if cuda else EAGER))
    if args.peer_lengths is None:
        args.peer_lengths = "256,2048" if cuda else args.lengths
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    report = {"bench": "prefill", "env": environment(), "config": vars(args), "models": {}}
    for model in args.models.split(","):
        entry = report["models"][model] = {"arms": {}}
        for arm in args.arms:
            entry["arms"][arm], hf_state, config, dtype = measure_arm(
                model, arm, lengths, args.repeats, args.load_format
            )
            write(args.out, report)
            medians = entry["arms"][arm]["median_ms"].items()
            print(f"{model} {arm}: " + ", ".join(f"{n}={ms:.2f}ms" for n, ms in medians))
        if args.peer_lengths:
            peer_lengths = [int(x) for x in args.peer_lengths.split(",")]
            peer = entry["peer"] = measure_peer(config, dtype, hf_state, peer_lengths,
                                                args.repeats)  # fmt: skip
            del hf_state
            torch._dynamo.reset()  # drop a compiled peer before the next model
            free_engine(None)
            print(f"{model} transformers ({peer['attn_implementation']}, compile "
                  f"{peer['compile']}): {peer['median_ms']}")  # fmt: skip
            entry["speedup_over_peer"] = ratios(entry["arms"], peer["median_ms"])
        eager = entry["arms"].get(EAGER, {}).get("median_ms", {})
        entry["speedup_over_eager"] = ratios(entry["arms"], eager)
        write(args.out, report)
        series = {arm: (lengths, [d["median_ms"][n] for n in lengths])
                  for arm, d in entry["arms"].items()}  # fmt: skip
        if "peer" in entry:
            ps = sorted(entry["peer"]["median_ms"])
            label = "transformers" + ("+compile" if entry["peer"]["compile"] else "")
            series[label] = (ps, [entry["peer"]["median_ms"][n] for n in ps])
        figure(figure_path(args.out, model),
               f"prefill latency, {model} ({report['env']['device']})", "prompt tokens",
               "latency (ms)", series)  # fmt: skip
    print(speedup_table(report))
    return 0


def ratios(arms: dict, baseline: dict[int, float]) -> dict[str, dict[int, float]]:
    """Per arm and length: baseline ms / arm ms (> 1: the arm is faster)."""
    return {
        arm: {n: baseline[n] / ms for n, ms in data["median_ms"].items() if n in baseline}
        for arm, data in arms.items()
    }


def speedup_table(report: dict) -> str:
    lines = []
    for model, entry in report["models"].items():
        for key, what in (("speedup_over_eager", "eager"), ("speedup_over_peer", "transformers")):
            lines.append(f"{model}: speedup over {what} (latency ms)")
            for arm, per_length in entry.get(key, {}).items():
                cells = "  ".join(
                    f"{n}:{s:.2f}x({entry['arms'][arm]['median_ms'][n]:.1f})"
                    for n, s in per_length.items()
                )
                lines.append(f"  {arm:<13} {cells}")
    return "\n".join(lines)
