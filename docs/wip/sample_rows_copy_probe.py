"""Does the sampled rows' pageable index copy stall the host? (stop 60; run on the device from the
repo root: ``python3 docs/wip/sample_rows_copy_probe.py [model] [batches]``).

Why: issue 16's draft loop (a 2-token draft-extend forward, then one replay of the k-1 step loop
graph) takes 3.619 ms back to back at batch 1 on an H100 (stop 59, qwen3-0.6b drafting for
itself, k = 4) where its graphs and eager tails add up to ~3.45 ms of kernels; the one-token
catch-up's loop 3.255 against ~3.13. ``ModelRunner.forward`` copies ``batch.sample_rows`` to the
device from pageable memory (``torch.tensor(rows).to(device, non_blocking=True)``) after
replaying the graph. If that copy makes the host wait for the stream (the CUDA driver may
synchronise a pageable host-to-device copy), the GPU then idles while the host launches the
gather, the LM head, the argmax and the next graph's inputs (~0.1-0.2 ms of host work on
these machines). Stop 41 found pinned index copies no cure for the verify's idle; this times
the forward paths directly.

Arms, alternating, each as ``bench spec`` times them (``draft_loop_ms``: synchronised and back to
back; ``drafter_decode_ms``; the target's decode step back to back): ``pageable`` (the tree),
``cached`` (the rows' device index made once per distinct ``sample_rows`` and reused: no copy),
``pinned`` (copied from pinned memory). Not wired into the engine.
PREDICTED (H100, before any run): if the copy stalls the host, ``cached`` takes the batch-1 draft
loop from ~3.62 to ~3.45-3.50 ms back to back and the decode step from ~0.80 to ~0.79; if it
does not, every arm within 1%.
MEASURED (stop 60, H100, ``h100/stop60_c25a30c/rows_copy/``, two passes): every arm within
0.3% back to back: batch 1 draft loop 3.512-3.518 ms (1.095-1.103x four drafter steps of
0.797-0.802), one-token loop 3.139-3.157, target decode 0.7986-0.8031; batch 4 4.410-4.416
(1.009-1.012x). The copy does not stall the host. The synchronised figures spread 0.86-1.06x
between passes of the same arm (40 repeats). What the 2-token loop costs over the one-token
loop (0.36-0.37 ms) is the 2-token forward's kernels: 3.15 ms = one catch-up step (~0.80) +
three loop steps (~0.78 each), 3.52 = a 2-token catch-up of ~1.17 + the same three.
"""

import sys

import torch

from nanograph import LLM
from nanograph.bench.common import STARTUP_CAPTURE
from nanograph.bench.spec import (
    back_to_back_ms,
    draft_loop_ms,
    drafter_decode_ms,
    scratch_batch,
)
from nanograph.runners import model_runner

MODEL = sys.argv[1] if len(sys.argv) > 1 else "qwen3-0.6b"
BATCHES = [int(b) for b in sys.argv[2].split(",")] if len(sys.argv) > 2 else [1, 4]
K, PROMPT, REPEATS = 4, 512, 40

original = model_runner.ModelRunner.forward
_cached: dict[tuple[int, ...], torch.Tensor] = {}


def forward(self, batch, in_flight=None, path=None):
    path = path or ("decode" if batch.mode == "decode" else "prefill")
    runner = self.graph_runners.get(path)
    hidden = runner.forward(batch, in_flight) if runner is not None else None
    if hidden is None:
        hidden = self.eager_forward(batch, in_flight)
    if MODE == "cached":
        key = tuple(batch.sample_rows)
        rows = _cached.get(key)
        if rows is None:
            rows = _cached[key] = torch.tensor(key, dtype=torch.long, device=self.device)
    else:  # pinned
        rows = torch.tensor(batch.sample_rows, dtype=torch.long, pin_memory=True)
        rows = rows.to(self.device, non_blocking=True)
    return self.model.compute_logits(hidden[rows])


MODE = "pageable"
llm = LLM(
    MODEL, load_format="dummy", prefill_cuda_graph="none", cuda_graph_bs=tuple(BATCHES),
    max_num_seqs=max(BATCHES), max_model_len=PROMPT + 128, disable_prefix_caching=True,
    speculative_algorithm="draft_model", speculative_num_draft_tokens=K,
    speculative_draft_model_path=MODEL, progress=False, **STARTUP_CAPTURE,
)  # fmt: skip
engine = llm.engine
page = engine.config.page_size
for bs in BATCHES:
    decode = scratch_batch(bs, 1, PROMPT, page, False)
    for attempt in range(2):
        for MODE in ("pageable", "cached", "pinned")[: 3 if torch.cuda.is_available() else 2]:
            model_runner.ModelRunner.forward = original if MODE == "pageable" else forward
            loop_sync, loop_b2b = draft_loop_ms(engine, bs, K, PROMPT, REPEATS)
            one_sync, one_b2b = draft_loop_ms(engine, bs, K, PROMPT, REPEATS, catch_up=1)
            step_sync, step_b2b = drafter_decode_ms(engine, bs, PROMPT, REPEATS)
            target = back_to_back_ms(engine.runner, decode, "decode", REPEATS)
            print(f"batch {bs} pass {attempt} {MODE:8s}: draft loop {loop_sync:.3f} sync / "
                  f"{loop_b2b:.3f} back to back (/ k steps {loop_sync / (K * step_sync):.3f} / "
                  f"{loop_b2b / (K * step_b2b):.3f}), one-token loop {one_sync:.3f} / "
                  f"{one_b2b:.3f}, drafter step {step_sync:.3f} / {step_b2b:.3f}, target "
                  f"decode back to back {target:.4f}", flush=True)  # fmt: skip
model_runner.ModelRunner.forward = original
