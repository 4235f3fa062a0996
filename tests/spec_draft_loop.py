"""The draft runner's one-graph loop on CPU, run by tests/test_spec_engine.py in a process of
its own with TRITON_INTERPRET=1 (the loop needs graph-safe attention: the Triton kernels,
interpreted here). The loop graph is "captured" with the eager backend, which replays by
calling the very callable a CUDA graph would record, device-side metadata advance included.

Usage: python tests/spec_draft_loop.py MODEL_DIR. Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from nanograph import LLM, SamplingParams  # noqa: E402
from nanograph.graph import get_backend  # noqa: E402
from nanograph.runners.decode_runner import DraftRunner  # noqa: E402
from nanograph.runners.shapes import decode_shapes  # noqa: E402

K = 4


def main(model: str) -> None:
    args = dict(page_size=4, kv_cache_bytes=8 * 2**20, attention_backend="triton", progress=False,
                disable_prefix_caching=True)  # fmt: skip
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 11, 3)]
    params = [SamplingParams(max_tokens=m, temperature=0, ignore_eos=True) for m in (17, 6, 12)]
    plain = [o.token_ids for o in LLM(model, **args).generate(prompts, params)]
    llm = LLM(model, speculative_algorithm="draft_model", speculative_draft_model_path=model,
              speculative_num_draft_tokens=K, **args)  # fmt: skip
    e = llm.engine
    kv = e.draft_kv
    loop = DraftRunner(
        e.draft_model, e.attention, kv.k, kv.v, get_backend("eager"), decode_shapes([2, 4]),
        kv.pages_needed(e.max_model_len + K), kv.page_size, torch.device("cpu"), loop_steps=K - 1,
    )  # fmt: skip
    loop.capture(progress=False)
    e.draft_runner.graph_runners = {"draft": loop}
    got = [o.token_ids for o in llm.generate(prompts, params)]
    stats = e.speculative.stats
    print(json.dumps({
        "identical": got == plain, "replays": loop.replays, "fallbacks": loop.fallbacks,
        "draft_tokens": stats.draft_tokens, "accepted_tokens": stats.accepted_tokens,
        "eager_steps": e.draft_runner.eager_forwards.get("draft", 0),
    }))  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
