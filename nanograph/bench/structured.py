"""``nanograph bench structured``: what a structured output costs a decode, side by side.

One engine; each batch size runs two arms in turn, the same prompts: ``plain`` (``--tokens``
new tokens, ``ignore_eos``) and ``regex`` (greedy under ``[a-z]{N}``, N = ``--tokens``: N
letters, then the request ends). Tokens/s per run (output tokens / wall time), medians of
``--repeats`` after a warm-up, and their ratio.

A model without a tokenizer (a dummy preset) is given a byte-level one (``common.
byte_tokenizer``: one token a byte), so each letter of the form is one step; the model's
vocabulary is unchanged (a form's mask covers all of it). JSON + a figure of tokens/s by batch.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from nanograph.bench.common import (
    STARTUP_CAPTURE,
    byte_tokenizer,
    environment,
    figure,
    free_engine,
    generate,
    median,
    write,
)
from nanograph.cli import int_list

SMOKE = dict(model="smollm2-135m", load_format="auto", batches="1,2", tokens=8, repeats=1)


def model_with_tokenizer(model: str, load_format: str) -> str:
    """``model``, or for a preset without a tokenizer a folder of its config and a byte-level
    tokenizer (loaded with dummy weights)."""
    from nanograph.loader.presets import PRESET_CONFIGS, resolve_model

    if resolve_model(model, load_format).has_tokenizer:
        return model
    if model not in PRESET_CONFIGS:
        raise SystemExit(f"{model!r} has no tokenizer: a structured output needs one")
    folder = Path(tempfile.mkdtemp(prefix="nanograph-structured-"))
    (folder / "config.json").write_text(json.dumps(PRESET_CONFIGS[model]))
    byte_tokenizer().save_pretrained(folder)
    return str(folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nanograph bench structured", description=__doc__)
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--batches", type=int_list, default="1,16")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens a request")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens a request")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="a tiny CPU-sized run (smollm2-135m)")
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "nanograph"
                                             / "structured.json"))  # fmt: skip
    if "--smoke" in (sys.argv[1:] if argv is None else argv):
        parser.set_defaults(**SMOKE)  # explicit flags still win
    args = parser.parse_args(argv)

    from nanograph import LLM, SamplingParams

    llm = LLM(model_with_tokenizer(args.model, args.load_format), load_format=args.load_format,
              progress=False, **STARTUP_CAPTURE)  # fmt: skip
    arms = {
        "plain": SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True),
        "regex": SamplingParams(max_tokens=args.tokens + 16, temperature=0.0,
                                structured_outputs={"regex": f"[a-z]{{{args.tokens}}}"}),
    }  # fmt: skip
    report = {"bench": "structured", "env": environment(), "config": vars(args), "batches": {}}
    batches = list(args.batches)
    for batch in batches:
        prompts = [[(7 * i + j) % 200 + 20 for j in range(args.prompt)] for i in range(batch)]
        result = report["batches"][str(batch)] = {}
        for name, params in arms.items():
            generate(llm, prompts, params)  # warm-up
            rates = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                outs = generate(llm, prompts, params)
                seconds = time.perf_counter() - start
                if name == "regex" and not all(len(o.text) == args.tokens for o in outs):
                    raise RuntimeError(f"an answer outside the form: {outs[0].text!r}")
                tokens = sum(len(o.token_ids) for o in outs)
                rates.append(tokens / seconds)
            result[name] = {"tokens_per_s": rates, "median_tokens_per_s": median(rates),
                            "tokens": tokens}  # fmt: skip
        ratio = result["ratio"] = (
            result["regex"]["median_tokens_per_s"] / result["plain"]["median_tokens_per_s"]
        )
        plain, regex = (result[arm]["median_tokens_per_s"] for arm in ("plain", "regex"))
        print(f"batch {batch}: plain {plain:.1f} tok/s, regex {regex:.1f} ({ratio:.3f}x)",
              flush=True)  # fmt: skip
        write(args.out, report)
    free_engine(llm)
    path = write(args.out, report)
    series = {
        name: (batches, [report["batches"][str(b)][name]["median_tokens_per_s"] for b in batches])
        for name in arms
    }
    figure(path.with_suffix(".png"), f"structured output against plain decode, {args.model}",
           "batch", "tokens/s", series)  # fmt: skip
    print(f"wrote {path}")
    return 0
