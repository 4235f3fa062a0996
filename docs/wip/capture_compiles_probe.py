"""Which Triton kernel variants does a graph capture compile? (stop 60; not run yet; on the device
from the repo root: ``python3 docs/wip/capture_compiles_probe.py``).

Why: stop 60 found the draft loop's input advance compiling a variant per batch size inside the
draft runner's captures (2.2x the target's capture time at start-up, 286953c fixed it). Start-up
compiles ahead what one- and two-token forwards and the attention backend's variants reach, and
the memory plan's probe captures each path's largest shape; a kernel whose constexprs or
specialisations (an int argument of 1, a multiple of 16, a pointer's 16-byte alignment) follow
the batch size would still compile, or load from Triton's disk cache, inside the first capture
of each shape. Triton calls ``knobs.runtime.jit_post_compile_hook`` each time it puts a variant
in its in-process cache (a compile or a disk-cache load); this counts those calls inside every
``GraphRunner.capture`` of a few engines: qwen3-0.6b on its default ladders (decode and prefill
under full), qwen3-30b-a3b the same (the fused MoE's sorted path), qwen3-0.6b under breakable,
and qwen3-0.6b drafting for itself (decode, verify, draft, draft_extend). Prints each
capture's variants by kernel name and the shapes that had any. The memory plan's probe
captures come first (each path's largest shape, listed again when the real capture takes it):
compiles there are expected; the question is the captures after.
PREDICTED (before any run): none on the dense and speculative engines since 286953c; on
qwen3-30b-a3b's prefill captures, the sorted MoE kernels' variants of the row-block sizes the
one- and two-token forwards did not reach (16 / 32 / 64 / 128-row blocks). Each found names a
kernel to unspecialise (as ``kernels/draft_inputs.py``) or to compile ahead. If none, this
becomes a tests/gpu test asserting none.
"""

import collections

import torch
from triton import knobs

from nanograph import LLM
from nanograph.bench.common import STARTUP_CAPTURE
from nanograph.runners import graph_runner

capturing: list[str] = []  # the runner path whose capture is running
compiled: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


def on_compile(*, fn, compile, **_):
    if capturing:
        compiled[capturing[-1]][f"{fn.name} {compile['constants']}"[:160]] += 1


real_capture_one = graph_runner.GraphRunner._capture_one


def capture_one(self, shape):
    capturing.append(f"{self.path} {self.backend.name} {shape}")
    try:
        return real_capture_one(self, shape)
    finally:
        capturing.pop()


knobs.runtime.jit_post_compile_hook = on_compile
graph_runner.GraphRunner._capture_one = capture_one

ENGINES = {
    "qwen3-0.6b full": dict(decode_cuda_graph="full", prefill_cuda_graph="full"),
    # the sorted MoE path picks its row blocks from the mean rows an expert (kernels/moe.py's
    # choose_tiles), so prefill shapes of different token counts reach different variants,
    # and start-up compiles ahead only one- and two-token forwards
    "qwen3-30b-a3b full": dict(decode_cuda_graph="full", prefill_cuda_graph="full"),
    "qwen3-0.6b breakable": dict(decode_cuda_graph="breakable", prefill_cuda_graph="breakable"),
    "qwen3-0.6b self-draft": dict(
        speculative_algorithm="draft_model",
        speculative_num_draft_tokens=4,
        speculative_draft_model_path="qwen3-0.6b",
        prefill_cuda_graph="none",
    ),  # fmt: skip
}
for name, flags in ENGINES.items():
    compiled.clear()
    llm = LLM(name.split()[0], load_format="dummy", progress=False, **STARTUP_CAPTURE, **flags)
    shapes = sum(len(r.records) for r in llm.engine.runner.graph_runners.values())
    if llm.engine.draft_runner is not None:
        shapes += sum(len(r.records) for r in llm.engine.draft_runner.graph_runners.values())
    total = sum(sum(c.values()) for c in compiled.values())
    print(f"{name}: {shapes} shapes captured, {total} variants compiled or loaded inside "
          f"captures, in {len(compiled)} of them", flush=True)  # fmt: skip
    for capture, counts in compiled.items():
        print(f"  {capture}: " + "; ".join(f"{k} x{v}" for k, v in counts.items()))
    del llm
    torch.cuda.empty_cache()
