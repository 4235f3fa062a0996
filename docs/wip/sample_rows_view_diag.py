# Stop 36's open question, in one process (~30 s on the H200): does qwen3-30b-a3b's decode graph
# replay slower (2.55 against 2.42 ms) after forwards that hand the graph's own output buffer to
# the eager lm_head GEMV (1ab02c9's `hidden[:n]`), and does it recover after forwards that hand
# it a gathered copy (the landed `hidden[index]`)? Each phase runs 20 forwards one way, then
# times the graph replayed alone; the phases alternate, so a state that flips with the last
# forwards shows as alternating times, and a sticky one as a step that stays. Run from the repo
# root (copy it to /tmp first, see docs/wip/README.md):
# PYTHONPATH=$PWD python3 /tmp/sample_rows_view_diag.py [MODEL]
import sys

import torch

from nanograph import LLM
from nanograph.bench.common import STARTUP_CAPTURE
from nanograph.bench.floor import graph_replay_ms, step_batch

model_name = sys.argv[1] if len(sys.argv) > 1 else "qwen3-30b-a3b"
llm = LLM(
    model_name, load_format="dummy", decode_cuda_graph="full", prefill_cuda_graph="none",
    cuda_graph_bs=(1,), chunked_prefill_size=512, max_num_seqs=2, max_model_len=528,
    progress=False, **STARTUP_CAPTURE,
)  # fmt: skip
runner = llm.engine.runner
model = runner.model
graphs = runner.graph_runners["decode"]
torch.manual_seed(0)
batch, _ = step_batch(llm, 512, 1)


def hidden() -> torch.Tensor:
    out = graphs.forward(batch, None)
    assert out is not None, "the decode graph did not take the batch"
    return out


def view() -> torch.Tensor:  # 1ab02c9: the graph's output buffer itself
    return model.compute_logits(hidden()[:1])


def gather() -> torch.Tensor:  # the landed path: a gathered copy, its index copied first
    rows = torch.tensor([0], dtype=torch.long).to(runner.device, non_blocking=True)
    return model.compute_logits(hidden()[rows])


def clone() -> torch.Tensor:  # the same launches as a gather, no index copy
    return model.compute_logits(hidden()[:1].clone())


def view_cublas() -> torch.Tensor:  # the view, its product through cuBLAS: no PDL launch
    weight = model.lm_head.weight if model.lm_head is not None else model.model.embed_tokens.weight
    return torch.nn.functional.linear(hidden()[:1], weight).float()


def replay_only() -> torch.Tensor:  # no lm_head at all
    return hidden()


print(f"after start-up: replay {graph_replay_ms(runner, batch, 1, 50):.3f} ms", flush=True)
with torch.inference_mode():
    # the view through cuBLAS first: if the slow state is sticky, only the first view shows it.
    # Hypothesis to test: the Triton lm_head GEMV is a programmatic dependent launch (PDL);
    # right after a graph launch (no gather kernel between them) it may change how the driver
    # launches that graph from then on
    phases = ["gather", "view_cublas", "replay_only", "view", "gather", "clone", "replay_only"]
    for phase in phases:
        for _ in range(20):
            globals()[phase]()
        torch.cuda.synchronize()
        print(f"after 20 {phase:11s}: replay {graph_replay_ms(runner, batch, 1, 50):.3f} ms",
              flush=True)  # fmt: skip
