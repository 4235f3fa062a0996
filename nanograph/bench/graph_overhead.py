"""Benchmark the graph backends' replay cost (`nanograph bench graph`).

Measures on the current GPU, writing JSON to --out (device, versions, config, every sample,
medians):
- `break_overhead`: replay cost of one empty eager break, in microseconds: a chain of tiny ops
  with an empty break after each, replayed under `breakable`, minus the same chain under `full`,
  divided by the number of breaks. Two kinds of empty break: one returning its (1-element) input
  (so a boundary copy is included) and one returning None.
- `stack`: replay time of a transformer-like stack (default 28 layers: RMSNorm, QKV, rotary,
  causal attention declared as a split op, output projection, MLP) under eager, full, breakable
  and tc_piecewise at 1, 64 and 2048 rows, with capture/compile seconds and pool bytes.
Each timing: warm-up replays, then --runs runs of --iters replays between CUDA events; a sample
is milliseconds per replay, the reported figure the median over runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from nanograph.bench.common import DEFAULT_OUT_DIR, environment, require_cuda
from nanograph.cli import int_list
from nanograph.graph import eager_on_graph, get_backend, new_pool, split_op

BACKENDS = ("eager", "full", "breakable", "tc_piecewise")


@split_op(
    "nanograph_bench::attention",
    fake=lambda q, k, v: q.new_empty(q.shape[0], q.shape[1] * q.shape[2]),
)
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    rows = q.shape[0]
    q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [1, heads, rows, dim]
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # 4-D: flash kernels
    return out.squeeze(0).transpose(0, 1).reshape(rows, -1)


@eager_on_graph
def empty_break(t: torch.Tensor) -> torch.Tensor:
    return t


@eager_on_graph
def empty_break_none() -> None:
    return None


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Layer(torch.nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.RMSNorm(hidden), torch.nn.RMSNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden, bias=False)
        self.o = torch.nn.Linear(hidden, hidden, bias=False)
        self.up = torch.nn.Linear(hidden, 4 * hidden, bias=False)
        self.down = torch.nn.Linear(4 * hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).view(x.shape[0], 3, self.heads, -1).unbind(1)
        x = x + self.o(attention(rotary(q, cos, sin), rotary(k, cos, sin), v))
        return x + self.down(F.silu(self.up(self.norm2(x))))


class Stack(torch.nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer(hidden, heads) for _ in range(layers))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, cos, sin)
        return x


def forward_of(model: Stack, *static: torch.Tensor) -> Callable[[], torch.Tensor]:
    """The callable a runner would capture: the model over its static inputs."""
    return lambda: model(*static)


def time_replays(replay: Callable[[], None], iters: int, runs: int, warmup: int = 3) -> list:
    """Milliseconds per replay, one sample per run of `iters` replays (CUDA events)."""
    for _ in range(warmup):
        replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / iters)
    return samples


def settle() -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def bench_break_overhead(args: argparse.Namespace, results: dict) -> None:
    x = torch.zeros(1, device="cuda")
    n = args.breaks

    def chain(with_output: bool) -> Callable[[], torch.Tensor]:
        def fn() -> torch.Tensor:
            y = x
            for _ in range(n):
                y = y + 1
                if with_output:
                    y = empty_break(y)
                else:
                    empty_break_none()
            return y

        return fn

    for kind, with_output in (("returns_tensor", True), ("returns_none", False)):
        fn = chain(with_output)
        timings = {}
        for backend in ("full", "breakable"):
            graph, _ = get_backend(backend).capture(fn, pool=new_pool())
            timings[backend] = time_replays(graph.replay, args.iters, args.runs)
            del graph
        full_ms, breakable_ms = (statistics.median(timings[b]) for b in ("full", "breakable"))
        results["break_overhead"][kind] = {
            "breaks": n,
            "samples_ms": timings,
            "median_ms": {"full": full_ms, "breakable": breakable_ms},
            "per_break_us": (breakable_ms - full_ms) * 1000 / n,
        }
        print(f"empty break ({kind}): {(breakable_ms - full_ms) * 1000 / n:.2f} us per break")


def bench_stack(args: argparse.Namespace, results: dict, write: Callable[[], None]) -> None:
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    model = Stack(args.layers, args.hidden, args.heads).to("cuda", dtype).requires_grad_(False)
    head_dim = args.hidden // args.heads
    for rows in args.rows:
        x = torch.randn(rows, args.hidden, device="cuda", dtype=dtype)
        angles = torch.rand(rows, 1, head_dim // 2, device="cuda", dtype=dtype) * 6.28
        cos, sin = angles.cos(), angles.sin()
        entry: dict[str, Any] = {}
        results["stack"][str(rows)] = entry
        for backend in args.backends:
            forward = forward_of(model, x, cos, sin)
            graph, _ = get_backend(backend).capture(forward, pool=new_pool())
            samples = time_replays(graph.replay, args.iters, args.runs)
            stats = graph.stats
            entry[backend] = {
                "samples_ms": samples,
                "median_ms": statistics.median(samples),
                "segments": stats.segments,
                "breaks": stats.num_breaks,
                "capture_s": stats.capture_s,
                "compile_s": stats.compile_s,
                "pool_bytes": stats.pool_bytes,
            }
            print(f"rows={rows:5d} {backend:13s} {statistics.median(samples):8.3f} ms  {graph}")
            del graph
            settle()
            write()
        eager = entry.get("eager", {}).get("median_ms")
        if eager:
            entry["speedup_over_eager"] = {b: eager / entry[b]["median_ms"] for b in entry}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="nanograph bench graph", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT_DIR / "graph_overhead.json")
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--rows", type=int_list, default="1,64,2048")
    p.add_argument("--backends", type=lambda s: s.split(","), default=list(BACKENDS))
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--breaks", type=int, default=64, help="empty breaks in the overhead chain")
    p.add_argument("--iters", type=int, default=20, help="replays per timed run")
    p.add_argument("--runs", type=int, default=7, help="timed runs (the median is reported)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    require_cuda("graph")
    results: dict[str, Any] = {
        "benchmark": "graph_overhead",
        "device": torch.cuda.get_device_name(),
        "env": environment(),
        "cuda": torch.version.cuda,
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "break_overhead": {},
        "stack": {},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def write() -> None:  # after every measurement, so a cut-short run still leaves data
        args.out.write_text(json.dumps(results, indent=1))

    bench_break_overhead(args, results)
    write()
    bench_stack(args, results, write)
    write()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
