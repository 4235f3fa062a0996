"""Prometheus metrics of one server (``GET /metrics``), in a registry of its own.

Engine-side values (requests running and waiting, KV pages, tokens in and out, graph replays
and eager forwards per path) are read at scrape time from the front's stats snapshot, so they
cost the engine nothing. Latencies are observed where the client sees them: the handler, on
receiving a request's tokens.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from nanograph.engine.front import EngineFront

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
    def __init__(self, front: EngineFront) -> None:
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


class ServerMetrics:
    def __init__(self, front: EngineFront) -> None:
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
