"""The one-row GEMV over 2 to 4 rows with a program a (row, output block): the grid's fastest
axis is the row, so the programs of one weight block's rows run side by side and read the same
weight lines at once (the L2 serves the second row's reads, or merges them with the first's);
each program is the one-row kernel as it is: its registers, its FMAs, its loads (stop 73; run
on the device from the repo root: ``python3 docs/wip/gemv_grid_rows_probe.py [models]``).

Why: issue 16's 2-token draft-extend takes its products through the few-row MMA kernel, +7.3
us a layer over one row on qwen3-0.6b (H100, stop 72); stop 60's two-row GEMV (both rows in
one program, ``gemv_two_rows_proto.py``) lost because the second row's FMAs are not free in a
program. Here they run in other programs: what a second row costs is more programs (twice
the grid) and L2 -> SM traffic, not HBM bytes, if the L2 merges the reads.

Times as ``bench gemv`` does (graph replays over weight copies that flush the L2), through
``gemv_two_rows_proto.compare``: qwen3-0.6b's and qwen3-8b's products at 2 and 4 rows: the
few-row kernel, this kernel over a few tiles, and the one-row GEMV on one row (the floor).
``--check`` runs the interpreter check (TRITON_INTERPRET=1): each row equals the one-row GEMV
of that row exactly.
PREDICTED (H100, before any run): qwen3-0.6b's products a step at 2 rows 0.50-0.55 ms (one row
0.479, the few-row kernel 0.626, stop 60); at 4 rows 0.55-0.65; qwen3-8b at 2 rows 4.9-5.2
(one row 4.84, few-row 5.05).
MEASURED (stop 73, H100, ``h100/stop73_297b5ac/g/``), products a step at the best tile per
product: qwen3-0.6b at 2 rows **0.655 ms** against the few-row kernel's 0.626 (one row 0.480);
at 4 rows 0.892 against 0.627; qwen3-8b at 2 rows 5.854 against 5.065 (one row 4.862). Wrong:
ahead of the few-row kernel on 0.6b's o (4.2 against 4.5 us), level on down and q/k/v, behind
on gate/up (8.5 against 7.2); on qwen3-8b a second row costs ~20% of one row's time, so the
L2 does not serve the second row's weight reads for free. Kept for its numbers; not wired in.
"""

import importlib.util
import itertools
import pathlib
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def _grid_rows_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    SILU_OUT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    x_ptr += row * stride_xm
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    up_rows = w_ptr + (offs_n + N).to(tl.int64)[:, None] * stride_wn
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc_up = acc
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        mask = n_mask[:, None] & (k < K)[None, :]
        x = tl.load(x_ptr + k, mask=k < K, other=0.0).to(tl.float32)
        w = tl.load(w_rows + k[None, :], mask=mask, other=0.0, eviction_policy="evict_first")
        acc += w.to(tl.float32) * x[None, :]
        if SILU_OUT:
            u = tl.load(up_rows + k[None, :], mask=mask, other=0.0, eviction_policy="evict_first")
            acc_up += u.to(tl.float32) * x[None, :]
    y = tl.sum(acc, 1)
    if SILU_OUT:
        gate = y.to(out_ptr.dtype.element_ty).to(tl.float32)
        up = tl.sum(acc_up, 1).to(out_ptr.dtype.element_ty).to(tl.float32)
        y = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * stride_om + offs_n, y.to(out_ptr.dtype.element_ty), mask=n_mask)


def grid_rows_gemv(x, w, silu_out=False, tiles=(16, 512, 8, 4)):
    block_n, block_k, warps, stages = tiles
    m, k = x.shape
    n = w.shape[0] // 2 if silu_out else w.shape[0]
    if silu_out:
        block_n = max(block_n // 2, 1)
    out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    _grid_rows_kernel[(m, triton.cdiv(n, block_n))](
        x, w, out, n, k, x.stride(0), w.stride(0), out.stride(0), SILU_OUT=silu_out,
        BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out


def check() -> None:
    from nanograph.kernels.gemv import GemvTiles, gemv

    torch.manual_seed(0)
    for m, (n, k), silu in itertools.product((1, 2, 3), ((10, 37), (24, 70)), (False, True)):
        x = torch.randn(m, k, dtype=torch.bfloat16)
        w = torch.randn(n, k, dtype=torch.bfloat16)
        got = grid_rows_gemv(x, w, silu, (4, 16, 1, 1))
        want = torch.cat([gemv(x[i : i + 1], w, silu_out=silu, tiles=GemvTiles(4, 16, 1, 1))
                          for i in range(m)])  # fmt: skip
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)
    print("check: ok")


TILES = list(itertools.product((4, 8, 16), (256, 512, 1024), (4, 8), (3, 4)))


if __name__ == "__main__":
    if "--check" in sys.argv:
        check()
    else:
        path = pathlib.Path(__file__).with_name("gemv_two_rows_proto.py")
        spec = importlib.util.spec_from_file_location("gemv_two_rows_proto", path)
        proto = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(proto)
        models = sys.argv[1].split(",") if len(sys.argv) > 1 else ["qwen3-0.6b", "qwen3-8b"]
        proto.compare(grid_rows_gemv, TILES, models)
