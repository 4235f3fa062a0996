"""``nanograph bench attention``: our paged-attention kernels against each of torch SDPA's
fused backends (flash, cuDNN, memory-efficient; one that cannot run a shape is recorded as such,
and the ratio is against the fastest that can).

Cases (bf16, page size 16; qwen3-8b's head layout, 32 q heads, 8 kv heads, head_dim 128, unless
the name ends in ``_06b``: qwen3-0.6b's 16 q heads, 8 kv heads, head_dim 128; in ``_30b``:
qwen3-30b-a3b's 32 q heads, 4 kv heads, head_dim 128):
- extend: 1 request x 8192 and x 32768 new tokens in both layouts, 32 requests x 256 (no
  prefix), reported in TFLOP/s;
- decode: 1 request at 32k context, 128 requests at 2k, and the latency-bound small cases (1 at
  512 in all three layouts, 1 at 4k, 8 at 1k), reported in GB/s of KV read.
On sm_90, an extend that ``kernels.attention_hopper`` supports is timed twice: ``triton`` (the
Triton kernel, the Hopper one switched off) and ``hopper`` (the Gluon kernel, what the engine
runs there). SDPA runs the same work on contiguous K/V (``enable_gqa``, causal for extend;
K/V expanded to the q heads, outside timing, for a backend without GQA), so the gap is the
price of paging plus kernel quality. All are timed as CUDA-graph replays (as the engine runs
them): medians of ``bench.common.graphed_samples``, the L2 flushed by a read before each
sample (results before 95c599c used do_bench's zeroing flush, whose dirty write-backs fell
inside the timed kernel).
Ceilings are the H200's measured ~790 TFLOP/s bf16 dense and ~4.3 TB/s copy; this device's copy
bandwidth is measured too.
``--sweep`` also times a grid of launch configurations per case (to tune ``choose_tiles``).
Writes JSON: device, versions, commit, config, every sample, medians.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

from nanograph.bench.common import (
    DEFAULT_OUT_DIR,
    environment,
    graphed_samples,
    median,
    require_cuda,
)
from nanograph.kernels.testing import PagedBatch, make_paged_batch

HEAD_LAYOUTS = {
    "qwen3-8b": {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128},
    "qwen3-0.6b": {"num_q_heads": 16, "num_kv_heads": 8, "head_dim": 128},
    "qwen3-30b-a3b": {"num_q_heads": 32, "num_kv_heads": 4, "head_dim": 128},
}
PAGE_SIZE = 16
CEILING_TFLOPS = 790.0  # H200 bf16 dense, measured
CEILING_GBPS = 4300.0  # H200 device copy, measured


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # "extend" or "decode"
    requests: int
    context: int  # cached tokens before this forward
    new_tokens: int  # per request
    layout: str = "qwen3-8b"  # a key of HEAD_LAYOUTS

    @property
    def heads(self) -> dict[str, int]:
        return HEAD_LAYOUTS[self.layout]

    @property
    def seq_len(self) -> int:
        return self.context + self.new_tokens

    def flops(self) -> float:
        # causal: query i of a request sees context + i + 1 keys; 2 matmuls x 2 flop per MAC
        keys = sum(self.context + i + 1 for i in range(self.new_tokens)) * self.requests
        return 4.0 * keys * self.heads["num_q_heads"] * self.heads["head_dim"]

    def kv_bytes(self) -> float:
        heads = self.heads
        return 2.0 * self.requests * self.seq_len * heads["num_kv_heads"] * heads["head_dim"] * 2


CASES = (
    Case("extend_1x8192", "extend", 1, 0, 8192),
    Case("extend_1x32k", "extend", 1, 0, 32768),
    Case("extend_1x8192_06b", "extend", 1, 0, 8192, "qwen3-0.6b"),
    Case("extend_1x32k_06b", "extend", 1, 0, 32768, "qwen3-0.6b"),
    Case("extend_32x256", "extend", 32, 0, 256),
    # one prompt of a few hundred to a few thousand tokens: where the Hopper extend's two
    # launches (it and Triton's for the short requests) start to pay for themselves
    Case("extend_1x512_06b", "extend", 1, 0, 512, "qwen3-0.6b"),
    Case("extend_1x1024_06b", "extend", 1, 0, 1024, "qwen3-0.6b"),
    Case("extend_1x2048_06b", "extend", 1, 0, 2048, "qwen3-0.6b"),
    Case("decode_1x32k", "decode", 1, 32767, 1),
    Case("decode_128x2k", "decode", 128, 2047, 1),
    # qwen3-8b decode at batch 1, 512 tokens of context: 36 launches a step, 0.31 ms of the
    # step's 4.80 ms kernel floor (h200/floor_decode_8b.json): latency, not bandwidth
    Case("decode_1x512", "decode", 1, 511, 1),
    # a small batch at a short context: 16 splits, the regime between the two tile choices
    Case("decode_8x1k", "decode", 8, 1023, 1),
    # the batch-1 decode of the small and the MoE model (issues 15, 18): ~9 us a layer in
    # their decode graphs at 512 tokens, a third of qwen3-0.6b's step
    Case("decode_1x512_06b", "decode", 1, 511, 1, "qwen3-0.6b"),
    Case("decode_1x512_30b", "decode", 1, 511, 1, "qwen3-30b-a3b"),
    Case("decode_1x4k_30b", "decode", 1, 4095, 1, "qwen3-30b-a3b"),
)


def _head_args(case: Case) -> tuple[int, int, int]:
    heads = case.heads
    return heads["num_q_heads"], heads["num_kv_heads"], heads["head_dim"]


def _paged_batch(case: Case) -> PagedBatch:
    return make_paged_batch(
        [case.context] * case.requests, [case.new_tokens] * case.requests, **case.heads,
        page_size=PAGE_SIZE, dtype=torch.bfloat16, device="cuda",
    )  # fmt: skip


def _hopper_allowed(allowed: bool):
    """paged_attention's Hopper extend (``kernels.attention_hopper``) on or off inside."""
    from nanograph.kernels.attention import HOPPER_SWITCH

    return mock.patch.dict(os.environ, {HOPPER_SWITCH: "1" if allowed else "0"})


def _hopper_supported(case: Case, batch: PagedBatch) -> bool:
    """Whether paged_attention runs this case's requests in the Hopper (Gluon) kernel."""
    from nanograph.kernels.attention import HOPPER_MIN_QUERY_LEN, hopper_extend

    if case.kind == "decode" or case.new_tokens < HOPPER_MIN_QUERY_LEN:
        return False
    slots = batch.slot_mapping
    new_kv = (batch.k_cache[slots], batch.v_cache[slots])
    args = (batch.q, batch.k_cache, batch.v_cache, new_kv, batch.q, PAGE_SIZE, 0, None, 0.0)
    return hopper_extend(*args) is not None


def _triton_fn(
    case: Case, batch: PagedBatch, tiles=None, hopper: bool = False
) -> Callable[[], torch.Tensor]:
    """paged_attention on the case; ``hopper``: its Hopper kernel allowed (else Triton's)."""
    from nanograph.kernels.attention import paged_attention

    out = torch.empty_like(batch.q)
    max_query_len = 1 if case.kind == "decode" else None
    scale = case.heads["head_dim"] ** -0.5
    # an extend is given this forward's k/v rows, as the engine's attention is (tiles that
    # take them read the new keys from there, the rest from the cache)
    slots = batch.slot_mapping  # a bench batch has no padded rows
    new_kv = None if case.kind == "decode" else (batch.k_cache[slots], batch.v_cache[slots])

    def run() -> torch.Tensor:
        with _hopper_allowed(hopper):
            return paged_attention(
                batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), PAGE_SIZE, scale,
                max_query_len=max_query_len, tiles=tiles, out=out, new_kv=new_kv,
            )  # fmt: skip

    return run


# torch SDPA's fused backends, each timed on its own: which one wins depends on the shape
# (flash for long causal prefill, cuDNN on Hopper, efficient where flash refuses GQA)
SDPA_BACKENDS = ("flash", "cudnn", "efficient")


def _sdpa_fn(case: Case, backend: str) -> tuple[Callable[[], object], str]:
    """One SDPA backend on the case's work with contiguous K/V; raises RuntimeError when the
    backend cannot run the shape."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }[backend]
    hq, hkv, d = (case.heads[k] for k in ("num_q_heads", "num_kv_heads", "head_dim"))
    b, lq, lk = case.requests, case.new_tokens, case.seq_len
    q = torch.randn(b, hq, lq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, hkv, lk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    # extend: causal over a prompt without prefix (SDPA's top-left alignment is right there)
    kwargs = {"is_causal": case.kind == "extend", "enable_gqa": True}
    note = f"enable_gqa, {hkv} kv heads"

    def run() -> object:
        with sdpa_kernel(chosen):
            return F.scaled_dot_product_attention(q, k, v, **kwargs)

    try:
        run()
    except RuntimeError:  # no GQA in this backend: the same work on K/V expanded outside timing
        k, v = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
        kwargs.pop("enable_gqa")
        note = f"K/V expanded to {hq} heads (the backend rejected enable_gqa)"
        run()  # still refused: the caller records the backend as unsupported here
    return run, note


def _sdpa_arms(case: Case, rep_ms: int) -> dict[str, dict]:
    """Every SDPA backend's timing on the case, or why it could not run."""
    arms: dict[str, dict] = {}
    for backend in SDPA_BACKENDS:
        try:
            run, note = _sdpa_fn(case, backend)
        except RuntimeError as e:
            arms[backend] = {"unsupported": str(e).splitlines()[0][:200]}
            continue
        samples = graphed_samples(run, rep_ms)
        arms[backend] = {"median_ms": median(samples), **_metrics(case, median(samples)),
                         "note": note, "samples_ms": samples}  # fmt: skip
        del run
        torch.cuda.empty_cache()
    return arms


def _copy_bandwidth_gbps(rep_ms: int) -> float:
    import triton.testing

    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    # Eager, not a graph replay: a captured copy_ becomes a memcpy node, which measured ~2.7 TB/s
    # on the H200 against ~4.2 TB/s for the copy kernel; a 1 GiB copy hides the launch anyway.
    samples = triton.testing.do_bench(lambda: dst.copy_(src), rep=rep_ms, return_mode="all")
    return 2 * src.numel() / (median(list(samples)) * 1e-3) / 1e9


def _metrics(case: Case, ms: float) -> dict[str, float]:
    if case.kind == "extend":
        tflops = case.flops() / (ms * 1e-3) / 1e12
        return {"tflops": tflops, "fraction_of_ceiling": tflops / CEILING_TFLOPS}
    gbps = case.kv_bytes() / (ms * 1e-3) / 1e9
    return {"gbps": gbps, "fraction_of_ceiling": gbps / (CEILING_GBPS)}


def _last_compiled_resources() -> dict:
    """Registers and spills of the attention kernel variant compiled last (Triton internals:
    best effort, empty where this Triton version keeps them elsewhere)."""
    from nanograph.kernels.attention_kernel import _paged_attention_kernel

    try:
        caches = _paged_attention_kernel.device_caches[torch.cuda.current_device()][0]
        kernel = list(caches.values())[-1]
        return {"n_regs": kernel.n_regs, "n_spills": kernel.n_spills}
    except Exception:  # noqa: BLE001 - diagnostics only
        return {}


def _sweep(case: Case, batch: PagedBatch, rep_ms: int, deadline: float) -> list[dict]:
    from nanograph.kernels.attention_tiles import choose_tiles

    n = case.requests * case.new_tokens
    base = choose_tiles(
        torch.device("cuda"), n, case.requests, *_head_args(case),
        1 if case.kind == "decode" else None,
    )  # fmt: skip
    if case.kind == "extend":
        # the likeliest first (the deadline cuts the list): 128-row tiles in 4 or 8 warps,
        # 64- or 128-key blocks for long prompts; then 64- and 256-row tiles (256 rows only in
        # 8 warps: 4 spill the accumulator)
        long = case.new_tokens >= 4096
        grid = [
            {"block_q": bq, "block_n": bn, "num_warps": w, "num_stages": st,
             "num_splits": sp, "prefetch_pages": False}
            for bq in (base.block_q, base.block_q // 2, base.block_q * 2)
            for bn in ((64, 128) if long else (32, 64))
            for w in (4, 8)
            for st in (3, 2, 4)
            for sp in sorted({1, base.num_splits})
            if bq >= 1 and not (bq * base.group_pad > 128 and w == 4)
        ]  # fmt: skip
        if long:
            # first, the key loop with page ids one block ahead (K and V are then pipelined
            # through shared memory, so smaller tiles fit more stages), then without; Triton
            # 3.6's automatic warp specialization of this loop measured the same as without it
            # at 7b767ad (Hopper does not specialize it)
            prefetching = [
                {"prefetch_pages": True, "block_q": bq, "block_n": bn, "num_stages": st}
                for bq in (base.block_q, max(base.block_q // 2, 1))
                for bn in (128, 64)
                for st in (3, 4, 2)
            ]  # fmt: skip
            plain = [{"prefetch_pages": False, "num_stages": st} for st in (3, 2, 4)]
            grid = prefetching + plain + grid
        # each configuration once (the lists above overlap), at its first place in the order
        unique: dict = {}
        for overrides in grid:
            unique.setdefault(replace(base, **overrides), overrides)
        grid = list(unique.values())
    else:
        long = case.requests == 1 and case.context >= 8192
        grid = [
            {"block_n": bn, "num_splits": sp, "prefetch_pages": pf, "num_warps": w,
             "num_stages": st}
            for bn in (64, 128, 32)
            # one long sequence: 8 and 128 splits lost to 16-64 in every configuration at
            # 3c212ef; a few short ones: few key blocks to split at all
            for sp in (
                (1, 2) if case.requests >= 64
                else (32, 16, 64) if long
                else (1, 2, 4, 8, 16, 32)
            )
            for pf in (False, True)
            # deeper pipelines for the long sequence: its loop is latency-bound (ncu at
            # 06016ef: 7.6 warps an SM, 82% of cycles with no warp eligible)
            for st in ((2, 3, 4) if long else (2, 3))
            for w in (4, 8)
        ]  # fmt: skip
    default_out = _triton_fn(case, batch)().clone()
    # compile every configuration first, on the host's cores (the timing loop then compiles
    # nothing; one that fails to compile fails again below and is recorded there)
    from nanograph.kernels.launch import parallel_compiles

    with contextlib.suppress(Exception), parallel_compiles(os.cpu_count() or 1):
        for overrides in grid:
            with contextlib.suppress(Exception):
                _triton_fn(case, batch, replace(base, **overrides))()
    results = []
    for overrides in grid:
        if time.monotonic() > deadline:
            break
        tiles = replace(base, **overrides)
        try:
            fn = _triton_fn(case, batch, tiles)
            # every configuration must compute the same attention (up to summation order)
            diff = (fn().float() - default_out.float()).abs().max().item()
            ms = median(graphed_samples(fn, rep_ms))
        except Exception as error:  # out of shared memory, registers: record and go on
            results.append({"tiles": asdict(tiles), "error": repr(error)[:200]})
            continue
        results.append(
            {"tiles": asdict(tiles), "median_ms": ms, "max_abs_diff_vs_default": diff,
             **_metrics(case, ms), **_last_compiled_resources()}
        )  # fmt: skip
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nanograph bench attention", description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT_DIR / "attention.json")
    parser.add_argument("--rep-ms", type=int, default=200, help="sampling time per measurement")
    parser.add_argument("--sweep", action="store_true", help="also time launch configurations")
    parser.add_argument("--sweep-seconds", type=float, default=120.0)
    parser.add_argument(
        "--cases", default=",".join(c.name for c in CASES),
        help="comma-separated cases to run (default: all)",
    )  # fmt: skip
    parser.add_argument(
        "--launch-only", type=int, default=0, metavar="N",
        help="launch each case's default kernel N times and exit, timing nothing (for a "
        "profiler: ncu -k regex:_paged_attention_kernel ...)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    names = args.cases.split(",")
    unknown = sorted(set(names) - {c.name for c in CASES})
    if unknown:
        parser.error(f"unknown cases {unknown}: choose from {[c.name for c in CASES]}")
    cases = [c for c in CASES if c.name in names]
    require_cuda("attention")
    if args.launch_only:
        for case in cases:
            run = _triton_fn(case, _paged_batch(case))
            for _ in range(args.launch_only):
                run()
        torch.cuda.synchronize()
        return 0

    from nanograph.kernels.attention_tiles import choose_tiles

    report: dict = {
        "device": torch.cuda.get_device_name(),
        "env": environment(),
        "config": {
            "head_layouts": HEAD_LAYOUTS,
            "dtype": "bfloat16",
            "page_size": PAGE_SIZE,
            "rep_ms": args.rep_ms,
        },  # fmt: skip
        "ceilings": {"tflops": CEILING_TFLOPS, "copy_gbps": CEILING_GBPS},
        "measured_copy_gbps": _copy_bandwidth_gbps(args.rep_ms),
        "cases": {},
    }
    print(f"{report['device']}: copy {report['measured_copy_gbps']:.0f} GB/s")
    batches = {}
    for case in cases:
        batches[case.name] = batch = _paged_batch(case)
        triton_samples = graphed_samples(_triton_fn(case, batch), args.rep_ms)
        sdpa = _sdpa_arms(case, args.rep_ms)
        timed = {name: arm["median_ms"] for name, arm in sdpa.items() if "median_ms" in arm}
        best = min(timed, key=timed.get) if timed else None
        t_ms = median(triton_samples)
        n = case.requests * case.new_tokens
        tiles = choose_tiles(
            torch.device("cuda"), n, case.requests, *_head_args(case),
            1 if case.kind == "decode" else None,
        )  # fmt: skip
        entry = {
            "case": asdict(case),
            "tiles": asdict(tiles),
            "triton": {
                "median_ms": t_ms,
                **_metrics(case, t_ms),
                **_last_compiled_resources(),
                "samples_ms": triton_samples,
            },  # fmt: skip
            "sdpa": sdpa,
            "best_sdpa": best,
            # > 1: Triton ahead of the fastest SDPA backend on this shape
            "triton_vs_best_sdpa": timed[best] / t_ms if best else None,
        }
        if _hopper_supported(case, batch):  # what the engine runs on sm_90 for this extend
            h_samples = graphed_samples(_triton_fn(case, batch, hopper=True), args.rep_ms)
            h_ms = median(h_samples)
            entry["hopper"] = {"median_ms": h_ms, **_metrics(case, h_ms), "samples_ms": h_samples}
            entry["hopper_vs_best_sdpa"] = timed[best] / h_ms if best else None
        report["cases"][case.name] = entry
        unit = "TFLOP/s" if case.kind == "extend" else "GB/s"
        key = "tflops" if case.kind == "extend" else "gbps"
        arms = " | ".join(
            f"{name} {arm['median_ms']:7.3f} ms {arm[key]:7.1f}" if "median_ms" in arm
            else f"{name} n/a"
            for name, arm in sdpa.items()
        )  # fmt: skip
        ratio = f"{entry['triton_vs_best_sdpa']:.2f} vs {best}" if best else "no SDPA backend"
        hopper = entry.get("hopper")
        if hopper is not None:
            ratio += f" | hopper {hopper['median_ms']:7.3f} ms {hopper[key]:7.1f} {unit}"
            if best:
                ratio += f", {entry['hopper_vs_best_sdpa']:.2f} vs {best}"
        print(f"{case.name:>15}: triton {t_ms:7.3f} ms {entry['triton'][key]:7.1f} {unit} | "
              f"{arms} | ratio {ratio}")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    if args.sweep:
        deadline = time.monotonic() + args.sweep_seconds
        report["sweep"] = {}
        for i, case in enumerate(cases):
            now = time.monotonic()
            case_deadline = now + (deadline - now) / (len(cases) - i)  # leftover time carries on
            report["sweep"][case.name] = _sweep(
                case, batches[case.name], max(args.rep_ms // 4, 20), case_deadline
            )
            best = min(
                (r for r in report["sweep"][case.name] if "median_ms" in r),
                key=lambda r: r["median_ms"],
                default=None,
            )
            if best:
                print(f"sweep {case.name}: best {best['median_ms']:.3f} ms {best['tiles']}")
            args.out.write_text(json.dumps(report, indent=1))  # partial results survive a kill
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
