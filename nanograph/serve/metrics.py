"""Prometheus metrics of one server (``GET /metrics``), in a registry of its own.

Engine-side values (requests running and waiting, KV pages, tokens in and out, graph replays
and eager forwards per path; with background/lazy capture the graph shapes per state, the
learned or configured ladder, the pools against the budget, evictions, and the observed batch
sizes as a histogram over the configured ladder's buckets; with speculative decoding the drafts
proposed and accepted) are read at scrape time from the
front's stats snapshot, so they cost the engine nothing. Latencies are observed where the
client sees them: the handler, on receiving a request's tokens.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from nanograph.engine.front import Front

# seconds; from a few decode steps of a small model on a GPU up to long CPU prefills
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
)


class _FrontCollector:
    def __init__(self, front: Front) -> None:
        self.front = front

    def collect(self):
        s = self.front.stats
        for name, doc, value in (
            ("requests_running", "requests in the running batch", s.running),
            ("requests_waiting", "requests waiting for admission", s.waiting),
            ("kv_pages_used", "KV pages held by requests", s.kv_pages_total - s.kv_pages_available),
            ("kv_pages_free", "KV pages holding nothing", s.kv_pages_free),
            (
                "kv_pages_cached",
                "prefix-cached KV pages no request reads (evictable)",
                s.kv_pages_available - s.kv_pages_free,
            ),
            ("kv_pages_total", "KV cache pages (scratch page excluded)", s.kv_pages_total),
        ):
            yield GaugeMetricFamily(f"nanograph_{name}", doc, value=value)
        yield CounterMetricFamily(
            "nanograph_prompt_tokens", "prompt tokens of admitted requests", value=s.prompt_tokens
        )
        yield CounterMetricFamily(
            "nanograph_generation_tokens", "output tokens streamed", value=s.output_tokens
        )
        yield CounterMetricFamily(
            "nanograph_prefix_cache_queried_tokens",
            "prompt tokens a prefix-cache match could have covered",
            value=s.prefix_queried_tokens,
        )
        yield CounterMetricFamily(
            "nanograph_prefix_cache_hit_tokens",
            "prompt tokens taken from the prefix cache",
            value=s.prefix_hit_tokens,
        )
        hit_rate = s.prefix_hit_tokens / s.prefix_queried_tokens if s.prefix_queried_tokens else 0
        yield GaugeMetricFamily(
            "nanograph_prefix_cache_hit_rate", "hit tokens over queried tokens", value=hit_rate
        )
        forwards = CounterMetricFamily(
            "nanograph_forwards",
            "forwards per path: graph replays and eager runs",
            labels=["path", "kind"],
        )
        for path, counts in s.forward_counts.items():
            for kind, n in counts.items():
                forwards.add_metric([path, kind], n)
        yield forwards
        if s.graph_capture:
            yield from _capture_metrics(s.graph_capture)
        if s.speculative:
            yield from _speculative_metrics(s.speculative)


def _speculative_metrics(stats: dict):
    """Speculative decoding: drafts proposed and accepted (vLLM's spec_decode counters)."""
    for name, key, doc in (
        ("num_draft_tokens", "draft_tokens", "draft tokens proposed"),
        ("num_accepted_tokens", "accepted_tokens", "draft tokens accepted"),
        ("num_verifications", "requests", "requests verified (a request in a verify step)"),
        ("num_emitted_tokens", "emitted_tokens", "tokens produced by speculative steps"),
    ):
        yield CounterMetricFamily(f"nanograph_spec_decode_{name}", doc, value=stats[key])
    yield GaugeMetricFamily(
        "nanograph_spec_decode_mean_accepted_length",
        "tokens a request gains per verification (1 + accepted drafts), since start",
        value=stats["mean_accepted_length"],
    )


def _capture_metrics(stats: dict):
    """Background/lazy capture: shapes per state, ladders, pools, budget, observed sizes."""
    shapes = GaugeMetricFamily(
        "nanograph_graph_shapes", "graph shapes per runner path and state", labels=["path", "state"]
    )
    ladder = GaugeMetricFamily(
        "nanograph_graph_ladder", "1 per planned shape (tokens x slots)", labels=["path", "shape"]
    )
    pools = GaugeMetricFamily(
        "nanograph_graph_pool_bytes", "graph pool size after the last capture", labels=["path"]
    )
    sizes = HistogramMetricFamily(
        "nanograph_batch_size",
        "observed forward sizes (decode: batch size, prefill: tokens) per runner path",
        labels=["path"],
    )
    for path, p in stats["paths"].items():
        for state, n in p["states"].items():
            shapes.add_metric([path, state], n)
        for shape in p["ladder"]:
            ladder.add_metric([path, shape], 1)
        pools.add_metric([path], p["pool_bytes"])
        histogram = p["histogram"]
        cumulative, buckets = 0, []
        for bound in p["configured"]:
            cumulative = sum(c for n, c in histogram.items() if n <= bound)
            buckets.append((str(bound), cumulative))
        buckets.append(("+Inf", sum(histogram.values())))
        sizes.add_metric([path], buckets, sum_value=sum(n * c for n, c in histogram.items()))
    yield from (shapes, ladder, pools, sizes)
    budget = stats["budget"]
    if budget["limit"] is not None:
        yield GaugeMetricFamily(
            "nanograph_graph_memory_budget_bytes", "graph memory budget", value=budget["limit"]
        )
    yield CounterMetricFamily(
        "nanograph_graph_evictions", "graphs evicted to stay within the budget",
        value=budget["evictions"],
    )  # fmt: skip
    yield CounterMetricFamily(
        "nanograph_graph_captures", "graphs captured while serving", value=stats["captures"]
    )


class ServerMetrics:
    def __init__(self, front: Front) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_FrontCollector(front))
        self.ttft = Histogram(
            "nanograph_time_to_first_token_seconds",
            "time to first token",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.itl = Histogram(
            "nanograph_inter_token_latency_seconds",
            "time between tokens",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "nanograph_request_latency_seconds",
            "arrival to last token",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.finished = Counter(
            "nanograph_requests_finished",
            "requests by finish reason",
            ["reason"],
            registry=self.registry,
        )
        self.rejected = Counter(
            "nanograph_requests_rejected",
            "requests refused with a 4xx/5xx",
            ["status"],
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
