"""``nanograph bench spec``: speculative decoding against plain decoding, and its cost model.

Arms (``--arms``): ``off``; ``ngram:K``; ``draft:K`` (the ``--drafter`` model drafts);
``self:K`` (the target drafts for itself: with the same random weights every draft is right,
so it measures the machinery's overhead at full acceptance). Each arm is one engine with random
weights (graphs on their defaults on CUDA, eager on CPU), prefix caching off; at each batch size
B, B random prompts (prefilled in one forward) generate ``--new-tokens`` tokens each.

Recorded per arm and batch: measured tokens/s (every sample and the median, tokens after the
first over the span from first to last token), the mean accepted length L (tokens a request
gains per verify forward; fewer than k+1 near max_tokens, where fewer drafts are allowed) and
the acceptance rate (accepted / proposed drafts). The cost model, each figure a median of timed
forwards on scratch pages (no KV written): a plain decode step t_decode(B) of the target; a
verify forward of k+1 tokens per request t_verify(B) (aim at batch 1, k=4: <= 1.15 x t_decode;
``verify_over_decode``, and ``verify_over_decode_back_to_back``, the same ratio of forwards
issued back to back: the device's times without host latency); the draft loop as the engine
runs it, a draft-extend forward of 2 tokens per request and k-1 draft steps chained on the
device, t_loop(B), beside k plain decode steps of the drafter (aim: no more;
``draft_loop_over_k_drafter_steps``, and ``..._back_to_back``, the same ratio of device
times: a synchronised step pays one host round trip, a synchronised loop one for k steps, so
the first ratio is the lower). That loop catches up on 2 tokens, as after a verify that kept
all k drafts; after one that kept fewer the catch-up is one token (``draft_loop_one_token``,
``draft_loop_one_token_over_k_drafter_steps_back_to_back``), and the model weighs the two by
the fraction of verified requests that kept all their drafts (``all_accepted_fraction``; in
device time ``draft_loop_as_run_over_k_drafter_steps_back_to_back``). Predicted tokens/s =
B x L / (t_verify + t_loop) (n-gram: t_loop = 0, its host step is not modelled), beside the
measured one (aim: within 10%); where a fraction of the steps had no draft for any request
(n-gram finding no match), those steps cost t_decode instead of t_verify
(``verify_step_fraction``). Capture seconds of every runner, target and drafter.

The measured span also holds what that steady-state model leaves out: a draft model's first
proposal for a fresh batch catches up on every whole prompt (``DraftModelDrafter._catch_up``:
B x prompt tokens through the drafter, chunked by its token budget), after the requests' first
tokens. ``t_catch_up(B)`` times those forwards (scratch pages, no KV written), and
``predicted_with_catch_up_tok_s`` = B x (n - 1) / ((n - 1) / L x (t_verify + t_loop) +
t_catch_up) for n new tokens: at batch 64 a qwen3-8b self-draft catches up on 32k tokens, a
cost of the order of the whole decode (37fae24: 3,581 tok/s measured against 6,865 predicted
without it).
Random weights make n-gram and draft acceptance unlike real text: read them with L.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch

from nanograph.arith import ceil_div
from nanograph.bench.common import (
    STARTUP_CAPTURE,
    default_out,
    environment,
    figure,
    free_engine,
    generate,
    median,
    timed,
)
from nanograph.bench.common import write as write_json
from nanograph.cli import int_list
from nanograph.runners.decode_runner import DecodeRunner
from nanograph.runners.forward_batch import ForwardBatch
from nanograph.runners.model_runner import ModelRunner
from nanograph.runners.selection import make_backend
from nanograph.runners.shapes import ShapeKey


def parse_arm(arm: str) -> tuple[str | None, int]:
    """(algorithm or None, k) of an arm name."""
    if arm == "off":
        return None, 0
    kind, _, k = arm.partition(":")
    algorithm = {"ngram": "ngram", "draft": "draft_model", "self": "draft_model"}.get(kind)
    if algorithm is None or not k.isdigit() or int(k) < 1:
        raise ValueError(f"unknown arm {arm!r}: off, ngram:K, draft:K or self:K (K >= 1)")
    return algorithm, int(k)


def _mix(fraction: float, a: float, b: float) -> float:
    """The cost of steps of which ``fraction`` cost ``a`` and the rest ``b``."""
    return fraction * a + (1 - fraction) * b


def scratch_batch(batch: int, query_len: int, context: int, page_size: int,
                  all_rows: bool) -> ForwardBatch:  # fmt: skip
    """``batch`` requests of ``query_len`` new tokens after ``context`` cached ones, all on the
    scratch page, writing no KV; every row sampled (verify) or the last of each (decode)."""
    n = batch * query_len
    seq = context + query_len
    rows = list(range(n)) if all_rows else [query_len * (b + 1) - 1 for b in range(batch)]
    return ForwardBatch(
        input_ids=[0] * n, positions=[context + i for _ in range(batch) for i in range(query_len)],
        seq_lens=[seq] * batch, query_lens=[query_len] * batch,
        page_tables=[[0] * ceil_div(seq, page_size)] * batch, slot_mapping=[-1] * n,
        sample_rows=rows, page_size=page_size,
    )  # fmt: skip


def forward_ms(runner, batch: ForwardBatch, path: str, repeats: int) -> float:
    """Median ms of one forward and its logits (an argmax of them, as greedy decoding does)."""
    return 1e3 * median(timed(lambda: runner.forward(batch, path=path).argmax(-1), repeats))


def back_to_back_ms(runner, batch: ForwardBatch, path: str, repeats: int) -> float:
    """Ms per forward (and argmax) issued ``repeats`` times with one sync at the end: the host
    runs ahead, so on a GPU this is the device's time for one, without the host latency a
    synchronised forward pays (a median of three such runs)."""
    return _back_to_back(lambda: runner.forward(batch, path=path).argmax(-1), repeats)


def _back_to_back(fn, repeats: int) -> float:
    """Ms per call of ``fn`` issued ``repeats`` times with one sync at the end (median of 3)."""

    def run() -> None:
        for _ in range(repeats):
            fn()

    return 1e3 * median(timed(run, 3)) / repeats


def draft_loop_ms(
    engine, batch: int, k: int, context: int, repeats: int, catch_up: int = 2
) -> tuple[float, float]:
    """Ms of the draft loop as the drafter runs a greedy batch: a draft-extend forward of
    ``catch_up`` tokens a request (2 after a verify that kept all k drafts, else 1), then the
    k-1 steps (one replay of the loop graph where the draft runner holds one, else one-step
    forwards taking the previous step's tokens on the device); the median of synchronised
    loops, and loops issued back to back (the device's time)."""
    runner, page = engine.draft_runner, engine.config.page_size
    loop = runner.graph_runners.get("draft")
    extend = scratch_batch(batch, catch_up, context, page, all_rows=False)
    step = ForwardBatch.build([[0]] * batch, [context + catch_up] * batch, extend.page_tables,
                              page, [True] * batch, list(range(batch)))  # fmt: skip
    step = dataclasses.replace(step, slot_mapping=[-1] * batch)  # no KV write, as the others

    def run() -> None:
        tokens = runner.forward(extend, path="draft_extend").argmax(-1)
        if loop is not None and loop.loop_steps and loop.draft_loop(step, tokens) is not None:
            return
        for _ in range(k - 1):
            tokens = runner.forward(step, tokens, path="draft").argmax(-1)

    return 1e3 * median(timed(run, repeats)), _back_to_back(run, repeats)


def catch_up_ms(engine, batch: int, prompt_len: int, repeats: int) -> float:
    """Median ms of the drafter's catch-up over ``batch`` whole prompts, as its first proposal
    for a fresh batch runs it: forwards of at most its token budget, a prompt longer than the
    budget in budget-sized chunks after its earlier ones."""
    runner, page = engine.draft_runner, engine.config.page_size
    budget = engine.speculative.drafter.token_budget
    forwards = []
    if prompt_len <= budget:
        per = budget // prompt_len  # whole prompts a forward
        for start in range(0, batch, per):
            forwards.append(scratch_batch(min(per, batch - start), prompt_len, 0, page, False))
    else:
        for _ in range(batch):
            for done in range(0, prompt_len, budget):
                n = min(budget, prompt_len - done)
                forwards.append(scratch_batch(1, n, done, page, False))

    def run() -> None:
        for forward in forwards:
            runner.forward(forward, path="draft_extend").argmax(-1)

    return 1e3 * median(timed(run, repeats))


def drafter_decode_ms(engine, batch: int, context: int, repeats: int) -> tuple[float, float]:
    """Ms of one plain decode step of the draft model, on a decode graph captured here with the
    draft runner's backend (the draft runner's own graphs may hold whole loops): the median of
    synchronised steps, and of steps issued back to back (the device's time)."""
    kv, page = engine.draft_kv, engine.config.page_size
    loop = engine.draft_runner.graph_runners.get("draft")
    graphs = []
    if loop is not None:
        decode = DecodeRunner(
            engine.draft_model, engine.attention, kv.k, kv.v, make_backend(loop.backend.name),
            [ShapeKey(batch, batch)], loop.static.max_pages, page, engine.device,
        )  # fmt: skip
        decode.capture(progress=False)
        graphs.append(decode)
    runner = ModelRunner(engine.draft_model, engine.attention, kv.k, kv.v, engine.device, graphs)
    step = scratch_batch(batch, 1, context, page, False)
    ms = forward_ms(runner, step, "decode", repeats), back_to_back_ms(runner, step, "decode",
                                                                       repeats)  # fmt: skip
    for graph_runner in graphs:
        graph_runner.release()
    return ms


def capture_seconds(model_runner) -> dict[str, float]:
    return {
        path: sum(r.capture_s for r in runner.records.values())
        for path, runner in model_runner.graph_runners.items()
    }


def measure_arm(args: argparse.Namespace, arm: str, batches: list[int]) -> dict:
    from nanograph import LLM, SamplingParams

    algorithm, k = parse_arm(arm)
    cuda = torch.cuda.is_available()
    engine_args = dict(
        load_format="dummy", decode_cuda_graph="auto" if cuda else "none",
        prefill_cuda_graph="none", cuda_graph_bs=tuple(batches), max_num_seqs=max(batches),
        max_model_len=args.prompt_len + args.new_tokens + 32, disable_prefix_caching=True,
        # every batch's prompts prefill in one forward, so all first tokens come together and
        # the measured span is decoding only, as the cost model is (at 2e051d3 a chunk of 8192
        # put batch 64's later prefills inside the span: 5,726 measured vs 10,273 predicted)
        chunked_prefill_size=max(8192, max(batches) * args.prompt_len),
        progress=False, **STARTUP_CAPTURE,
    )  # fmt: skip
    if algorithm is not None:
        drafter = args.target if arm.startswith("self") else args.drafter
        engine_args |= dict(speculative_algorithm=algorithm, speculative_num_draft_tokens=k)
        if algorithm == "draft_model":
            engine_args["speculative_draft_model_path"] = drafter
    llm = LLM(args.target, **engine_args)
    engine = llm.engine
    result = {
        "load_s": engine.load_seconds, "capture_s": capture_seconds(engine.runner),
        "samples_tok_s": {}, "median_tok_s": {}, "mean_accepted_length": {},
        "acceptance_rate": {}, "verify_step_fraction": {}, "costs_ms": {}, "predicted_tok_s": {},
        "predicted_with_catch_up_tok_s": {}, "all_accepted_fraction": {},
    }  # fmt: skip
    if engine.draft_runner is not None:
        result["draft_capture_s"] = capture_seconds(engine.draft_runner)
    vocab = engine.model_config.vocab_size
    page = engine.config.page_size
    g = torch.Generator().manual_seed(0)
    params = SamplingParams(max_tokens=args.new_tokens, temperature=0, ignore_eos=True)
    for batch in batches:
        prompts = [torch.randint(0, vocab, (args.prompt_len,), generator=g).tolist()
                   for _ in range(batch)]  # fmt: skip
        generate(llm, prompts, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
        stats = engine.speculative.stats if engine.speculative is not None else None
        counters = ("requests", "emitted_tokens", "draft_tokens", "accepted_tokens", "steps",
                    "verify_forwards", "all_accepted")  # fmt: skip
        before = [getattr(stats, c) for c in counters] if stats else []
        samples = []
        for _ in range(args.repeats):
            outs = generate(llm, prompts, params)
            first = min(o.ttft_s for o in outs)
            span = max(o.ttft_s + (len(o.token_ids) - 1) / o.decode_tokens_per_s for o in outs)
            samples.append(sum(len(o.token_ids) - 1 for o in outs) / (span - first))
        result["samples_tok_s"][batch] = samples
        result["median_tok_s"][batch] = median(samples)
        accepted, verifying, all_kept = 1.0, 0.0, 0.0
        if stats is not None:
            requests, emitted, drafted, kept, steps, verifies, whole = (
                getattr(stats, c) - b for c, b in zip(counters, before)
            )
            accepted = emitted / max(1, requests)
            result["acceptance_rate"][batch] = kept / max(1, drafted)
            verifying = verifies / max(1, steps)
            result["verify_step_fraction"][batch] = verifying
            all_kept = whole / max(1, requests)
            result["all_accepted_fraction"][batch] = all_kept
        result["mean_accepted_length"][batch] = accepted
        decode = scratch_batch(batch, 1, args.prompt_len, page, False)
        costs = {"decode": forward_ms(engine.runner, decode, "decode", args.repeats * 4)}
        step_ms = costs["decode"]
        if algorithm is not None:
            verify = scratch_batch(batch, k + 1, args.prompt_len, page, all_rows=True)
            costs["verify"] = forward_ms(engine.runner, verify, "verify", args.repeats * 4)
            costs["verify_over_decode"] = costs["verify"] / costs["decode"]
            # the same ratio of device times (forwards back to back): host latency left out
            decode_gpu = back_to_back_ms(engine.runner, decode, "decode", args.repeats * 4)
            verify_gpu = back_to_back_ms(engine.runner, verify, "verify", args.repeats * 4)
            costs["verify_over_decode_back_to_back"] = verify_gpu / decode_gpu
            # a step where no request got a draft runs a plain decode forward
            step_ms = _mix(verifying, costs["verify"], costs["decode"])
        if engine.draft_runner is not None:
            costs["drafter_decode"], drafter_gpu = drafter_decode_ms(
                engine, batch, args.prompt_len, args.repeats * 4
            )
            costs["draft_loop"], loop_gpu = draft_loop_ms(engine, batch, k, args.prompt_len,
                                                          args.repeats * 4)  # fmt: skip
            costs["draft_loop_over_k_drafter_steps"] = costs["draft_loop"] / (
                k * costs["drafter_decode"]
            )
            # the same ratio of device times: the synchronised one counts a host round trip
            # per drafter step against one per loop, which favours the loop
            costs["draft_loop_over_k_drafter_steps_back_to_back"] = loop_gpu / (k * drafter_gpu)
            # after a verify that kept fewer than k drafts the catch-up is one token a request
            costs["draft_loop_one_token"], one_token_gpu = draft_loop_ms(
                engine, batch, k, args.prompt_len, args.repeats * 4, catch_up=1
            )
            costs["draft_loop_one_token_over_k_drafter_steps_back_to_back"] = one_token_gpu / (
                k * drafter_gpu
            )
            # the loop as this run's verifies called for it: the two catch-ups weighed by the
            # fraction of requests that kept all their drafts
            costs["draft_loop_as_run_over_k_drafter_steps_back_to_back"] = _mix(
                all_kept, loop_gpu, one_token_gpu
            ) / (k * drafter_gpu)
            step_ms += _mix(all_kept, costs["draft_loop"], costs["draft_loop_one_token"])
            costs["catch_up"] = catch_up_ms(engine, batch, args.prompt_len, args.repeats)
        result["costs_ms"][batch] = costs
        result["predicted_tok_s"][batch] = 1e3 * batch * accepted / step_ms
        steps = (args.new_tokens - 1) / accepted  # verify forwards in the measured span
        span_ms = steps * step_ms + costs.get("catch_up", 0.0)
        with_catch_up = 1e3 * batch * (args.new_tokens - 1) / span_ms
        result["predicted_with_catch_up_tok_s"][batch] = with_catch_up
        print(f"{arm} batch {batch}: {result['median_tok_s'][batch]:.1f} tok/s measured, "
              f"{result['predicted_tok_s'][batch]:.1f} predicted ({with_catch_up:.1f} with the "
              f"drafter's catch-up), L={accepted:.2f}, "
              f"costs {({n: round(v, 3) for n, v in costs.items()})}")  # fmt: skip
    free_engine(llm)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nanograph bench spec", description=__doc__)
    parser.add_argument("--target", default="qwen3-8b")
    parser.add_argument("--drafter", default="qwen3-0.6b")
    parser.add_argument("--arms", default="off,ngram:2,ngram:4,ngram:8,draft:4,self:4")
    parser.add_argument("--batches", type=int_list, default="1,4,16,64")
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=default_out("spec.json"))
    args = parser.parse_args(argv)
    arms = args.arms.split(",")
    for arm in arms:
        parse_arm(arm)  # refuse a bad name before loading anything
    batches = list(args.batches)
    report = {"bench": "spec", "env": environment(), "config": vars(args), "arms": {}}
    for arm in arms:
        report["arms"][arm] = measure_arm(args, arm, batches)
        write_json(args.out, report)
    out = Path(args.out)
    series = {f"{arm} measured": (batches, [d["median_tok_s"][b] for b in batches])
              for arm, d in report["arms"].items()}  # fmt: skip
    series |= {f"{arm} predicted": (batches, [d["predicted_tok_s"][b] for b in batches])
               for arm, d in report["arms"].items() if arm != "off"}  # fmt: skip
    figure(out.with_suffix(".png"),
           f"speculative decoding, {args.target} ({report['env']['device']})", "batch size",
           "tokens/s", series)  # fmt: skip
    return 0
