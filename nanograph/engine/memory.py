"""The start-up memory report: where device memory went, as a table and as data.

Invariant: every figure is measured (parameter bytes, tensor bytes, graph-pool bytes from the
allocator, the allocator's peak during an eager forward), never estimated, with one exception:
the graph budget of background/lazy capture without --cuda-graph-memory is an estimate, which
the capture enforces against measured pool sizes. The prefix-cache figures and, with
background/lazy capture, the graph pools and ``graph_capture`` are the only ones that change
while the engine runs: ``Engine.memory_report()`` refreshes them. With tensor parallelism each
rank measures its own report (its shards, its pools); rank 0 shows them all at start-up
(``Engine.rank_memory``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class MemoryReport:
    weights: int = 0
    kv_pool: int = 0
    graph_pools: dict[str, int] = field(default_factory=dict)  # per runner path
    activation_peak: int = 0  # eager forward of chunked_prefill_size tokens, above its inputs
    # what the KV sizing kept free for graphs: startup capture measures it before capturing;
    # background/lazy capture plans it as the graph-memory budget (--cuda-graph-memory)
    graph_reserve: int = 0
    # background/lazy: a second activation peak, for capture warm-ups beside eager serving
    capture_warmup_reserve: int = 0
    device_total: int = 0
    prefix_cache: dict = field(default_factory=dict)  # empty when prefix caching is off
    # background/lazy capture: LiveCapture.stats() (states, ladders, histograms, budget)
    graph_capture: dict = field(default_factory=dict)
    rank: int = 0  # tensor-parallel rank this report is of, and the number of ranks
    ranks: int = 1

    def as_dict(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        rows = [("weights", self.weights), ("KV pool", self.kv_pool)]
        rows += [(f"graph pool ({path})", n) for path, n in self.graph_pools.items()]
        rows.append(("eager activation peak", self.activation_peak))
        if self.graph_reserve:
            name = "graph budget" if self.graph_capture else "reserved for graphs"
            rows.append((name, self.graph_reserve))
        if self.capture_warmup_reserve:
            rows.append(("reserved for warm-ups", self.capture_warmup_reserve))
        width = max(len(name) for name, _ in rows)
        lines = [f"{name:<{width}}  {n / 2**20:>10.1f} MiB" for name, n in rows]
        if self.device_total:
            lines.append(f"{'device total':<{width}}  {self.device_total / 2**20:>10.1f} MiB")
        if self.prefix_cache:
            c = self.prefix_cache
            lines.append(
                f"{'of KV: prefix cache':<{width}}  {c['cached_bytes'] / 2**20:>10.1f} MiB  "
                f"({c['cached_pages']} pages, {c['evictable_pages']} evictable; hit rate "
                f"{c['hit_rate']:.1%} of {c['queried_tokens']} tokens)"
            )
        lines += _capture_lines(self.graph_capture)
        title = "memory" if self.ranks == 1 else f"memory of rank {self.rank} (of {self.ranks})"
        return title + "\n" + "\n".join("  " + line for line in lines)


def _capture_lines(stats: dict) -> list[str]:
    """The capture mode, and per path the ladder, the ready shapes and the observed sizes."""
    if not stats:
        return []
    lines = [
        f"graph capture: {stats['mode']}, {stats['captures']} captures in "
        f"{stats['capture_s']:.1f} s, {stats['budget']['evictions']} evictions"
    ]
    for path, p in stats["paths"].items():
        sizes = ", ".join(f"{n}: {c}" for n, c in p["histogram"].items()) or "none yet"
        lines += [
            f"  {path} ladder ({p['ladder_mode']}): {' '.join(p['ladder']) or '-'}",
            f"  {path} ready: {' '.join(p['ready']) or '-'}",
            f"  {path} observed sizes (size: batches): {sizes}",
        ]
    return lines
