"""The load generator's workloads: deterministic, within their length bounds, valid token ids."""

from __future__ import annotations

import numpy as np

from nanograph.bench.serve_workload import SHAREGPT_INPUT_MEDIAN, Workload


def test_random_workload_lengths_and_determinism():
    w = Workload("random", input_len=100, output_len=20, range_ratio=0.5, vocab_size=50)
    requests = w.requests(64, seed=3)
    assert requests == w.requests(64, seed=3) and requests != w.requests(64, seed=4)
    assert all(50 <= len(p) <= 150 and 10 <= o <= 30 for p, o in requests)
    assert all(0 <= t < 50 for p, _ in requests for t in p)
    fixed = Workload("random", input_len=7, output_len=3).requests(5, seed=0)
    assert [(len(p), o) for p, o in fixed] == [(7, 3)] * 5


def test_sharegpt_like_workload_is_heavy_tailed_and_clipped():
    w = Workload("sharegpt", max_input_len=1024, max_output_len=512)
    requests = w.requests(2000, seed=0)
    inputs = np.array([len(p) for p, _ in requests])
    outputs = np.array([o for _, o in requests])
    assert inputs.min() >= 4 and inputs.max() <= 1024 and outputs.max() <= 512
    assert abs(np.median(inputs) / SHAREGPT_INPUT_MEDIAN - 1) < 0.15
    assert inputs.mean() > np.median(inputs)  # a long tail
