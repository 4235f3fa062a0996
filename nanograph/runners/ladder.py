"""The learned shape ladder: which buckets to capture, chosen from the batch sizes actually seen.

A runner records how often each live size occurs (decode: batch size; prefill: token count).
``plan_ladder`` picks, among the configured ladder's buckets, the subset that minimises the
expected cost of serving that histogram:

- a batch of ``n`` served by bucket ``b >= n`` costs ``pad_cost * (b - n)`` (padded rows do real
  work: GEMM rows in prefill, almost nothing in weight-bound decode);
- a batch that no chosen bucket takes (above the ceiling, or a prefill bucket more than
  ``max_padding_ratio`` x its tokens, which dispatch refuses) runs eagerly and costs
  ``eager_cost`` (the launch overhead a graph saves) — less for large forwards: launches are
  asynchronous, so once a forward's GPU work outlasts them a graph saves nothing. The saving
  falls linearly to zero at ``eager_bound_tokens`` (prefill: graphs won 2-6.5x at 256 tokens on
  the H200 and were within 5% of eager from 2048), so a workload of long prompts does not
  hold graph memory for shapes that do not make it faster;
- the ladder must fit the graph memory budget. One pool per runner is shared by every shape, so
  its size is set by the largest bucket (``bytes_per_token`` x ceiling, at least ``floor_bytes``)
  plus what each shape keeps on its own (``shape_bytes``);
- graph memory has a price (``MEMORY_PRICE_PER_GIB``): the chosen ladder minimises the mean
  cost per forward plus that price x its GiB, so a bucket no batch uses is never captured (a
  workload that never exceeds batch 16 does not pay for batch 256), and neither is a large
  bucket that a size seen once in thousands of forwards would use.

Invariants: the result is a sorted subset of ``candidates``; an empty histogram gives an empty
ladder; the function is pure (CPU-tested on hand-computable histograms).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Relative costs, in units of one forward's launch overhead (what a graph saves). A decode row
# is nearly free (decode reads the weights once whatever the batch), so padding 8 rows costs
# ~1/128 of a launch overhead; a prefill token is real GEMM work: on an 8B model on an H200 one
# token is ~25 us against ~3 ms of launches per eager forward, about 1/128; we use 1/256 to
# lean towards capturing (smaller models make tokens cheaper still).
DECODE_PAD_COST = 1 / 1024
PREFILL_PAD_COST = 1 / 256
# Prefill forwards of this many tokens keep the GPU busy for longer than their launches take.
PREFILL_EAGER_BOUND_TOKENS = 2048
# A GiB of resident graph memory is worth capturing if it saves at least 1% of the forwards one
# launch overhead each (on top of the budget, a hard limit): padding and launches are weighed
# against memory in one unit.
MEMORY_PRICE_PER_GIB = 0.01


@dataclass(frozen=True)
class LadderCosts:
    pad_cost: float  # per padded token, in eager-forward overheads
    eager_cost: float = 1.0  # per forward that runs eagerly
    bytes_per_token: float = 0.0  # graph pool bytes per token of the largest bucket
    shape_bytes: float = 0.0  # graph memory each captured shape keeps on its own
    floor_bytes: float = 0.0  # what the pool costs however small its shapes
    max_padding_ratio: float | None = None  # prefill: dispatch's 2x rule
    eager_bound_tokens: float | None = None  # where a graph stops saving anything (module doc)

    def eager_saving(self, n: int) -> float:
        """What a graph saves a forward of ``n`` tokens (the cost of running it eagerly)."""
        if self.eager_bound_tokens is None:
            return self.eager_cost
        return self.eager_cost * max(0.0, 1.0 - n / self.eager_bound_tokens)

    def memory(self, ceiling: int, num_shapes: int) -> float:
        pool = max(self.floor_bytes, self.bytes_per_token * ceiling)
        return pool + self.shape_bytes * num_shapes


def plan_ladder(
    histogram: Mapping[int, int],
    candidates: Sequence[int],
    costs: LadderCosts,
    budget: float | None = None,
    max_shapes: int | None = None,
) -> list[int]:
    """The buckets (a sorted subset of ``candidates``) minimising the histogram's expected cost
    within ``budget`` bytes and ``max_shapes`` shapes. Exact: dynamic programming over the
    candidates, O(len(candidates)^2 x max_shapes), each interval's cost from prefix sums."""
    buckets = sorted(set(candidates))
    sizes = sorted((n, c) for n, c in histogram.items() if c > 0)
    if not buckets or not sizes:
        return []
    k_max = min(max_shapes or len(buckets), len(buckets))
    total = sum(c for _, c in sizes)
    ns = [n for n, _ in sizes]
    counts, weighted, saved = [0], [0], [0.0]  # prefix sums of c, c x n, c x saving(n)
    for n, c in sizes:
        counts.append(counts[-1] + c)
        weighted.append(weighted[-1] + c * n)
        saved.append(saved[-1] + c * costs.eager_saving(n))

    def served(low: int, high: int) -> float:
        """Cost change of serving the sizes in (low, high] by bucket ``high`` instead of
        eagerly; sizes the padding rule keeps off ``high`` stay eager (no change)."""
        first = bisect.bisect_right(ns, low)
        if costs.max_padding_ratio is not None:  # n >= high / ratio may use the bucket
            first = max(first, bisect.bisect_left(ns, high / costs.max_padding_ratio))
        last = bisect.bisect_right(ns, high)
        if first >= last:
            return 0.0
        c, cn = counts[last] - counts[first], weighted[last] - weighted[first]
        return costs.pad_cost * (high * c - cn) - (saved[last] - saved[first])

    table = {(i, j): served(buckets[i] if i >= 0 else 0, buckets[j])
             for j in range(len(buckets)) for i in range(-1, j)}  # fmt: skip

    # best[k][j]: lowest cost change of ladders of k buckets whose largest is buckets[j]
    inf = float("inf")
    best = [[inf] * len(buckets) for _ in range(k_max + 1)]
    back: dict[tuple[int, int], int | None] = {}
    for j in range(len(buckets)):
        best[1][j] = table[(-1, j)]
        back[(1, j)] = None
    for k in range(2, k_max + 1):
        for j in range(len(buckets)):
            for i in range(j):
                value = best[k - 1][i] + table[(i, j)]
                if value < best[k][j]:
                    best[k][j], back[(k, j)] = value, i
    choice, choice_cost = None, 0.0  # the empty ladder: everything eager
    for k in range(1, k_max + 1):
        for j, b in enumerate(buckets):
            if best[k][j] == inf:
                continue
            memory = costs.memory(b, k)
            if budget is not None and memory > budget:
                continue
            value = best[k][j] / total + MEMORY_PRICE_PER_GIB * memory / 2**30
            if value < choice_cost:
                choice, choice_cost = (k, j), value
    if choice is None:
        return []
    ladder, (k, j) = [], choice
    while True:
        ladder.append(buckets[j])
        i = back[(k, j)]
        if i is None:
            return sorted(ladder)
        k, j = k - 1, i
