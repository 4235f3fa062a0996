"""``nanograph bench prefix``: prefix caching on vs off, side by side, on three workloads.

- chat: ``--conversations`` conversations of ``--turns`` turns behind one shared system prompt
  (``--system`` tokens). Turn t's prompt is the system prompt, every earlier user message and
  answer, and a new user message (``--user`` tokens); answers have exactly ``--output`` tokens
  (``ignore_eos``). The turns run as waves: turn t of every conversation is submitted together
  (one ``LLM.generate``), and turn t+1 only after all of turn t's outputs returned.
- few-shot: ``--fewshot-requests`` requests that share one ``--fewshot-prefix``-token prefix
  and end in a distinct question, submitted together.
- no-sharing: ``--nosharing-requests`` unrelated ``--nosharing-prompt``-token prompts submitted
  together, ``--repeats`` times: the overhead of caching where it cannot help.

Prompts are token ids (dummy weights have no tokenizer). Each arm is one engine (the same
config but ``disable_prefix_caching``), warmed up first; between workloads the cache is
emptied, so no workload reads another's pages. Recorded per workload: TTFT per request (median
per turn for chat), wall time, total throughput ((prompt + output tokens) / wall time), and the
cache's hit rate and cached tokens. JSON + a figure of TTFT per turn.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from nanograph.bench.common import (
    STARTUP_CAPTURE,
    environment,
    figure,
    free_engine,
    generate,
    median,
    write,
)

# a small chunk spreads the few requests over steps, so later ones find what earlier ones cached
SMOKE = dict(
    model="smollm2-135m", load_format="auto", conversations=2, turns=3, system=48, user=8,
    output=2, fewshot_requests=3, fewshot_prefix=48, nosharing_requests=2, nosharing_prompt=16,
    repeats=1, chunk=64,
)  # fmt: skip


class Workloads:
    def __init__(self, llm, args: argparse.Namespace) -> None:
        self.llm, self.args = llm, args
        self.vocab = llm.engine.model_config.vocab_size
        self.g = torch.Generator().manual_seed(0)  # the same prompts in both arms

    def ids(self, n: int) -> list[int]:
        return torch.randint(0, self.vocab, (n,), generator=self.g).tolist()

    def run(self, prompts: list[list[int]], max_tokens: int) -> tuple[dict, list]:
        from nanograph import SamplingParams

        cache = self.llm.engine.prefix_cache
        before = cache.stats() if cache is not None else None
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        start = time.perf_counter()
        outs = generate(self.llm, prompts, params)
        wall = time.perf_counter() - start
        tokens = sum(len(o.prompt_token_ids) + len(o.token_ids) for o in outs)
        result = {
            "requests": len(outs), "wall_s": wall, "tokens": tokens,
            "tokens_per_s": tokens / wall, "ttft_s": [o.ttft_s for o in outs],
            "ttft_median_s": median([o.ttft_s for o in outs]),
            "prompt_tokens": sum(len(o.prompt_token_ids) for o in outs),
            "cached_tokens": sum(o.num_cached_tokens for o in outs),
        }  # fmt: skip
        if cache is not None:
            after = cache.stats()
            queried = after.queried_tokens - before.queried_tokens
            hits = after.hit_tokens - before.hit_tokens
            result["hit_rate"] = hits / queried if queried else 0.0
        return result, outs

    def empty_cache(self) -> None:
        cache = self.llm.engine.prefix_cache
        if cache is not None:
            cache.evict(self.llm.engine.kv_cache.num_pages)

    def chat(self) -> dict:
        a = self.args
        system = self.ids(a.system)
        histories = [list(system) for _ in range(a.conversations)]
        turns = []
        for _ in range(a.turns):
            for h in histories:
                h += self.ids(a.user)
            result, outs = self.run([list(h) for h in histories], a.output)
            for h, o in zip(histories, outs):
                h += o.token_ids
            turns.append(result)
        wall = sum(t["wall_s"] for t in turns)
        tokens = sum(t["tokens"] for t in turns)
        return {"turns": turns, "wall_s": wall, "tokens_per_s": tokens / wall}

    def fewshot(self) -> dict:
        a = self.args
        prefix = self.ids(a.fewshot_prefix)
        prompts = [prefix + self.ids(a.user) for _ in range(a.fewshot_requests)]
        return self.run(prompts, a.output)[0]

    def nosharing(self) -> dict:
        a = self.args
        runs = []
        for _ in range(a.repeats):
            prompts = [self.ids(a.nosharing_prompt) for _ in range(a.nosharing_requests)]
            runs.append(self.run(prompts, a.output)[0])
            self.empty_cache()
        return {"runs": runs, "tokens_per_s": median([r["tokens_per_s"] for r in runs])}


def measure_arm(args: argparse.Namespace, caching: bool) -> dict:
    from nanograph import LLM, SamplingParams

    llm = LLM(
        args.model, load_format=args.load_format, disable_prefix_caching=not caching,
        chunked_prefill_size=args.chunk, max_num_seqs=args.max_num_seqs, progress=False,
        **STARTUP_CAPTURE,
    )  # fmt: skip
    work = Workloads(llm, args)
    warm = torch.randint(0, work.vocab, (args.system + args.user,)).tolist()
    generate(llm, [warm] * 2, SamplingParams(max_tokens=args.output, ignore_eos=True))
    work.empty_cache()
    result = {}
    for name in ("chat", "fewshot", "nosharing"):
        result[name] = getattr(work, name)()
        work.empty_cache()
    if caching:
        result["memory"] = llm.engine.memory_report().as_dict()
    free_engine(llm)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nanograph bench prefix", description=__doc__)
    parser.add_argument("--model", default="qwen3-8b")
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--conversations", type=int, default=64)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--system", type=int, default=1024, help="shared system prompt tokens")
    parser.add_argument("--user", type=int, default=64, help="new user tokens per turn")
    parser.add_argument("--output", type=int, default=32, help="answer tokens per turn")
    parser.add_argument("--fewshot-requests", type=int, default=64)
    parser.add_argument("--fewshot-prefix", type=int, default=2048)
    parser.add_argument("--nosharing-requests", type=int, default=64)
    parser.add_argument("--nosharing-prompt", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3, help="no-sharing runs per arm")
    parser.add_argument("--chunk", type=int, default=8192, help="chunked_prefill_size")
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        default=64,
        help="also the largest decode graph (the workloads run 64 at a time)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a tiny CPU-sized run (smollm2-135m, 2 conversations x 3 turns)",
    )
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "nanograph"
                                             / "prefix.json"))  # fmt: skip
    if "--smoke" in (sys.argv[1:] if argv is None else argv):
        parser.set_defaults(**SMOKE)  # explicit flags still win
    args = parser.parse_args(argv)
    report = {"bench": "prefix", "env": environment(), "config": vars(args), "arms": {}}
    for caching in (False, True):
        arm = "caching" if caching else "no_caching"
        report["arms"][arm] = measure_arm(args, caching)
        write(args.out, report)
    off, on = report["arms"]["no_caching"], report["arms"]["caching"]
    summary = report["summary"] = {
        "chat_ttft_ratio_per_turn": [
            a["ttft_median_s"] / b["ttft_median_s"]
            for a, b in zip(off["chat"]["turns"], on["chat"]["turns"])
        ],
        "chat_hit_rate_per_turn": [t["hit_rate"] for t in on["chat"]["turns"]],
        "chat_throughput_ratio": on["chat"]["tokens_per_s"] / off["chat"]["tokens_per_s"],
        "fewshot_ttft_ratio": off["fewshot"]["ttft_median_s"] / on["fewshot"]["ttft_median_s"],
        "fewshot_throughput_ratio": on["fewshot"]["tokens_per_s"] / off["fewshot"]["tokens_per_s"],
        "fewshot_hit_rate": on["fewshot"]["hit_rate"],
        "nosharing_throughput_ratio": on["nosharing"]["tokens_per_s"]
        / off["nosharing"]["tokens_per_s"],
    }
    path = write(args.out, report)
    ratios = summary["chat_ttft_ratio_per_turn"]
    for t, (a, b) in enumerate(zip(off["chat"]["turns"], on["chat"]["turns"])):
        print(f"chat turn {t + 1}: TTFT median {a['ttft_median_s'] * 1e3:8.1f} ms off, "
              f"{b['ttft_median_s'] * 1e3:8.1f} ms on ({ratios[t]:.1f}x), "
              f"hit rate {b['hit_rate']:.1%}")  # fmt: skip
    for key, value in summary.items():
        if not isinstance(value, list):
            print(f"{key}: {value:.3f}")
    turns = list(range(1, args.turns + 1))
    figure(path.with_suffix(".png"),
           f"chat TTFT per turn, {args.model} ({args.conversations} conversations)", "turn",
           "median TTFT (ms)",
           {"caching off": (turns, [t["ttft_median_s"] * 1e3 for t in off["chat"]["turns"]]),
            "caching on": (turns, [t["ttft_median_s"] * 1e3 for t in on["chat"]["turns"]])},
           logx=False)  # fmt: skip
    print(f"wrote {path}")
    return 0
