"""``nanograph bench prefill``: prefill-only latency per graph backend and against transformers.

One request at a time, one output token, decode graphs off in every arm, so the time is one
prefill forward plus the engine's per-request work. Arms: eager, full, breakable, tc_piecewise,
each an engine whose prefill ladder is exactly the measured lengths (no padding); without CUDA
only ``eager`` runs (graph arms are refused). The peer is what a user would pick instead: the
same architecture and weights in transformers, in the engine's dtype, with the fastest
attention it ships for the device without extra packages (``sdpa``; recorded), asked for the
last position's logits only (``logits_to_keep=1``, all a prefill needs). On CUDA it runs under
``torch.compile(mode="reduce-overhead")`` (compile time recorded per length, as ``warmup_s``)
and is measured after the engine arms (the engine holds most of the device's memory); on CPU it
runs eagerly beside the eager arm, one call of each in turn, so both see the same load of a
shared host (recorded: ``load_average``). Reported: every sample and the median after warm-up,
and with ``--clock-period-ms N`` on a GPU the SM clock and power draw while the samples ran
(``gpu``: a long prompt back to back holds an H200 at its 700 W cap, ~13% under its top clock).
That sampler is off by default because its ``nvidia-smi`` queries slow the host-bound arms: on
an H100 (stop 53) breakable took 9.16 ms at 256 tokens with it every 20 ms and 6.06 without,
eager 29.5 against 24.9; full graphs were unaffected (2.29, 2.35).

Each arm is its own engine, measured after the one before, so a host whose speed drifts
between arms (stop 62: one machine's breakable samples fell in runs ~1.5x apart) moves the
ratio of two arms. ``--eager-beside`` also times each graph arm's own engine with its graphs
off (``ModelRunner.graphs_off``), one call of each in turn: ``eager_beside`` in the arm's
results and ``speedup_over_eager_beside``, the median of the paired samples' ratios.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from nanograph.bench.clocks import ClockSampler
from nanograph.bench.common import (
    ARMS,
    EAGER,
    STARTUP_CAPTURE,
    TP_MODIFIERS,
    default_out,
    device,
    environment,
    figure,
    figure_path,
    free_engine,
    generate,
    graph_flag,
    load_average,
    median,
    parse_arms,
    sync,
    tensor_parallel_size,
    timed,
    write,
)
from nanograph.cli import int_list, model_list

PEER = "transformers"
PEER_ATTENTION = "sdpa"  # flash_attention_2 would need the flash-attn package
BESIDE = "eager beside"  # a graph arm's own engine with its graphs off (--eager-beside)


def engine_for(model: str, arm: str, lengths: list[int], load_format: str = "dummy", **extra):
    from nanograph import LLM

    return LLM(
        model, load_format=load_format, decode_cuda_graph="none",
        prefill_cuda_graph=graph_flag(arm),
        prefill_graph_tokens=tuple(lengths), chunked_prefill_size=max(lengths),
        max_num_seqs=2, max_model_len=max(lengths) + 16, progress=False,
        disable_prefix_caching=True,  # the same prompt repeats: every call must compute it all
        **STARTUP_CAPTURE, **extra,
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


def engine_call(llm) -> Callable[[list[int]], object]:
    from nanograph import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    return lambda prompt: generate(llm, [prompt], params)


def eager_call(llm) -> Callable[[list[int]], object]:
    """``engine_call`` with the engine's graphs off for the call."""
    call = engine_call(llm)

    def eager(prompt: list[int]) -> object:
        with llm.engine.runner.graphs_off():
            return call(prompt)

    return eager


def build_peer(config, dtype: torch.dtype, hf_state: dict) -> tuple[dict, Callable]:
    """transformers on the same weights and dtype: last-token logits, sdpa attention, compiled
    (reduce-overhead) on CUDA, eager on CPU. Returns (its description, a call on a prompt)."""
    from nanograph.models.reference import transformers_model

    dev = device()
    hf = transformers_model(config, dtype, dev, hf_state, attn_implementation=PEER_ATTENTION)
    compile_mode = "reduce-overhead" if dev.type == "cuda" else None
    run = torch.compile(hf, mode=compile_mode, dynamic=False) if compile_mode else hf

    def call(prompt: list[int]) -> list[int]:
        with torch.inference_mode():
            ids = torch.tensor([prompt], device=dev)
            out = run(input_ids=ids, use_cache=False, logits_to_keep=1)
            return out.logits[:, -1].argmax(-1).tolist()

    info = {"attn_implementation": hf.config._attn_implementation, "compile": compile_mode,
            "dtype": str(dtype).removeprefix("torch."), "logits_to_keep": 1}  # fmt: skip
    return info, call


def measure(calls: dict[str, Callable], lengths: dict[str, list[int]], vocab: int,
            repeats: int, results: dict[str, dict], clock_period_ms: int = 0) -> None:  # fmt: skip
    """Samples (ms) of every call at each of its lengths into ``results[name]``. Calls that
    share a length alternate within each repeat, so they see the same host load and the same
    GPU clock (``gpu``: the clock, power and limits while they ran, ``bench.clocks``; long
    prompts back to back can hold an H200 at its power cap). Warm-up: two calls on CUDA
    (reduce-overhead records its graph on the second; ``warmup_s`` is then the peer's compile
    time), one on CPU."""
    warmup = 2 if torch.cuda.is_available() else 1
    all_lengths = sorted({n for ns in lengths.values() for n in ns})
    for length, prompt in prompts(vocab, all_lengths).items():
        names = [name for name in calls if length in lengths[name]]
        for name in names:
            start = time.perf_counter()
            for _ in range(warmup):
                calls[name](prompt)
            sync()
            results[name].setdefault("warmup_s", {})[length] = time.perf_counter() - start
        samples: dict[str, list[float]] = {name: [] for name in names}
        with ClockSampler(period_ms=clock_period_ms) as clocks:
            for _ in range(repeats):
                for name in names:
                    call = calls[name]
                    seconds = timed(lambda c=call, p=prompt: c(p), repeats=1, warmup=0)
                    samples[name].append(1000 * seconds[0])
        gpu = clocks.summary()
        for name in names:
            r = results[name]
            if gpu:
                r.setdefault("gpu", {})[length] = gpu
            r.setdefault("samples_ms", {})[length] = samples[name]
            r.setdefault("median_ms", {})[length] = ms = median(samples[name])
            r.setdefault("tokens_per_s", {})[length] = length / (ms / 1000)
    for name in calls:
        results[name]["load_average_after"] = load_average()


def measure_model(model: str, args: argparse.Namespace, lengths: list[int]) -> dict:
    """Every arm, and the peer: on CPU beside the eager arm (one engine, samples alternating),
    on CUDA after the last arm (the engine holds most of the device memory)."""
    peer_lengths = list(args.peer_lengths)
    beside = bool(peer_lengths) and not torch.cuda.is_available()
    entry: dict = {"arms": {}}
    hf_state = None
    for arm in args.arms:
        tp = tensor_parallel_size(arm)
        llm = engine_for(model, arm, lengths, args.load_format, moe_backend=args.moe_backend,
                         tensor_parallel_size=tp, quantization=args.quantization)  # fmt: skip
        config, dtype = llm.engine.model_config, llm.engine.dtype
        result = entry["arms"][arm] = {"build_s": build_seconds(llm), "tensor_parallel_size": tp,
                                       "load_s": llm.engine.load_seconds}  # fmt: skip
        calls, results, arm_lengths = {arm: engine_call(llm)}, {arm: result}, {arm: lengths}
        if args.eager_beside and arm != EAGER:  # the same engine, graphs off, in turn
            calls[BESIDE], arm_lengths[BESIDE] = eager_call(llm), lengths
            results[BESIDE] = result["eager_beside"] = {}
        if beside and tp == 1:  # the peer takes the whole model's weights
            entry["peer"], calls[PEER] = build_peer(config, dtype, llm.engine.model.hf_state_dict())
            results[PEER], arm_lengths[PEER], beside = entry["peer"], peer_lengths, False
        measure(calls, arm_lengths, config.vocab_size, args.repeats, results,
                args.clock_period_ms)  # fmt: skip
        medians = result["median_ms"].items()
        print(f"{model} {arm}: " + ", ".join(f"{n}={ms:.2f}ms" for n, ms in medians))
        if BESIDE in results:
            paired = entry.setdefault("speedup_over_eager_beside", {})[arm] = {
                n: median([e / g for e, g in zip(results[BESIDE]["samples_ms"][n], samples)])
                for n, samples in result["samples_ms"].items()
            }  # fmt: skip
            print(f"{model} {arm} over eager on its engine, paired: "
                  + ", ".join(f"{n}={x:.2f}x" for n, x in paired.items()))  # fmt: skip
        for n, gpu in result.get("gpu", {}).items():
            print(
                f"  {n}: SM clock {gpu['sm_mhz']:.0f} MHz, {gpu['power_w']:.0f} W, at the "
                f"power cap in {gpu['power_capped']:.0%} of {gpu['samples']} samples"
            )
        runner = llm.engine.runner.graph_runners.get("prefill")
        if runner is not None:
            result["replays"], result["fallbacks"] = runner.replays, runner.fallbacks
        if peer_lengths and "peer" not in entry and tp == 1:
            hf_state = {name: t.clone() for name, t in llm.engine.model.hf_state_dict().items()}
        llm.close()
        del llm, calls, results, runner  # before the next arm's engine is built
        free_engine(None)
    if peer_lengths and "peer" not in entry and hf_state is not None:
        entry["peer"], call = build_peer(config, dtype, hf_state)
        measure({PEER: call}, {PEER: peer_lengths}, config.vocab_size, args.repeats,
                {PEER: entry["peer"]}, args.clock_period_ms)  # fmt: skip
        del call, hf_state
        torch._dynamo.reset()  # drop a compiled peer before the next model
        free_engine(None)
    if "peer" in entry:
        peer = entry["peer"]
        print(f"{model} transformers ({peer['attn_implementation']}, compile "
              f"{peer['compile']}): {peer['median_ms']}")  # fmt: skip
        entry["speedup_over_peer"] = ratios(entry["arms"], peer["median_ms"])
    eager = entry["arms"].get(EAGER, {}).get("median_ms", {})
    entry["speedup_over_eager"] = ratios(entry["arms"], eager)
    return entry


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="nanograph bench prefill", description=__doc__)
    parser.add_argument("--models", type=model_list, default="qwen3-0.6b,qwen3-8b")
    parser.add_argument("--lengths", type=int_list, default="256,512,1024,2048,4096,8192")
    parser.add_argument(
        "--arms", default=None,
        help=f"comma-separated, of {', '.join(ARMS)} ('none' = eager) [all on CUDA, eager on "
        "CPU]; graph arms need CUDA",
    )  # fmt: skip
    parser.add_argument(
        "--peer-lengths", type=int_list, default=None,
        help="lengths for the transformers peer ('' = skip it) [256,2048 on CUDA, where each "
        "length compiles for ~40 s; every --lengths on CPU]",
    )  # fmt: skip
    parser.add_argument(
        "--load-format", default="dummy",
        help="dummy (random weights) or auto (the model's own, e.g. smollm2-135m's GGUF)",
    )  # fmt: skip
    parser.add_argument("--moe-backend", default="auto", help="experts of MoE models")
    parser.add_argument(
        "--quantization", default=None,
        help="mxfp4: gpt-oss' experts 4-bit (no transformers peer: it takes dense weights)",
    )  # fmt: skip
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--clock-period-ms", type=int, default=0,
        help="record the SM clock and power while the samples run, from nvidia-smi every N ms "
        "(e.g. 20; its queries slow host-bound arms) [0: off]",
    )  # fmt: skip
    parser.add_argument(
        "--eager-beside", action="store_true",
        help="also time each graph arm's engine with its graphs off, alternating with the arm "
        "(a ratio that host drift between arms cannot move)",
    )  # fmt: skip
    parser.add_argument("--out", default=default_out("prefill.json"))
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    args.arms = parse_arms(
        "prefill", args.arms or (",".join(ARMS) if cuda else EAGER), TP_MODIFIERS
    )
    if args.quantization and args.peer_lengths:
        raise SystemExit("bench prefill: the transformers peer takes dense weights; with "
                         "--quantization give --peer-lengths ''")  # fmt: skip
    if args.peer_lengths is None:
        args.peer_lengths = () if args.quantization else (256, 2048) if cuda else args.lengths
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    lengths = list(args.lengths)
    report = {"bench": "prefill", "env": environment(), "config": vars(args), "models": {}}
    for model in args.models:
        entry = report["models"][model] = measure_model(model, args, lengths)
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
        for key, what in (
            ("speedup_over_eager", "eager"),
            ("speedup_over_peer", "transformers"),
            ("speedup_over_eager_beside", "eager on its own engine, paired"),
        ):
            if key not in entry:  # no peer, or no --eager-beside
                continue
            lines.append(f"{model}: speedup over {what} (latency ms)")
            for arm, per_length in entry.get(key, {}).items():
                cells = "  ".join(
                    f"{n}:{s:.2f}x({entry['arms'][arm]['median_ms'][n]:.1f})"
                    for n, s in per_length.items()
                )
                lines.append(f"  {arm:<13} {cells}")
    return "\n".join(lines)
