"""The one-row GEMV's layout for 2 to 4 rows: one 2D [BLOCK_N, BLOCK_K] fp32 accumulator a row,
each weight block loaded once and multiplied into every row's accumulator (stop 60; run on the
device from the repo root: ``python3 docs/wip/gemv_two_rows_proto.py [models]``).

Why: issue 16's 2-token draft-extend and batch-2 decode take their products through the
few-row MMA kernel, ~30% slower than one row on qwen3-0.6b (0.629 against 0.483 ms a step, H100,
stop 59). Stop 59's ``gemv_rows_proto.py`` kept a 3D [rows, BLOCK_N, BLOCK_K] accumulator and lost
(0.808 ms): a 3D layout spreads the rows over threads, so every weight element is loaded and
converted by each row's threads. Here the weight tile keeps the one-row kernel's 2D layout and
the rows are unrolled at compile time (``ROWS`` constexpr): the FMAs scale with the rows, the
loads and the layout do not.

Times, as ``bench gemv`` does (graph replays over weight copies that flush the L2), each of
qwen3-0.6b's and qwen3-8b's products at 2 and 4 rows: the few-row kernel (``gemm_rows``,
default tiles), this kernel over a few tiles, and the one-row GEMV on one row (the floor).
Checks each result against a float32 product. Not wired into the engine. Runs on CPU under
TRITON_INTERPRET=1 with ``--check`` (tiny shapes, against float64).
PREDICTED (H100, before any run): qwen3-0.6b's products a step at 2 rows 0.50-0.53 ms (the
one-row GEMV 0.483, the few-row kernel 0.629); qwen3-8b's 5.0-5.1 (4.97 and 5.21); at 4 rows
within 20% of one row on 0.6b.
MEASURED (stop 60, H100, ``h100/stop60_c25a30c/two_rows_proto/``), products a step, best tile
per product: qwen3-0.6b at 2 rows **0.659 ms** against the few-row kernel's 0.626 and one row's
0.479 (at the GEMV's own tiles 0.674); at 4 rows 0.885 against 0.627. qwen3-8b at 2 rows 5.338
against 5.051 (one row 4.841), at 4 rows 7.928 against 5.069. Wrong: level with the few-row
kernel on q/k/v and down at 2 rows, ahead on o (4.2 against 4.6 us), behind on gate/up (8.8
against 7.2); the second row's FMAs are not free. Kept for its numbers; nothing to wire in.
"""

import itertools
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def _acc_row(acc, w, x_ptr, row, stride_xm, k, K):
    x = tl.load(x_ptr + row * stride_xm + k, mask=k < K, other=0.0).to(tl.float32)
    return acc + w * x[None, :]


@triton.jit
def _acc_rows(a0, a1, a2, a3, w, x_ptr, stride_xm, k, K, ROWS: tl.constexpr):
    """Each of the first ROWS rows' accumulators += w * that row of x (the others unchanged)."""
    a0 = _acc_row(a0, w, x_ptr, 0, stride_xm, k, K)
    if ROWS > 1:
        a1 = _acc_row(a1, w, x_ptr, 1, stride_xm, k, K)
    if ROWS > 2:
        a2 = _acc_row(a2, w, x_ptr, 2, stride_xm, k, K)
    if ROWS > 3:
        a3 = _acc_row(a3, w, x_ptr, 3, stride_xm, k, K)
    return a0, a1, a2, a3


@triton.jit
def _store_row(acc, acc_up, out_ptr, row, stride_om, offs_n, n_mask, SILU_OUT: tl.constexpr):
    y = tl.sum(acc, 1)
    if SILU_OUT:
        gate = y.to(out_ptr.dtype.element_ty).to(tl.float32)
        up = tl.sum(acc_up, 1).to(out_ptr.dtype.element_ty).to(tl.float32)
        y = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * stride_om + offs_n, y.to(out_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def _rows_gemv_kernel(x_ptr, w_ptr, out_ptr, N, K, stride_xm, stride_wn, stride_om,
                      SILU_OUT: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr):  # fmt: skip
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    up_rows = w_ptr + (offs_n + N).to(tl.int64)[:, None] * stride_wn
    zero = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    a0, a1, a2, a3 = zero, zero, zero, zero
    u0, u1, u2, u3 = zero, zero, zero, zero
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        wm = n_mask[:, None] & (k < K)[None, :]
        w = tl.load(w_rows + k[None, :], mask=wm, other=0.0,
                    eviction_policy="evict_first").to(tl.float32)  # fmt: skip
        a0, a1, a2, a3 = _acc_rows(a0, a1, a2, a3, w, x_ptr, stride_xm, k, K, ROWS)
        if SILU_OUT:
            u = tl.load(up_rows + k[None, :], mask=wm, other=0.0,
                        eviction_policy="evict_first").to(tl.float32)  # fmt: skip
            u0, u1, u2, u3 = _acc_rows(u0, u1, u2, u3, u, x_ptr, stride_xm, k, K, ROWS)
    _store_row(a0, u0, out_ptr, 0, stride_om, offs_n, n_mask, SILU_OUT)
    if ROWS > 1:
        _store_row(a1, u1, out_ptr, 1, stride_om, offs_n, n_mask, SILU_OUT)
    if ROWS > 2:
        _store_row(a2, u2, out_ptr, 2, stride_om, offs_n, n_mask, SILU_OUT)
    if ROWS > 3:
        _store_row(a3, u3, out_ptr, 3, stride_om, offs_n, n_mask, SILU_OUT)


def rows_gemv(x, w, silu_out=False, tiles=(16, 512, 8, 4)):
    block_n, block_k, warps, stages = tiles
    m, k = x.shape
    assert 1 <= m <= 4
    n = w.shape[0] // 2 if silu_out else w.shape[0]
    if silu_out:
        block_n = max(block_n // 2, 1)
    out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    _rows_gemv_kernel[(triton.cdiv(n, block_n),)](
        x, w, out, n, k, x.stride(0), w.stride(0), out.stride(0), SILU_OUT=silu_out, ROWS=m,
        BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out


def reference(x, w, silu_out):
    y = (x.double() @ w.double().T).to(x.dtype).double()
    if silu_out:
        h = y.shape[1] // 2
        y = torch.nn.functional.silu(y[:, :h]) * y[:, h:]
    return y


def check() -> None:
    """Interpreter check at odd sizes, every row count, with and without SILU_OUT: each row
    equals the one-row GEMV's product of that row exactly."""
    from nanograph.kernels.gemv import GemvTiles, gemv

    torch.manual_seed(0)
    for m, (n, k), silu in itertools.product((1, 2, 3, 4), ((10, 37), (24, 70)), (False, True)):
        x = torch.randn(m, k, dtype=torch.bfloat16)
        w = torch.randn(n, k, dtype=torch.bfloat16)
        got = rows_gemv(x, w, silu, (4, 16, 1, 1))
        want = torch.cat([gemv(x[i : i + 1], w, silu_out=silu, tiles=GemvTiles(2, 16, 1, 1))
                          for i in range(m)])  # fmt: skip
        assert torch.equal(got, want), (m, n, k, silu)
    print("check: ok")


TILES = list(itertools.product((4, 8, 16), (512, 1024), (4, 8), (3, 4)))


def compare(product, tiles_swept, models: list[str], rep_ms: int = 15) -> None:
    """Prints each product's time at 2 and 4 rows through ``product(x, w, silu_out, tiles)``
    (its best of ``tiles_swept``, and at the one-row GEMV's tiles), the few-row kernel and the
    one-row GEMV on one row, and their sums over a decode step. Shared with
    ``gemv_rows_proto.py``, whose kernel takes the same arguments."""
    from nanograph.bench.gemv import _timed_us, _weight_copies, projections
    from nanograph.kernels.gemv import choose_tiles, gemv
    from nanograph.kernels.rows import gemm_rows
    from nanograph.loader import resolve_model

    for model in models:
        products = projections(resolve_model(model, "dummy").config)
        products.pop("lm_head")
        products["gate_up"] = products.pop("gate_up")
        products["down"] = products.pop("silu_down")
        for rows in (2, 4):
            step = {"few-row": 0.0, "proto": 0.0, "proto default tiles": 0.0, "gemv 1 row": 0.0}
            for name, (n, k, times) in products.items():
                silu = name == "gate_up"
                weights = _weight_copies(n, k)
                x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
                want = reference(x, weights[0], silu)
                default = choose_tiles(n, k, 0)
                default = (default.block_n, default.block_k, default.num_warps,
                           default.num_stages)  # fmt: skip
                best = None
                for tiles in tiles_swept:
                    try:
                        got = product(x, weights[0], silu, tiles).double()
                        err = ((got - want).abs().max() / want.abs().max()).item()
                        us = _timed_us(lambda a, w, t=tiles, s=silu: product(a, w, s, t),
                                       weights, x, rep_ms)  # fmt: skip
                    except Exception as e:  # noqa: BLE001 - out of resources
                        print(f"  {tiles}: {type(e).__name__}")
                        continue
                    if best is None or us < best[0]:
                        best = (us, tiles, err)
                timed = {
                    "few-row": lambda a, w, s=silu: gemm_rows(a, w, silu_out=s),
                    "proto": lambda a, w, s=silu, t=best[1]: product(a, w, s, t),
                    "proto default tiles": lambda a, w, s=silu, t=default: product(a, w, s, t),
                    "gemv 1 row": lambda a, w, s=silu: gemv(a[:1], w, silu_out=s),
                }
                us = {arm: _timed_us(fn, weights, x, 100) for arm, fn in timed.items()}
                for arm, t in us.items():
                    step[arm] += times * t
                print(f"{model} {rows} rows {name:8s} {n}x{k}: few-row {us['few-row']:6.1f} us, "
                      f"proto {us['proto']:6.1f} us at {best[1]} (max err {best[2]:.2g} of the "
                      f"largest), at the GEMV's tiles {default} {us['proto default tiles']:6.1f},"
                      f" one-row GEMV {us['gemv 1 row']:6.1f} us", flush=True)  # fmt: skip
                del weights
                torch.cuda.empty_cache()
            summary = ", ".join(f"{a} {v / 1000:.3f} ms" for a, v in step.items())
            print(f"{model} {rows} rows, products a step: {summary}", flush=True)


if __name__ == "__main__":
    if "--check" in sys.argv:
        check()
    else:
        models = sys.argv[1].split(",") if len(sys.argv) > 1 else ["qwen3-0.6b", "qwen3-8b"]
        compare(rows_gemv, TILES, models)
