"""One rank of an env:// tensor-parallel run, as torchrun (or a node's launcher) would start it.

``python tests/tp_rank.py MODEL OUT`` with MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE set: every
rank builds ``LLM(MODEL, tensor_parallel_size=WORLD_SIZE)``; rank 0 generates and writes the
greedy tokens of ``PROMPTS`` to OUT as JSON (ranks 1.. never return from ``LLM(...)``).
"""

from __future__ import annotations

import json
import os
import sys

from nanograph import LLM, SamplingParams

PROMPTS = [[1, 2, 3, 4, 5, 6, 7], list(range(10, 40)), [5]]
PARAMS = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def main() -> None:
    model, out = sys.argv[1], sys.argv[2]
    llm = LLM(
        model, tensor_parallel_size=int(os.environ["WORLD_SIZE"]), page_size=4,
        kv_cache_bytes=4 * 2**20, progress=False, distributed_timeout_s=60,
    )  # fmt: skip
    tokens = [o.token_ids for o in llm.generate(PROMPTS, PARAMS)]
    llm.close()
    with open(out, "w") as f:
        json.dump(tokens, f)


if __name__ == "__main__":
    main()
