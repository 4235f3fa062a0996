"""Benchmarks (``nanograph bench NAME``): speed and memory, never pass/fail tests.

Each module has ``main(argv) -> int`` and writes JSON (device, versions, commit, config, every
sample, medians), plus a figure where one helps.
"""

from __future__ import annotations

import importlib

BENCHES = {
    "prefill": "nanograph.bench.prefill",
    "decode": "nanograph.bench.decode",
    "build": "nanograph.bench.build",
    "memory": "nanograph.bench.memory",
    "size": "nanograph.bench.size",
    "floor": "nanograph.bench.floor",
    "attention": "nanograph.bench.attention",
    "graph": "nanograph.bench.graph_overhead",
    "host": "nanograph.bench.host",
    "gemv": "nanograph.bench.gemv",
    "coverage": "nanograph.bench.coverage",
    "startup": "nanograph.bench.startup",
    "prefix": "nanograph.bench.prefix",
    "serve": "nanograph.bench.serve",
    "spec": "nanograph.bench.spec",
    "structured": "nanograph.bench.structured",
}


def run(name: str, argv: list[str]) -> int:
    return importlib.import_module(BENCHES[name]).main(argv)
