"""One normalising GEMV against the plain GEMV (+ the rmsnorm kernel) at qwen3-8b's q/k/v and
gate/up shapes: isolated durations (do_bench). ``once``: two launches of each, for ncu.
(Call 7 ran this with the loop body inline; moved into a function for ruff's B023 since.)"""

import sys

import torch
import triton

from nanograph.kernels import fused
from nanograph.kernels.gemv import gemv


def measure(n: int, k: int, silu: bool) -> None:
    bf = torch.bfloat16
    x = torch.randn(1, k, device="cuda", dtype=bf)
    w = torch.randn(n, k, device="cuda", dtype=bf) / k**0.5
    nw = torch.ones(k, device="cuda", dtype=bf)
    xn = fused.rmsnorm(x, nw, 1e-6)
    if sys.argv[1:] == ["once"]:  # for ncu: two launches of each
        for _ in range(2):
            gemv(x, w, norm_weight=nw, silu_out=silu)
            gemv(xn, w, silu_out=silu)
        return
    t_norm = triton.testing.do_bench(lambda: gemv(x, w, norm_weight=nw, silu_out=silu), rep=200)
    t_plain = triton.testing.do_bench(lambda: gemv(xn, w, silu_out=silu), rep=200)
    t_rms = triton.testing.do_bench(lambda: fused.rmsnorm(x, nw, 1e-6), rep=200)
    print(f"{n}x{k} silu_out={silu}: normalising {t_norm * 1e3:.1f} us, plain {t_plain * 1e3:.1f}"
          f" us, rmsnorm {t_rms * 1e3:.1f} us", flush=True)  # fmt: skip


torch.manual_seed(0)
for n, k, silu in ((6144, 4096, False), (24576, 4096, True)):
    measure(n, k, silu)
