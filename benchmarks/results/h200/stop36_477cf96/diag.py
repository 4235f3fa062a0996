# Does qwen3-30b-a3b's decode replay time depend on the data (routing), and what differs
# between trees? Run from inside a tree with PYTHONPATH set to it.
import sys

import torch

import nanograph.kernels.moe as km
from nanograph import LLM
from nanograph.bench.common import STARTUP_CAPTURE
from nanograph.bench.floor import graph_replay_ms, step_batch

tag = sys.argv[1]
llm = LLM(
    "qwen3-30b-a3b",
    load_format="dummy",
    decode_cuda_graph="full",
    prefill_cuda_graph="none",
    cuda_graph_bs=(1,),
    chunked_prefill_size=512,
    max_num_seqs=2,
    max_model_len=528,
    progress=False,
    **STARTUP_CAPTURE,
)
runner = llm.engine.runner
torch.manual_seed(0)
batch, pages = step_batch(llm, 512, 1)
seen = []
orig = km.route


def rec(*a, **k):
    w, ids = orig(*a, **k)
    seen.append((w, ids))
    return w, ids


def report(what):
    for _ in range(3):
        logits = runner.forward(batch)
    torch.cuda.synchronize()
    ms = graph_replay_ms(runner, batch, 1, 50)
    seen.clear()
    km.route = rec
    with torch.inference_mode():
        runner.eager_forward(batch, None)
    km.route = orig
    torch.cuda.synchronize()
    distinct = [len(set(ids[0].tolist())) for _, ids in seen]
    nan_w = sum(bool(torch.isnan(w).any()) for w, _ in seen)
    firsts = [ids[0].tolist()[:3] for _, ids in seen[:3]]
    print(
        f"{tag} {what}: replay {ms:.3f} ms; logits nan {bool(torch.isnan(logits).any())} "
        f"max {logits.abs().max().item():.3g}; layers {len(seen)}, distinct experts/layer "
        f"min {min(distinct)} mean {sum(distinct) / len(distinct):.2f}; nan-weight layers {nan_w}; "
        f"first ids {firsts}",
        flush=True,
    )


report("as is")
kc = runner.k_caches
page = pages[0]
for what, fill in (("kv zero", lambda t: t.zero_()), ("kv randn", lambda t: t.normal_(0, 1))):
    with torch.inference_mode():
        for t in list(runner.k_caches) + list(runner.v_caches):
            fill(t)
    report(what)
