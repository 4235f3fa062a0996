"""2-row GEMV tiles against the few-row kernel at qwen3-8b's and qwen3-0.6b's products (stop 41,
call 2). Needs docs/wip/gemv_few_rows_fused.patch applied (the GEMV of 1 to 4 rows)."""

import itertools
import json
import sys

import torch

from nanograph.bench.gemv import _timed_us, _weight_copies
from nanograph.kernels.gemv import GemvTiles, gemv
from nanograph.kernels.rows import gemm_rows

rows = int(sys.argv[1])
shapes = {
    "8b_qkv": (6144, 4096, False),
    "8b_gate_up": (24576, 4096, True),
    "8b_o": (4096, 4096, False),
    "8b_down": (4096, 12288, False),
    "06_gate_up": (6144, 1024, True),
    "06_qkv": (4096, 1024, False),
}
out = {}
for name, (n, k, silu) in shapes.items():
    w = _weight_copies(n, k)
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    r = {"rows_us": _timed_us(lambda a, b, s=silu: gemm_rows(a, b, silu_out=s), w, x, 60)}
    trials = []
    for bn, bk, warps, st in itertools.product((2, 4, 8, 16), (128, 256, 512), (4, 8), (2, 3, 4)):
        t = GemvTiles(bn, bk, warps, st)
        try:
            us = _timed_us(lambda a, b, t=t, s=silu: gemv(a, b, silu_out=s, tiles=t), w, x, 15)
        except Exception:  # noqa: BLE001 - out of resources
            continue
        trials.append((us, bn, bk, warps, st))
    trials.sort()
    r["gemv_best"] = trials[:5]
    out[name] = r
    print(name, n, k, f"rows kernel {r['rows_us']:.1f} us; gemv best", trials[:3], flush=True)
    del w
    torch.cuda.empty_cache()
json.dump(out, open(sys.argv[2], "w"), indent=1)
