"""The engine's host time a batch-1 decode step, against the GPU's (stop 59; run on the device
from the repo root: ``python3 docs/wip/step_host_time.py [model] [new_tokens]``).

Stop 59's ``bench floor --engine-steps`` on an H100: qwen3-0.6b's decode graph replays alone
in 0.683 ms, but ``bench decode`` steps at 0.827 ms (1,209 tok/s). Idle GPU or work past the
graph? The overlap schedule launches step t+1 and then reads step t's tokens, so the host has
one step's GPU time for reading t, scheduling and launching t+2: if its work takes longer the
engine is host-bound. This times every part of ``Engine.step`` without the profiler, per step
of ``LLM.generate`` (one greedy request, a 512-token prompt), the time spent in
``Event.synchronize`` (the read waiting for its copy: the host idle, ahead of the GPU; the
label counts the input mirror's waits too, timed apart), and ``runner.forward`` + argmax back
to back against the graph alone. Host work a step = step time - the waits. Stop 59 (H100):
host work ~410 of the 818 us step, forward + argmax 0.827 ms back to back: GPU-bound, the
0.147 ms past the graph is the eager tail (LM head, argmax, the rows' index)."""

import statistics
import sys
import time

import torch

from nanograph import LLM, SamplingParams
from nanograph.bench.common import STARTUP_CAPTURE
from nanograph.bench.floor import graph_replay_ms, step_batch
from nanograph.engine import engine as engine_module
from nanograph.runners import static_inputs

MODEL = sys.argv[1] if len(sys.argv) > 1 else "qwen3-0.6b"
NEW = int(sys.argv[2]) if len(sys.argv) > 2 else 256
llm = LLM(
    MODEL, load_format="dummy", prefill_cuda_graph="none", cuda_graph_bs=(1,), max_num_seqs=1,
    max_model_len=512 + NEW + 64, disable_prefix_caching=True, progress=False,
    **STARTUP_CAPTURE,
)  # fmt: skip
engine = llm.engine
spent: dict[str, list[float]] = {}


def timed(owner, name: str, label: str) -> None:
    real = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            spent.setdefault(label, []).append(time.perf_counter() - start)

    setattr(owner, name, wrapper)


timed(engine, "step", "Engine.step (all)")
timed(engine.scheduler, "schedule", "scheduler.schedule")
timed(engine, "_forward_and_sample", "_forward_and_sample")
timed(engine_module.ForwardBatch, "build", "ForwardBatch.build")
timed(engine.runner, "forward", "runner.forward")
timed(static_inputs.StaticInputs, "copy_from", "StaticInputs.copy_from")
timed(static_inputs._HostMirror, "wait", "mirror wait")
timed(torch.cuda.CUDAGraph, "replay", "CUDAGraph.replay")
timed(type(engine.sampler), "__call__", "sampler")
timed(engine.penalties, "apply", "penalties.apply")
timed(engine_module._InFlight, "__init__", "_InFlight (token copy out)")
timed(engine, "_resolve", "_resolve")
timed(torch.cuda.Event, "synchronize", "Event.synchronize (read + mirror)")
timed(engine.stops, "accept", "stops.accept")

vocab = engine.model_config.vocab_size
params = SamplingParams(max_tokens=NEW, temperature=0, ignore_eos=True)
for attempt in range(3):  # the first is the warm-up
    spent.clear()
    prompt = torch.randint(0, vocab, (512,)).tolist()
    start = time.perf_counter()
    llm.generate([prompt], params)
    wall = time.perf_counter() - start
    steps = len(spent["Engine.step (all)"])
    print(f"\nrun {attempt}: {steps} steps, {wall / steps * 1e3:.3f} ms a step "
          f"({NEW / wall:.0f} tok/s with the prefill)")  # fmt: skip
    for label, seconds in spent.items():
        body = seconds[8:-8] if len(seconds) > 32 else seconds  # the steady decode steps
        print(
            f"  {label:32s} {statistics.median(body) * 1e6:8.1f} us median, "
            f"{statistics.mean(body) * 1e6:8.1f} mean, x{len(seconds) / steps:.2f} a step"
        )
batch, pages = step_batch(llm, 512, 1)
replay = graph_replay_ms(engine.runner, batch, 1, 200)  # None without a graph (CPU)
print(f"\ngraph replayed back to back: {replay} ms")
if torch.cuda.is_available():  # the graph and the eager LM head after it, back to back
    for _ in range(5):
        engine.runner.forward(batch)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(200):
        engine.runner.forward(batch).argmax(-1)
    torch.cuda.synchronize()
    print(f"runner.forward + argmax back to back: {(time.perf_counter() - start) / 200e-3:.3f} ms")
