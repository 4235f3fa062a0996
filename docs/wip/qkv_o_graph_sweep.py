"""Written in stop 45, run in stops 52 and 57: qwen3-8b's batch-1 q/k/v and o GEMV
tiles swept inside a CUDA graph of 36 unfused decode layers, the engine's own kernels in the
engine's order: add_rmsnorm, q/k/v GEMV, the one-row attention rotating and storing its key
(``RopeStore``, 511 tokens of context, a KV cache per layer), o GEMV, add_rmsnorm, gate/up GEMV,
down GEMV with SiLU-and-mul on load. One product's tiles change at a time (the q/k/v and o
GEMVs, then the one-row attention's); medians of graph replays, in us a layer. Why: the small
products stream at ~3.0-3.3 TB/s where the LM head reaches 4.4 (qwen3-8b q/k/v 15 us, o 11 us
a layer); stop 44's in-graph sweeps found tiles isolated sweeps missed (the MoE gate/up and
router), but never swept these two. At 4.4 TB/s they would take ~7 us a layer less, 0.25 ms a
step: issue 18's 240 tok/s needs 0.14.

Run from the repo root on the device: ``PYTHONPATH=$PWD python3 docs/wip/qkv_o_graph_sweep.py``
(``--att``: the one-row attention's slices, stop 57, ``--att-long`` their length at long
contexts, ``--att-stages`` its stages left out one at a time with ``onerow_stages.patch``
applied, stop 58; ``--06b`` with qwen3-0.6b's shapes, ``--context N`` tokens; ``--mlp``: the
gate/up and down products instead, stop 57; ``--30b``: qwen3-30b-a3b's attention half, whose
q/k/v and o at 4.4 TB/s would take ~4 us a layer less, 0.2 ms a step: issue 15's 60% needs
0.15; ``--ncu``: the default graph replayed three times, nothing timed, for Nsight Compute;
``--smoke``: a few tiny layers once, eagerly, under TRITON_INTERPRET=1 on CPU).
"""

import dataclasses
import statistics
import sys

import torch

from nanograph.bench.common import graphed_samples
from nanograph.kernels import attention, attention_tiles, fused, gemv
from nanograph.kernels.testing import make_paged_batch

SMOKE = "--smoke" in sys.argv
if SMOKE:  # the interpreter: tiny shapes, explicit tiles (choose_tiles needs CUDA)
    L, H, HQ, HKV, D, INTER, CONTEXT, DEV = 2, 64, 4, 2, 16, 128, 20, "cpu"
elif "--30b" in sys.argv:
    # qwen3-30b-a3b's attention half (q/k/v 21 MB, o 16.8 MB: 7.6 and 5.4 us a layer in its
    # trace); a dense MLP of the bytes its 8 experts stream (50 MB gate/up, 25 MB down) stands
    # in for the MoE half between layers
    L, H, HQ, HKV, D, INTER, CONTEXT, DEV = 48, 2048, 32, 4, 128, 6144, 511, "cuda"
elif "--06b" in sys.argv:  # qwen3-0.6b's shapes (the engine fuses its layer; this does not)
    L, H, HQ, HKV, D, INTER, CONTEXT, DEV = 28, 1024, 16, 8, 128, 3072, 511, "cuda"
else:
    L, H, HQ, HKV, D, INTER, CONTEXT, DEV = 36, 4096, 32, 8, 128, 12288, 511, "cuda"
if "--context" in sys.argv:
    CONTEXT = int(sys.argv[sys.argv.index("--context") + 1])
torch.manual_seed(0)
bf = dict(dtype=torch.float32 if SMOKE else torch.bfloat16, device=DEV)
QKV = (HQ + 2 * HKV) * D


def layer_weights() -> dict:
    return dict(
        n1=1 + 0.1 * torch.randn(H, **bf), n2=1 + 0.1 * torch.randn(H, **bf),
        qkv=torch.randn(QKV, H, **bf) * H**-0.5, o=torch.randn(H, HQ * D, **bf) * (HQ * D) ** -0.5,
        gu=torch.randn(2 * INTER, H, **bf) * H**-0.5,
        down=torch.randn(H, INTER, **bf) * INTER**-0.5,
        qn=1 + 0.1 * torch.randn(D, **bf), kn=1 + 0.1 * torch.randn(D, **bf),
        kv=make_paged_batch([CONTEXT], [1], num_q_heads=HQ, num_kv_heads=HKV, head_dim=D,
                            page_size=16, dtype=bf["dtype"], device=DEV),
    )  # fmt: skip


layers = [layer_weights() for _ in range(L)]
freqs = torch.outer(torch.arange(CONTEXT + 1.0), 1e6 ** -(torch.arange(0, D, 2.0) / D))
cos_sin = torch.cat([freqs.cos(), freqs.sin()], -1).float().to(DEV)
stream0 = torch.randn(1, H, **bf)
T = gemv.GemvTiles
SMALL = T(4, 32, 4, 2)  # smoke only
tiles = {
    "att": None,  # the one-row decode's own choice (attention_tiles.choose_tiles)
    "qkv": SMALL if SMOKE else gemv.choose_tiles(QKV, H, 0),
    "o": SMALL if SMOKE else gemv.choose_tiles(H, HQ * D, 0),
    "gu": SMALL if SMOKE else gemv.choose_tiles(2 * INTER, H, 0),
    "down": SMALL if SMOKE else gemv.choose_tiles(H, INTER, 0),
}


def forward(stream: torch.Tensor, t: dict) -> None:
    x = stream
    for w in layers:
        b = w["kv"]
        xn, _ = fused.add_rmsnorm(x, stream, w["n1"], 1e-6)
        qkv = gemv.gemv(xn, w["qkv"], tiles=t["qkv"])
        q = qkv[:, : HQ * D].view(1, HQ, D)
        k = qkv[:, HQ * D : (HQ + HKV) * D].view(1, HKV, D)
        v = qkv[:, (HQ + HKV) * D :].view(1, HKV, D)
        rope = attention.RopeStore(k, v, b.positions, cos_sin, b.slot_mapping, w["qn"], w["kn"])
        out = attention.paged_attention(q, b.k_cache, b.v_cache, *b.metadata(), b.page_size,
                                        D**-0.5, max_query_len=1, rope=rope,
                                        tiles=t["att"])  # fmt: skip
        x = gemv.gemv(out.view(1, HQ * D), w["o"], tiles=t["o"])
        xn, _ = fused.add_rmsnorm(x, stream, w["n2"], 1e-6)
        act = gemv.gemv(xn, w["gu"], tiles=t["gu"])
        x = gemv.gemv(act, w["down"], silu_mul=True, tiles=t["down"])


def timed(t: dict, label: str, rep_ms: int = 300) -> None:
    """The graph of L layers replayed (``graphed_samples``: each replay after an L2 flush)."""
    stream = stream0.clone()
    samples = graphed_samples(lambda: forward(stream, t), rep_ms)
    print(f"{label}: {1000 * statistics.median(samples) / L:.2f} us a layer", flush=True)


def sweep(product: str, candidates: list) -> None:
    for c in candidates:
        try:
            timed({**tiles, product: c}, f"{product} {c}")
        except Exception as e:  # noqa: BLE001 - a tile that does not compile or launch
            print(f"{product} {c}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)


if SMOKE:
    forward(stream0.clone(), tiles)
    print("smoke: one eager pass of", L, "layers")
    sys.exit(0)
if "--ncu" in sys.argv:
    # the default graph replayed a few times, for a profiler's view of its kernels (Nsight
    # Compute, ``--graph-profiling node``: each node alone, so no PDL overlap, but each kernel's
    # own duration, stalls and SASS hot spots; docs/wip/HISTORY.md, stop 45, has the command)
    timed(tiles, "default (under a profiler: not a timing)", rep_ms=1)
    sys.exit(0)
print(f"defaults: {tiles}", flush=True)
timed(tiles, "default")
if "--att-long" in sys.argv:
    # stop 57: at 4095 tokens the 8b graph took 154.0 us a layer with 4 key blocks a slice
    # against 158.3-161.3 for the default 2 (32 slices): how the slice length should grow.
    # (min_split_blocks, min_slices): slices of at least m blocks, but at least s of them
    one_row = attention_tiles.choose_tiles(torch.device(DEV), 1, 1, HQ, HKV, D, 1)
    grow = [(2, 8), (4, 8), (4, 16), (8, 8), (8, 16), (2, 16), (4, 1)]
    replace = dataclasses.replace
    sweep("att", [replace(one_row, min_split_blocks=m, min_slices=s) for m, s in grow])
    timed(tiles, "default again")
    sweep("att", [replace(one_row, min_split_blocks=m, min_slices=s) for m, s in grow[:3]])
    timed(tiles, "default at the end")
    sys.exit(0)
if "--att-stages" in sys.argv:
    # stop 58: Nsight Compute found the one-row decode a chain of dependent round trips (~12
    # us alone at 511 tokens, 5% of DRAM bandwidth); what each stage of it costs inside the
    # graph, with onerow_stages.patch's SKIP bits (outputs wrong: timings only; made on top of
    # onerow_lean.patch, whose single key loop is timed against the three), twice around.
    # 1 skips the wait too, so the o GEMV may overlap q/k/v: a floor, not a stage; 2 is the
    # launch, the wait and the grid's completion with no work after the wait
    one_row = attention_tiles.choose_tiles(torch.device(DEV), 1, 1, HQ, HKV, D, 1)
    if not hasattr(one_row, "skip"):
        sys.exit("--att-stages needs docs/wip/onerow_stages.patch applied")
    stages = {1: "an empty kernel", 2: "return after the wait", 4: "no L2 prefetch",
              8: "no rope + KV store", 16: "no key loop", 32: "return after the key loop",
              64: "partials, no atomic or merge", 8 | 16 | 64: "q and partials only"}  # fmt: skip
    for _ in range(2):
        for bits, name in stages.items():
            timed({**tiles, "att": dataclasses.replace(one_row, skip=bits)}, f"skip {bits}: {name}")
        if one_row.one_range:  # onerow_lean.patch's loop against the three it replaces
            timed({**tiles, "att": dataclasses.replace(one_row, one_range=False)}, "three loops")
        timed(tiles, "default again")
    sys.exit(0)
if "--att" in sys.argv:
    # stop 57: the one-row decode attention is the largest kernel of a layer after the
    # products (H100, decode_breakdown.py: 9.7 us a layer on qwen3-8b, 9.3 on 0.6b at 511
    # tokens, against ~1 MB of KV). Its default slices 511 keys into 8 one-block slices and
    # merges them (partials, an atomic, the last slice reads them back); never swept: fewer
    # slices (min_split_blocks) and no merge at all (num_splits 1).
    one_row = attention_tiles.choose_tiles(torch.device(DEV), 1, 1, HQ, HKV, D, 1)
    print(f"one-row attention default: {one_row}", flush=True)
    variants = [(64, 32, m, 8, 3) for m in (2, 4, 8)]  # (block_n, splits, min blocks, warps, st)
    variants += [(64, 1, 1, 8, 3), (64, 1, 1, 4, 3), (64, 1, 1, 4, 2), (128, 1, 1, 8, 2),
                 (32, 1, 1, 4, 3), (128, 32, 2, 8, 2), (32, 32, 4, 4, 3), (32, 32, 2, 4, 3),
                 (64, 32, 2, 4, 3), (64, 32, 4, 4, 3), (64, 2, 1, 8, 3),
                 (64, 4, 1, 8, 3)]  # fmt: skip
    sweep("att", [dataclasses.replace(one_row, block_n=bn, num_splits=sp, min_split_blocks=mb,
                                      num_warps=w, num_stages=st)
                  for bn, sp, mb, w, st in variants])  # fmt: skip
    timed(tiles, "default at the end")
    sys.exit(0)
if "--mlp" in sys.argv:
    # stop 57: the MLP's two products, never swept in a graph (issue 18's qwen3-8b batch 1
    # needs ~0.14 ms a step; gate/up streams ~3.7 TB/s, down ~3.4 where the LM head reaches
    # 4.4: both at 4.2 would save ~0.3 ms)
    sweep("gu", [T(16, 512, 8, 3), T(16, 512, 8, 5), T(8, 512, 8, 4), T(8, 1024, 8, 3),
                 T(32, 256, 8, 4), T(32, 512, 8, 3), T(16, 1024, 8, 2), T(16, 1024, 8, 3),
                 T(16, 256, 4, 6), T(8, 512, 4, 4), T(4, 1024, 4, 4), T(16, 512, 4, 4),
                 T(32, 512, 16, 3), T(16, 512, 16, 4)])  # fmt: skip
    timed(tiles, "default again")
    sweep("down", [T(4, 1024, 8, 3), T(4, 1024, 8, 4), T(8, 1024, 8, 3), T(8, 512, 8, 3),
                   T(8, 512, 8, 5), T(4, 2048, 8, 2), T(16, 512, 8, 4), T(8, 256, 4, 6),
                   T(4, 512, 4, 4), T(8, 1024, 4, 3), T(16, 256, 8, 4),
                   T(4, 1024, 4, 3)])  # fmt: skip
    timed(tiles, "default at the end")
    sys.exit(0)
sweep("qkv", [T(8, 512, 8, 4), T(4, 1024, 8, 4), T(16, 256, 4, 4), T(8, 1024, 8, 3),
              T(32, 256, 8, 3), T(16, 512, 4, 4), T(16, 1024, 8, 2), T(8, 256, 4, 6)])  # fmt: skip
timed(tiles, "default again")
sweep("o", [T(16, 512, 8, 4), T(4, 1024, 8, 4), T(4, 512, 4, 4), T(8, 1024, 8, 3),
            T(8, 256, 4, 6), T(2, 2048, 4, 2), T(8, 512, 4, 4)])  # fmt: skip
timed(tiles, "default again")
# The one-row decode attention itself (~10-12 us a layer for 1 MB of KV): its 8-warp tile
# reduces each row's max and sum across warps through shared memory, ~8 barriers a key block
# in its sm_90 SASS; fewer warps or wider key blocks change that chain. Swept in isolation
# before (`bench attention --sweep`, 1 x 512: 8 warps, 3 stages won), never in a graph.
one_row = attention_tiles.choose_tiles(torch.device(DEV), 1, 1, HQ, HKV, D, 1)
print(f"one-row attention default: {one_row}", flush=True)
sweep("att", [dataclasses.replace(one_row, num_warps=w, num_stages=st, block_n=bn)
              for w, st, bn in ((4, 3, 64), (2, 2, 64), (4, 2, 128), (8, 2, 128), (4, 3, 32),
                                (8, 2, 64), (1, 2, 64))])  # fmt: skip
timed(tiles, "default at the end")
