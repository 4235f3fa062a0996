"""The start-up memory report: where device memory went, as a table and as data.

Invariant: every figure is measured (parameter bytes, tensor bytes, graph-pool bytes from the
allocator, the allocator's peak during an eager forward), never estimated. The prefix-cache
figures are the only ones that change while the engine runs: ``Engine.memory_report()``
refreshes them (``PrefixCacheStats.as_dict()`` plus the bytes of the cached pages). With
tensor parallelism each rank measures its own report (its shards, its pools); rank 0 shows them
all at start-up (``Engine.rank_memory``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class MemoryReport:
    weights: int = 0
    kv_pool: int = 0
    graph_pools: dict[str, int] = field(default_factory=dict)  # per runner path
    activation_peak: int = 0  # eager forward of chunked_prefill_size tokens, above its inputs
    graph_reserve: int = 0  # what the KV sizing kept free for graphs (measured before capture)
    device_total: int = 0
    prefix_cache: dict = field(default_factory=dict)  # empty when prefix caching is off
    rank: int = 0  # tensor-parallel rank this report is of, and the number of ranks
    ranks: int = 1

    def as_dict(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        rows = [("weights", self.weights), ("KV pool", self.kv_pool)]
        rows += [(f"graph pool ({path})", n) for path, n in self.graph_pools.items()]
        rows.append(("eager activation peak", self.activation_peak))
        if self.graph_reserve:
            rows.append(("reserved for graphs", self.graph_reserve))
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
        title = "memory" if self.ranks == 1 else f"memory of rank {self.rank} (of {self.ranks})"
        return title + "\n" + "\n".join("  " + line for line in lines)
