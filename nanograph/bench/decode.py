"""``nanograph bench decode``: decode tokens/s per decode graph backend and batch size.

Each arm is an engine with the decode path on one backend (prefill eager in every arm, so only
decode differs). A batch of B prompts of 512 tokens generates 256 tokens each; decode
throughput is the tokens after the first over the time from the first sampled token to the
last. Next to it: the memory roofline at batch 1 (bytes of the weights one token reads / the
copy bandwidth measured on this device at the start of the run, recorded in the JSON; a MoE
model reads its top-k experts of each layer, not all of them) and, optionally, transformers
``generate`` on the same weights at batch 1. Without CUDA only the ``eager`` arm runs (``none``
is accepted for it: the engine's ``--decode-cuda-graph`` flag calls it that). Arm modifiers, side by
side with the plain arm: ``BACKEND:serial`` turns the overlap schedule off (the host reads each
step's tokens before it schedules the next); ``BACKEND:cublas`` runs the one-row products of
batch 1 through cuBLAS instead of the Triton GEMV (they combine: ``full:cublas:serial``);
``BACKEND:tpN`` shards the model over N GPUs (tensor parallelism: ``full`` beside ``full:tp2``);
``BACKEND:unfused`` turns the fused layers off: the batch-1 decode's (RMSNorm in the GEMVs'
prologue, the residual add in their epilogue: ``layers.ops.set_fused_decode``) and the
few-row one of batches 2 to ``ops.FEW_ROWS`` (the RMSNorms in the few-row products:
``layers.ops.set_fused_rows``); ``BACKEND:fused`` turns the batch-1 one on whatever the hidden
size (``auto`` fuses MoE layers, and dense ones up to ``ops.FUSED_DECODE_MAX_HIDDEN``): the
comparison arms of ``full``.
On CUDA each arm also records, per batch size, the GPU work of one decode step at the prompt's
context from the profiler: kernels, memsets and copies per forward and the kernels' summed time
(``step_kernels``; the sampler is not included).
"""

from __future__ import annotations

import argparse
import functools

import torch

from nanograph.bench.common import (
    ARMS,
    STARTUP_CAPTURE,
    TP_MODIFIERS,
    Unavailable,
    default_out,
    device,
    environment,
    figure,
    figure_path,
    free_engine,
    generate,
    graph_flag,
    measure_copy_bandwidth,
    median,
    parse_arms,
    tensor_parallel_size,
    timed,
    write,
)
from nanograph.cli import int_list, model_list

MODIFIERS = ("serial", "cublas", "unfused", "fused", *TP_MODIFIERS)


def roofline_tok_s(weights_bytes: int, bandwidth_bytes_s: float) -> float:
    """Batch-1 decode bound: every step streams the weights once at the copy bandwidth."""
    return bandwidth_bytes_s / weights_bytes


def measure_arm(model: str, arm: str, batches: list[int], prompt_len: int, new_tokens: int,
                repeats: int, moe_backend: str = "auto",
                quantization: str | None = None) -> dict:  # fmt: skip
    from nanograph.layers import ops

    modifiers = arm.split(":")[1:]
    # before capture: graphs record the kernels
    ops.use_triton_gemv("cublas" not in modifiers)
    ops.set_fused_decode(
        "off" if "unfused" in modifiers else "always" if "fused" in modifiers else "auto"
    )
    ops.set_fused_rows("off" if "unfused" in modifiers else "auto")
    try:
        return _measure(model, graph_flag(arm), "serial" in modifiers, batches, prompt_len,
                        new_tokens, repeats, moe_backend, tensor_parallel_size(arm),
                        quantization)  # fmt: skip
    finally:
        ops.use_triton_gemv(True)
        ops.set_fused_decode("auto")
        ops.set_fused_rows("auto")


def step_kernels(llm, batch: int, context: int, repeats: int = 5) -> dict:
    """The GPU work of one decode forward of ``batch`` requests at ``context`` tokens each, from
    the profiler: kernels, memsets and copies per forward, and the kernels' summed time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from nanograph.bench.floor import step_batch

    fb, pages = step_batch(llm, context, batch)
    try:
        runner = llm.engine.runner
        runner.forward(fb)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(repeats):
                runner.forward(fb)
            torch.cuda.synchronize()
    finally:
        for p in pages:
            llm.engine.kv_cache.allocator.free(p)
    counts = {"kernels": 0, "memsets": 0, "copies": 0}
    kernel_us = 0.0
    for event in prof.events():
        if event.device_type != DeviceType.CUDA:
            continue
        name = event.name.lower()
        kind = "memsets" if "memset" in name else "copies" if "memcpy" in name else "kernels"
        counts[kind] += 1
        if kind == "kernels":
            kernel_us += event.time_range.elapsed_us()
    out = {kind: n / repeats for kind, n in counts.items()}
    out["kernel_ms"] = kernel_us / repeats / 1000
    return out


def _measure(model: str, backend: str, serial: bool, batches: list[int], prompt_len: int,
             new_tokens: int, repeats: int, moe_backend: str, tp: int,
             quantization: str | None = None) -> dict:  # fmt: skip
    from nanograph import LLM, SamplingParams

    llm = LLM(
        model, load_format="dummy", decode_cuda_graph=backend, prefill_cuda_graph="none",
        cuda_graph_bs=tuple(batches), max_num_seqs=max(batches),
        max_model_len=prompt_len + new_tokens + 16, progress=False,
        disable_overlap_schedule=serial, moe_backend=moe_backend, tensor_parallel_size=tp,
        quantization=quantization, **STARTUP_CAPTURE,
    )  # fmt: skip
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    vocab = llm.engine.model_config.vocab_size
    g = torch.Generator().manual_seed(0)
    result = {
        "samples_tok_s": {}, "median_tok_s": {}, "tensor_parallel_size": tp,
        "weights_bytes": llm.engine.weights_bytes,  # rank 0's shard with tensor parallelism
        # what one decoded token reads (MoE: only its top-k experts; MXFP4 ones at 4.25 bits)
        "active_weights_bytes": llm.engine.model_config.active_weights_bytes(
            llm.engine.dtype.itemsize
        ),
        "load_s": llm.engine.load_seconds,  # weights, KV pool and graph capture
    }  # fmt: skip
    for batch in batches:
        prompts = [torch.randint(0, vocab, (prompt_len,), generator=g).tolist()
                   for _ in range(batch)]  # fmt: skip
        # warm-up long enough for the allocator, clocks and every kernel variant to settle
        generate(llm, prompts, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
        samples = []
        for _ in range(repeats):
            outs = generate(llm, prompts, params)
            first = min(o.ttft_s for o in outs)  # relative to each arrival; arrivals ~equal
            span = max(o.ttft_s + (len(o.token_ids) - 1) / o.decode_tokens_per_s for o in outs)
            samples.append(sum(len(o.token_ids) - 1 for o in outs) / (span - first))
        result["samples_tok_s"][batch] = samples
        result["median_tok_s"][batch] = median(samples)
        if torch.cuda.is_available() and tp == 1:
            result.setdefault("step_kernels", {})[batch] = step_kernels(llm, batch, prompt_len)
    runner = llm.engine.runner.graph_runners.get("decode")
    if runner is not None:
        result["replays"], result["fallbacks"] = runner.replays, runner.fallbacks
    free_engine(llm)
    return result


def transformers_generate(
    model: str, prompt_len: int, new_tokens: int, repeats: int = 3
) -> list[float]:
    """tokens/s samples of transformers ``generate`` at batch 1 (random weights, same
    architecture), after a short warm-up."""
    from nanograph.loader import resolve_model
    from nanograph.models.reference import transformers_model

    config = resolve_model(model, "dummy").config
    dev = device()
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32  # the engine's default
    hf = transformers_model(config, dtype, dev, attn_implementation="sdpa")
    ids = torch.randint(0, config.vocab_size, (1, prompt_len), device=dev)
    kwargs = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    hf.generate(ids, max_new_tokens=8, min_new_tokens=8, **kwargs)

    run = functools.partial(
        hf.generate, ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs
    )
    seconds = timed(run, repeats, warmup=0)
    del hf, run  # the partial holds the model too
    free_engine(None)  # collect it and give its memory back before the next engine sizes KV
    return [new_tokens / s for s in seconds]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nanograph bench decode", description=__doc__)
    parser.add_argument("--models", type=model_list, default="qwen3-0.6b,qwen3-8b")
    parser.add_argument("--batches", type=int_list, default="1,8,32,128")
    parser.add_argument(
        "--arms", default=None,
        help=f"decode graph backends, of {', '.join(ARMS)} ('none' = eager) [all on CUDA, "
        "eager on CPU]; modifiers :serial (overlap schedule off), :cublas, :unfused, :fused",
    )  # fmt: skip
    parser.add_argument("--moe-backend", default="auto", help="experts of MoE models")
    parser.add_argument("--quantization", default=None, help="mxfp4: gpt-oss' experts 4-bit")
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--transformers", action="store_true", help="add the transformers peer")
    parser.add_argument(
        "--transformers-tokens", type=int, default=64,
        help="new tokens per peer run (its tokens/s barely depends on it; ~10 tok/s is slow)",
    )  # fmt: skip
    parser.add_argument("--out", default=default_out("decode.json"))
    args = parser.parse_args(argv)
    default_arms = ",".join(ARMS) if torch.cuda.is_available() else "eager"
    args.arms = parse_arms("decode", args.arms or default_arms, MODIFIERS)
    forced = [a for a in args.arms if "fused" in a.split(":")[1:]]
    if forced and not torch.cuda.is_available():
        raise Unavailable(f"bench decode: {', '.join(forced)} force the fused layers' Triton "
                          "kernels, which need a CUDA device; drop :fused here")  # fmt: skip
    batches = list(args.batches)
    report = {"bench": "decode", "env": environment(), "config": vars(args), "models": {}}
    bandwidth = report["copy_bandwidth_bytes_s"] = measure_copy_bandwidth(device())
    print(f"{report['env']['device']}: copy bandwidth {bandwidth / 1e9:.1f} GB/s (measured)")
    for model in args.models:
        entry = report["models"][model] = {"arms": {}}
        for arm in args.arms:
            entry["arms"][arm] = measure_arm(
                model,
                arm,
                batches,
                args.prompt_len,
                args.new_tokens,
                args.repeats,
                args.moe_backend,
                args.quantization,
            )
            write(args.out, report)
            print(f"{model} decode={arm}: {entry['arms'][arm]['median_tok_s']}")
            for batch, k in entry["arms"][arm].get("step_kernels", {}).items():
                print(
                    f"  batch {batch}: {k['kernels']:.0f} kernels, {k['memsets']:.0f} memsets, "
                    f"{k['copies']:.0f} copies a forward; kernels {k['kernel_ms']:.3f} ms"
                )
        weights = next(iter(entry["arms"].values()))["active_weights_bytes"]
        entry["roofline_batch1_tok_s"] = roofline_tok_s(weights, bandwidth)
        if args.transformers:
            samples = transformers_generate(model, args.prompt_len, args.transformers_tokens)
            entry["transformers_batch1_samples_tok_s"] = samples
            entry["transformers_batch1_tok_s"] = median(samples)
            print(f"{model} transformers generate at batch 1: {median(samples):.1f} tok/s")
        write(args.out, report)
        series = {arm: (batches, [d["median_tok_s"][b] for b in batches])
                  for arm, d in entry["arms"].items()}  # fmt: skip
        figure(figure_path(args.out, model),
               f"decode throughput, {model} ({report['env']['device']})", "batch size",
               "tokens/s", series)  # fmt: skip
        best = max(d["median_tok_s"][batches[0]] for d in entry["arms"].values())
        print(f"{model}: roofline at batch 1 {entry['roofline_batch1_tok_s']:.0f} tok/s; best "
              f"arm at batch {batches[0]}: {best:.0f} tok/s "
              f"({100 * best / entry['roofline_batch1_tok_s']:.0f}%)")  # fmt: skip
    return 0
