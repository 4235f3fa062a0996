"""A one-token draft-extend (qwen3-0.6b drafter, k = 4) replayed in its one-token shape and in
the k+1-token shape it took before, back to back (device time)."""

import time

import torch

from nanograph import LLM
from nanograph.bench.common import STARTUP_CAPTURE
from nanograph.bench.spec import scratch_batch
from nanograph.runners.shapes import ShapeKey

llm = LLM(
    "qwen3-0.6b", load_format="dummy", prefill_cuda_graph="none", cuda_graph_bs=(1, 4),
    max_num_seqs=4, max_model_len=700, disable_prefix_caching=True, chunked_prefill_size=8192,
    progress=False, speculative_algorithm="draft_model", speculative_draft_model_path="qwen3-0.6b",
    speculative_num_draft_tokens=4, **STARTUP_CAPTURE,
)  # fmt: skip
engine = llm.engine
extend = engine.draft_runner.graph_runners["draft_extend"]
print("draft_extend shapes:", sorted(str(s) for s in extend.graphs), "capture s",
      {str(s): round(r.capture_s, 3) for s, r in extend.records.items()})  # fmt: skip


def back_to_back(fn, n: int = 50) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / n * 1e3)
    return sorted(samples)[1]


def extend_costs(bs: int) -> dict[str, float]:
    page = engine.config.page_size
    one = scratch_batch(bs, 1, 512, page, all_rows=False)
    two = scratch_batch(bs, 2, 512, page, all_rows=False)
    one_shape, padded, two_shape = extend.dispatch(one), ShapeKey(bs * 5, bs), extend.dispatch(two)
    return {
        f"one token in {one_shape}": back_to_back(lambda: extend.replay(one_shape, one, None)),
        f"one token in {padded}": back_to_back(lambda: extend.replay(padded, one, None)),
        f"two tokens in {two_shape}": back_to_back(lambda: extend.replay(two_shape, two, None)),
    }


for bs in (1, 4):
    ms = extend_costs(bs)
    print(f"batch {bs}: " + ", ".join(f"{k} {v:.4f} ms" for k, v in ms.items()))
