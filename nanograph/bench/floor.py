"""``nanograph bench floor``: the kernel floor of one forward (sum of GPU kernel times from the
profiler), with the fused kernels: prefill at a few prompt lengths, or one decode step of a
batch at a given context (``--decode-batch``).

A CUDA graph removes launch gaps; the floor is what remains, the sum of the kernels it replays.
Also lists the most expensive kernels, to show where the floor goes, and the time per forward
when forwards are issued back to back with no host sync between them (``back_to_back_ms``):
with ``--graph`` on, the host runs ahead of the GPU, so this is the GPU's time for a step,
gaps between kernels included, unless the runner's host work takes longer (qwen3-0.6b at batch
1: 2.96 ms back to back for 0.83 ms of busy GPU; the engine's overlap schedule hides that host
work, 0.88 ms a step). ``replay_ms`` leaves the host out: the captured graph replayed back to
back, the GPU's time for a step, gaps included. An engine step that takes longer waits on
the host.

Kernels overlap under programmatic dependent launch (a GEMV starts and loads weights while the
kernel before it finishes), so their summed times overstate the step. ``busy_ms`` attributes
the GPU's busy time instead: walking the kernels in start order, each gets only the time it
runs past every kernel before it (``busy_top_ms``); ``idle_ms`` is the time no kernel runs.
"""

from __future__ import annotations

import argparse
import time

import torch

from nanograph.bench.common import (
    ARMS,
    EAGER,
    STARTUP_CAPTURE,
    Unavailable,
    default_out,
    environment,
    free_engine,
    generate,
    graph_flag,
    parse_arms,
    sync,
    write,
)
from nanograph.cli import int_list


def step_batch(
    llm, length: int, decode_batch: int = 0, new_tokens: int = 1
) -> tuple[object, list[list[int]]]:
    """(ForwardBatch, its pages): a prefill of ``length`` tokens, or (``decode_batch`` > 0) one
    step of that many requests with ``length`` tokens of context each, the last
    ``new_tokens`` of them new (1: a decode step; more: an extend, e.g. a draft-extend's
    catch-up). Give the pages back with ``llm.engine.kv_cache.allocator.free`` once done."""
    from nanograph.runners.forward_batch import ForwardBatch

    kv = llm.engine.kv_cache
    requests = max(decode_batch, 1)
    # the prefix cache may hold the pages of finished requests: it gives them up first
    cache = llm.engine.scheduler.cache
    take = cache.allocate if cache is not None else kv.allocator.allocate
    pages = [take(kv.pages_needed(length)) for _ in range(requests)]
    if any(p is None for p in pages):
        for p in pages:
            if p is not None:
                kv.allocator.free(p)
        raise MemoryError(f"{requests} x {length} tokens do not fit the KV pool")
    ids = [torch.randint(0, llm.engine.model_config.vocab_size, (length,)).tolist()
           for _ in range(requests)]  # fmt: skip
    done, new = (
        ([length - new_tokens] * requests, [new_tokens] * requests) if decode_batch
        else ([0], [length])
    )  # fmt: skip
    new_ids = [i[c : c + k] for i, c, k in zip(ids, done, new)]
    return ForwardBatch.build(new_ids, done, pages, kv.page_size, [True] * requests), pages


def kernel_floor(llm, length: int, repeats: int, decode_batch: int = 0) -> dict:
    """Prefill of ``length`` tokens, or (``decode_batch`` > 0) one decode step of that many
    requests with ``length`` tokens of context each."""
    from torch.profiler import ProfilerActivity, profile

    kv = llm.engine.kv_cache
    batch, pages = step_batch(llm, length, decode_batch)
    runner = llm.engine.runner
    cuda = torch.cuda.is_available()
    for _ in range(3):
        runner.forward(batch)
    sync()
    # before the profiler: once it has run, its tracing can slow the launches that follow
    start = time.perf_counter()
    for _ in range(repeats):
        runner.forward(batch).argmax(dim=-1)  # the sampler's greedy work, without its sync
    sync()
    back_to_back_ms = 1000 * (time.perf_counter() - start) / repeats
    replay_ms = graph_replay_ms(runner, batch, decode_batch, repeats) if cuda else None
    # on CPU (smoke runs) the figure is CPU operator time, not a kernel floor
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            runner.forward(batch)
        sync()
    for p in pages:
        kv.allocator.free(p)
    kernels = {}
    for event in prof.key_averages():
        if cuda:
            device_us = getattr(event, "self_device_time_total", None)
            if device_us is None:
                device_us = event.self_cuda_time_total
        else:
            device_us = event.self_cpu_time_total
        if device_us > 0:
            kernels[event.key] = device_us / repeats / 1000  # ms per forward
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:12]
    busy, idle_ms = busy_time(prof.events(), cuda)
    return {
        "floor_ms": sum(kernels.values()),
        "back_to_back_ms": back_to_back_ms,
        "replay_ms": replay_ms,
        "kernels": len(kernels),
        "top_ms": dict(top),
        "busy_ms": sum(busy.values()) / repeats,
        "idle_ms": idle_ms / repeats,
        "busy_top_ms": {
            k: v / repeats for k, v in sorted(busy.items(), key=lambda kv: -kv[1])[:12]
        },
    }


def graph_replay_ms(runner, batch, decode_batch: int, repeats: int) -> float | None:
    """GPU time of the batch's captured graph replayed back to back (CUDA events around
    ``repeats`` replays, none of the runner's host work between them): the step's kernels and
    the gaps between them. None where no graph takes the batch."""
    from nanograph.attention.op import forward_context

    graphs = runner.graph_runners.get("decode" if decode_batch else "prefill")
    shape = graphs.dispatch(batch) if graphs is not None and graphs.live is None else None
    if shape is None:
        return None
    graphs.replay(shape, batch, None)  # the batch's inputs into the static buffers
    graph = graphs.graphs[shape]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with forward_context(graphs.contexts[shape]):  # a breakable graph's breaks run eagerly
        graph.replay()
        start.record()
        for _ in range(repeats):
            graph.replay()
        end.record()
    sync()
    return start.elapsed_time(end) / repeats


def engine_steps(llm, length: int, decode_batch: int, steps: int, trace: str | None = None) -> dict:
    """Where the engine's decode step goes, graph and all (the lm_head and sampler after it, the
    next step's input copies): ``generate`` of ``steps + 1`` tokens a request against one token
    (its prefill), both under the profiler, on fresh random prompts of ``length`` tokens (no
    prefix-cache hits); the difference over ``steps`` is one decode step. Compare ``busy_ms +
    idle_ms`` with ``replay_ms``: what the graph leaves to the rest of the step. ``trace``: a
    path for the Chrome trace of the ``steps + 1`` run (CPU calls and GPU work, to see the gaps)."""
    from torch.profiler import ProfilerActivity, profile

    from nanograph import SamplingParams

    vocab = llm.engine.model_config.vocab_size
    cuda = torch.cuda.is_available()

    def run(tokens: int, trace: str | None = None) -> tuple[dict[str, float], float, float]:
        prompts = [torch.randint(0, vocab, (length,)).tolist() for _ in range(max(decode_batch, 1))]
        params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
        activities = [ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]
        if trace and cuda:
            activities.append(ProfilerActivity.CPU)  # the host side of each gap
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            generate(llm, prompts, params)
            sync()
            wall = time.perf_counter() - start
        if trace:
            prof.export_chrome_trace(trace)
        busy, idle = busy_time(prof.events(), cuda)
        return busy, idle, 1000 * wall

    run(steps + 1)  # warm-up
    busy_one, idle_one, wall_one = run(1)
    busy_all, idle_all, wall_all = run(steps + 1, trace)
    per_step = {k: (v - busy_one.get(k, 0.0)) / steps for k, v in busy_all.items()}
    return {
        "steps": steps,
        "wall_ms": (wall_all - wall_one) / steps,
        "busy_ms": sum(per_step.values()),
        "idle_ms": (idle_all - idle_one) / steps,
        "busy_top_ms": dict(sorted(per_step.items(), key=lambda kv: -kv[1])[:16]),
    }


def busy_time(events, cuda: bool) -> tuple[dict[str, float], float]:
    """(name -> ms of busy time it alone accounts for, ms between kernels with none running)
    over the profiled kernels (CPU ops on CPU): see the module docstring."""
    from torch.autograd import DeviceType

    kind = DeviceType.CUDA if cuda else DeviceType.CPU
    spans = sorted(
        (e.time_range.start, e.time_range.end, e.name) for e in events if e.device_type == kind
    )
    busy: dict[str, float] = {}
    idle = 0.0
    reach = None  # the latest end so far
    for start, end, name in spans:
        if reach is not None and start > reach:
            idle += start - reach
        past = end - (start if reach is None else max(start, reach))
        if past > 0:
            busy[name] = busy.get(name, 0.0) + past / 1000
        reach = end if reach is None else max(reach, end)
    return busy, idle / 1000


def _top(ms: dict[str, float], count: int, digits: int = 2) -> str:
    """The first ``count`` entries of a name -> ms table, names cut to 40 characters."""
    return ", ".join(f"{k[:40]} {v:.{digits}f}" for k, v in list(ms.items())[:count])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nanograph bench floor", description=__doc__)
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--lengths", type=int_list, default="256,2048")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--decode-batch",
        type=int,
        default=0,
        help="profile one decode step of this many requests (context = length)",
    )
    parser.add_argument(
        "--graph",
        default=EAGER,
        help=f"graph backend of the profiled path (decode with --decode-batch, else prefill), "
        f"one of {', '.join(ARMS)} ('none' = eager); graph backends need CUDA",
    )
    parser.add_argument(
        "--engine-steps",
        type=int,
        default=0,
        help="with --decode-batch: also profile this many of the engine's decode steps "
        "(generate), graph, lm_head, sampler and input copies together",
    )
    parser.add_argument(
        "--trace",
        default=None,
        help="with --engine-steps: write the Chrome trace of the profiled steps (CPU and GPU) "
        "to this path (the last length's)",
    )
    parser.add_argument(
        "--fused-decode",
        choices=("auto", "off", "always"),
        default="auto",
        help="the fused batch-1 decode layer (auto: where it applies and pays; always: at any "
        "hidden size) or the unfused one (off), as `bench decode`'s :fused / :unfused modifiers",
    )
    parser.add_argument("--out", default=default_out("floor.json"))
    args = parser.parse_args(argv)
    (args.graph,) = parse_arms("floor", args.graph, flag="--graph")
    if args.fused_decode == "always" and not torch.cuda.is_available():
        raise Unavailable("bench floor: --fused-decode always forces the fused layer's Triton "
                          "kernels, which need a CUDA device")  # fmt: skip
    from nanograph.layers import ops

    ops.set_fused_decode(args.fused_decode)  # before capture: graphs record the kernels
    try:
        return _run(args)
    finally:
        ops.set_fused_decode("auto")


def _run(args: argparse.Namespace) -> int:
    from nanograph import LLM

    flag = graph_flag(args.graph)
    lengths = list(args.lengths)
    llm = LLM(
        args.model, load_format="dummy",
        decode_cuda_graph=flag if args.decode_batch else "none",
        prefill_cuda_graph="none" if args.decode_batch else flag,
        cuda_graph_bs=(args.decode_batch,) if args.decode_batch else None,
        prefill_graph_tokens=None if args.decode_batch else tuple(lengths),
        chunked_prefill_size=max(lengths), max_num_seqs=max(2, args.decode_batch),
        max_model_len=max(lengths) + 16 + args.engine_steps,
        progress=False, **STARTUP_CAPTURE,
    )  # fmt: skip
    report = {"bench": "floor", "env": environment(), "config": vars(args), "lengths": {}}
    for length in lengths:
        r = report["lengths"][length] = kernel_floor(llm, length, args.repeats, args.decode_batch)
        what = f"decode x{args.decode_batch} at" if args.decode_batch else "prefill"
        print(f"{args.model} {what} {length} tokens ({args.graph}): kernel floor "
              f"{r['floor_ms']:.2f} ms, back to back {r['back_to_back_ms']:.2f} ms per forward "
              + (f"(graph replays alone {r['replay_ms']:.3f} ms) " if r["replay_ms"] else "") +
              f"over {r['kernels']} kernel kinds; top: {_top(r['top_ms'], 4)}")  # fmt: skip
        print(f"  busy {r['busy_ms']:.2f} ms (each kernel past the ones before it), idle "
              f"{r['idle_ms']:.2f} ms: {_top(r['busy_top_ms'], 8)}")  # fmt: skip
        if args.engine_steps and args.decode_batch:
            e = r["engine_steps"] = engine_steps(
                llm, length, args.decode_batch, args.engine_steps, args.trace
            )
            print(f"  engine decode step: {e['wall_ms']:.3f} ms wall, busy {e['busy_ms']:.3f} ms, "
                  f"idle {e['idle_ms']:.3f} ms: {_top(e['busy_top_ms'], 12, 3)}")  # fmt: skip
    write(args.out, report)
    free_engine(llm)
    print("unfused plain-PyTorch figures from the issue (256 tokens): eager 28.6 ms, full graph "
          "4.9 ms (floor 4.3 ms), torch.compile reduce-overhead 2.1 ms")  # fmt: skip
    return 0
