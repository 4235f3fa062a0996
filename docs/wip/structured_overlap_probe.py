"""Stop 70: what a structured output costs a decode under the overlap schedule.

qwen3-0.6b's config with dummy weights and the tests' byte tokenizer (one token a byte, so a
regex of 64 letters is 64 steps): tokens/s of a batch of plain requests (ignore_eos, 64 new
tokens) against the same batch under ``[a-z]{64}`` (greedy), at batch 1 and 16, medians of 5
after a warm-up. Run it once per tree (the engine before 2026-12-07's read-ahead paused the
overlap schedule for every step a structured output was in flight).

    python3 docs/wip/structured_overlap_probe.py [--batches 1,16] [--out x.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))


def main() -> None:
    from serving import byte_tokenizer

    from nanograph import LLM, SamplingParams
    from nanograph.loader.presets import PRESET_CONFIGS

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp())
    (folder / "config.json").write_text(json.dumps(PRESET_CONFIGS[args.model]))
    byte_tokenizer().hf.save_pretrained(folder)
    llm = LLM(str(folder), load_format="dummy", progress=False, cuda_graph_capture="startup")
    arms = {
        "plain": SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True),
        "regex": SamplingParams(
            max_tokens=80, temperature=0.0, structured_outputs={"regex": "[a-z]{64}"}
        ),  # fmt: skip
    }
    results = {}
    for batch in [int(b) for b in args.batches.split(",")]:
        prompts = [[(7 * i + j) % 200 + 20 for j in range(32)] for i in range(batch)]
        for name, params in arms.items():
            llm.generate(prompts, params)  # warm-up
            rates = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                outs = llm.generate(prompts, params)
                seconds = time.perf_counter() - start
                assert all(len(o.token_ids) == 64 for o in outs), [len(o.token_ids) for o in outs]
                rates.append(64 * batch / seconds)
            results[f"{name}_b{batch}"] = statistics.median(rates)
            print(f"{name} batch {batch}: {results[f'{name}_b{batch}']:.1f} tok/s "
                  f"({', '.join(f'{r:.1f}' for r in rates)})", flush=True)  # fmt: skip
        ratio = results[f"regex_b{batch}"] / results[f"plain_b{batch}"]
        print(f"regex over plain, batch {batch}: {ratio:.3f}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
