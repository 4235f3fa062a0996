"""A GEMV of 2 to 4 rows with per-row elementwise accumulators, against the few-row kernel
(stop 59; run on the device from the repo root: ``python3 docs/wip/gemv_rows_proto.py``).

Why: speculative decoding's 2-token draft-extend (issue 16) costs ~1.1 ms against a 0.83 ms
one-row step on qwen3-0.6b. Its eager kernels on an H100 (``decode_breakdown.py`` with
NEW_TOKENS=2, ``h100/stop59_bd9bd52/breakdown/two``) take 38 us a layer against the one-row
graph's 24: the few-row kernel's products ~6.4 us a layer more than the GEMV's (o 5.1 against
3.4, gate/up 7.2 against 5.7, down 6.1 against 4.2, q/k/v 5.4 against 4.2), the two norms
3.4, rope + KV store 3.1, attention +1.4. Stop 5's multi-row GEMV (06016ef) lost 3-20x to
cuBLAS, but it reduced across threads every K block for every row; this one keeps, like the
one-row GEMV, a [rows, BLOCK_N, BLOCK_K] fp32 product array reduced once at the end, so two
rows should stream the weight about as fast as one (the FMAs double, the bytes do not).

Times, as ``bench gemv`` does (graph replays over weight copies that flush the L2), each of
qwen3-0.6b's and qwen3-8b's products at 2 and 4 rows: the few-row kernel (``gemm_rows``,
default tiles), this kernel over a few tiles, and the one-row GEMV on one row (the floor).
Checks each result against a float64 product. Not wired into the engine. Since stop 60 it runs
through ``gemv_two_rows_proto.compare`` (which adds a column at the GEMV's tiles).
MEASURED (stop 59, H100, ``h100/stop59_bd9bd52/rows_proto/``): slower than the few-row kernel on
every product, at 2 rows qwen3-0.6b's products 0.808 against 0.629 ms a step (one row 0.483),
qwen3-8b's 5.971 against 5.210 (4.969); kept for its numbers.
PREDICTED (H100, before any run): 2 rows within 10% of the one-row GEMV and 15-30% under the
few-row kernel on qwen3-0.6b's products; on qwen3-8b's within 5% of the GEMV and level to 10%
under the few-row kernel; at 4 rows the register-heavy accumulators may lose that edge.
"""

import itertools
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def _rows_gemv_kernel(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                      SILU_OUT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr):  # fmt: skip
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask, m_mask = offs_n < N, offs_m < M
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    up_rows = w_ptr + (offs_n + N).to(tl.int64)[:, None] * stride_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        wm = n_mask[:, None] & (k < K)[None, :]
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + k[None, :],
                    mask=m_mask[:, None] & (k < K)[None, :], other=0.0).to(tl.float32)  # fmt: skip
        w = tl.load(w_rows + k[None, :], mask=wm, other=0.0, eviction_policy="evict_first")
        acc += w.to(tl.float32)[None, :, :] * x[:, None, :]
        if SILU_OUT:
            u = tl.load(up_rows + k[None, :], mask=wm, other=0.0, eviction_policy="evict_first")
            acc_up += u.to(tl.float32)[None, :, :] * x[:, None, :]
    y = tl.sum(acc, 2)
    if SILU_OUT:
        gate = y.to(out_ptr.dtype.element_ty).to(tl.float32)
        up = tl.sum(acc_up, 2).to(out_ptr.dtype.element_ty).to(tl.float32)
        y = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :],
             y.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])  # fmt: skip


def rows_gemv(x, w, silu_out=False, tiles=(8, 512, 8, 3)):
    block_n, block_k, warps, stages = tiles
    m, k = x.shape
    n = w.shape[0] // 2 if silu_out else w.shape[0]
    if silu_out:
        block_n = max(block_n // 2, 1)
    out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    _rows_gemv_kernel[(triton.cdiv(n, block_n),)](
        x, w, out, m, n, k, x.stride(0), w.stride(0), out.stride(0), SILU_OUT=silu_out,
        BLOCK_M=triton.next_power_of_2(m), BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
        num_stages=stages,
    )  # fmt: skip
    return out


TILES = list(itertools.product((4, 8, 16), (512,), (4, 8), (3,)))


if __name__ == "__main__":
    from gemv_two_rows_proto import compare  # docs/wip is first on sys.path when run

    compare(rows_gemv, TILES, sys.argv[1].split(",") if len(sys.argv) > 1 else
            ["qwen3-0.6b", "qwen3-8b"], rep_ms=25)  # fmt: skip
