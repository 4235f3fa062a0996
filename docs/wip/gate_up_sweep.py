"""The fused layer's gate/up GEMV (RMSNorm prologue + SiLU-and-mul epilogue) at qwen3-8b's shape
over tiles, isolated (do_bench), beside the plain gate/up the unfused layer runs (and its norm
kernel). Stop 43's call 5 had the fused gate/up at 55.3 against 48.8 us a layer in the graph;
``choose_tiles`` gives it 8 rows a stream (16 halved for the two streams). Run on a GPU from the
repo root: ``PYTHONPATH=$PWD python3 docs/wip/gate_up_sweep.py``."""

import itertools

import torch
import triton

from nanograph.kernels import fused
from nanograph.kernels.gemv import GemvTiles, choose_tiles, gemv

N, K = 24576, 4096  # qwen3-8b's packed gate/up


def us(fn) -> float:
    return triton.testing.do_bench(fn, rep=200) * 1e3


def main() -> None:
    torch.manual_seed(0)
    bf = torch.bfloat16
    x = torch.randn(1, K, device="cuda", dtype=bf)
    w = torch.randn(N, K, device="cuda", dtype=bf) / K**0.5
    nw = torch.ones(K, device="cuda", dtype=bf)
    xn = fused.rmsnorm(x, nw, 1e-6)
    base = choose_tiles(N, K, 0)
    print(f"default tiles {base}", flush=True)
    print(f"plain gate/up (unfused): {us(lambda: gemv(xn, w)):.1f} us; rmsnorm "
          f"{us(lambda: fused.rmsnorm(x, nw, 1e-6)):.1f} us", flush=True)  # fmt: skip
    rows = []
    for block_n, block_k, warps, stages in itertools.product(
        (8, 16, 32), (256, 512, 1024), (4, 8), (2, 3, 4)
    ):
        tiles = GemvTiles(block_n, block_k, warps, stages)  # block_n: rows a stream

        def fused_gate_up(t=tiles):
            return gemv(x, w, norm_weight=nw, silu_out=True, tiles=t)

        def plain_silu_out(t=tiles):
            return gemv(xn, w, silu_out=True, tiles=t)

        try:
            rows.append((us(fused_gate_up), us(plain_silu_out), tiles))
        except Exception as e:  # noqa: BLE001 - a tile that does not compile or fit
            print(f"{tiles}: {type(e).__name__}", flush=True)
    for fused_us, plain_us, tiles in sorted(rows, key=lambda r: r[0])[:12]:
        print(f"{tiles}: norm + silu_out {fused_us:.1f} us, silu_out alone {plain_us:.1f} us")


if __name__ == "__main__":
    main()
