"""Verification rules on toy inputs: n-gram proposals, greedy acceptance, and speculative
rejection sampling matching the target distribution (a statistical test, fixed seed)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanograph.engine.request import Request
from nanograph.engine.sampling_params import SamplingParams
from nanograph.spec.acceptance import accepted_prefix, greedy_verify, rejection_verify
from nanograph.spec.ngram import NgramDrafter, propose_ngram


def test_ngram_proposes_what_followed_the_latest_longest_match():
    assert propose_ngram([1, 2, 3, 4, 1, 2], 3) == [3, 4, 1]
    assert propose_ngram([7, 1, 2, 9, 1, 2, 5, 1, 2], 2) == [5, 1]  # the latest occurrence
    # the longest suffix wins: [3, 1, 2] occurred before [1, 2]'s later occurrence
    assert propose_ngram([3, 1, 2, 8, 4, 1, 2, 6, 3, 1, 2], 1) == [8]
    assert propose_ngram([5, 5, 5, 5], 3) == [5]  # what exists, never more
    assert propose_ngram([1, 2, 3], 2) == []  # no earlier occurrence
    assert propose_ngram([4, 4], 0) == [] and propose_ngram([4], 3) == []


def _ngram_by_windows(tokens: list[int], k: int, max_n: int, min_n: int) -> list[int]:
    """The definition, spelled out: for n from max_n down to min_n, every window of n tokens
    that ends before the last token and equals the last n; the latest one's continuation."""
    if k <= 0 or len(tokens) < 2:
        return []
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        hits = [s for s in range(len(tokens) - n) if tokens[s : s + n] == tokens[-n:]]
        if hits:
            return tokens[hits[-1] + n : hits[-1] + n + k]
    return []


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 3), max_size=40),  # a small vocabulary: many repeated n-grams
    st.integers(0, 6), st.integers(1, 6), st.integers(1, 3),
)  # fmt: skip
def test_ngram_matches_its_definition(tokens, k, max_n, min_n):
    assert propose_ngram(tokens, k, max_n, min_n) == _ngram_by_windows(tokens, k, max_n, min_n)


def test_ngram_drafter_follows_growing_requests_and_forgets_finished_ones():
    g = torch.Generator().manual_seed(0)
    drafter = NgramDrafter()
    requests = [
        Request(i, torch.randint(0, 5, (n,), generator=g).tolist(), SamplingParams())
        for i, n in enumerate([3, 70, 200])
    ]  # fmt: skip
    for _ in range(150):  # past the buffers' first doublings
        limits = [4, 2, 0]
        proposal = drafter.propose(requests, limits)
        assert proposal.probs is None
        assert proposal.drafts == [propose_ngram(r.token_ids, k) for r, k in zip(requests, limits)]
        for r in requests:
            r.output_ids.append(int(torch.randint(0, 5, (), generator=g)))
    drafter.keep_only(requests[1:])
    assert set(drafter.states) == {1, 2}
    drafter.release(1)
    assert set(drafter.states) == {2}


def test_greedy_accepts_the_longest_agreeing_prefix_plus_one():
    assert accepted_prefix([5, 6, 7], [5, 6, 9, 1]) == 2
    # request 0: drafts 5,6,7 vs target 5,6,9 -> 5,6,9; request 1: no drafts -> target's token;
    # request 2: all accepted -> drafts and the bonus token
    target = [5, 6, 9, 1, 42, 3, 4, 8]
    assert greedy_verify(target, [0, 4, 5], [[5, 6, 7], [], [3, 4]]) == [[5, 6, 9], [42], [3, 4, 8]]


def test_rejection_with_one_hot_targets_is_greedy():
    g = torch.Generator().manual_seed(0)
    vocab, drafts = 8, [[1, 2, 3], [4], [], [5, 5]]
    starts, total = [], 0
    for d in drafts:
        starts.append(total)
        total += len(d) + 1
    target = torch.randint(0, vocab, (total,), generator=g)
    target[0], target[1] = 1, 2  # request 0 accepts two drafts
    probs = torch.nn.functional.one_hot(target, vocab).float()
    uniforms = torch.rand(sum(map(len, drafts)), generator=g)
    noise = torch.empty(len(drafts), vocab).exponential_(generator=g)
    got = rejection_verify(probs, starts, drafts, None, uniforms, noise)
    assert got == greedy_verify(target.tolist(), starts, drafts)


def _simulate(p: torch.Tensor, q: torch.Tensor | None, k: int, trials: int, length: int, g):
    """Generates ``length`` tokens for ``trials`` independent requests by rounds of k drafts
    and verification. Position t has target distribution p[t] and draft distribution q[t]
    (None: a deterministic drafter that always proposes token t % V)."""
    vocab = p.shape[1]
    out = [[] for _ in range(trials)]
    while True:
        live = [b for b in range(trials) if len(out[b]) < length]
        if not live:
            break
        starts, drafts, rows, draft_rows = [], [], [], []
        for b in live:
            pos = len(out[b])
            starts.append(len(rows))
            rows += [pos + i for i in range(k + 1)]
            draft_rows.append([pos + i for i in range(k)])
        flat = torch.tensor([r for dr in draft_rows for r in dr])
        if q is None:
            tokens = (flat % vocab).view(len(live), k)
            draft_probs = None
        else:
            draft_probs = q[flat]
            tokens = torch.multinomial(draft_probs, 1, generator=g).view(len(live), k)
        drafts = tokens.tolist()
        uniforms = torch.rand(len(flat), generator=g)
        noise = torch.empty(len(live), vocab).exponential_(generator=g)
        accepted = rejection_verify(p[torch.tensor(rows)], starts, drafts, draft_probs,
                                    uniforms, noise)  # fmt: skip
        for b, tokens_b in zip(live, accepted):
            out[b] += tokens_b
    return torch.tensor([o[:length] for o in out])


@pytest.mark.parametrize("drafter", ["model", "deterministic"])
def test_rejection_sampling_matches_the_target_distribution(drafter):
    """The first two tokens' joint frequencies match p[0] x p[1] (the toy's target is
    independent across positions) within 5 standard errors of a frequency from N samples:
    sqrt(f (1 - f) / N) per cell. 5 sigma: a false alarm per cell has probability ~6e-7, so
    over the 36 + 12 cells checked the test fails by chance with probability < 3e-5, while a
    wrong rule (emitting the drafts) misses by far more than the tolerance (checked below)."""
    g = torch.Generator().manual_seed(1234)
    vocab, k, length, trials = 6, 3, 4, 20000
    p = torch.softmax(torch.randn(length + k + 1, vocab, generator=g) * 1.5, dim=-1)
    q = torch.softmax(torch.randn(length + k + 1, vocab, generator=g) * 1.5, dim=-1)
    tokens = _simulate(p, q if drafter == "model" else None, k, trials, length, g)

    def tolerance(f: torch.Tensor) -> torch.Tensor:
        return 5 * torch.sqrt(f * (1 - f) / trials) + 1e-12

    joint = torch.zeros(vocab, vocab)
    joint.index_put_((tokens[:, 0], tokens[:, 1]), torch.ones(trials), accumulate=True)
    joint /= trials
    expected = p[0][:, None] * p[1][None, :]
    assert ((joint - expected).abs() <= tolerance(expected)).all(), (joint - expected).abs().max()
    for t in (2, 3):  # later positions' marginals too
        freq = torch.bincount(tokens[:, t], minlength=vocab).float() / trials
        assert ((freq - p[t]).abs() <= tolerance(p[t])).all()
    # power: the tolerance is tight enough to tell the drafter's distribution from the target's
    if drafter == "model":
        assert ((q[0] - p[0]).abs() > tolerance(p[0])).any()
    assert math.isclose(float(joint.sum()), 1.0, rel_tol=1e-6)
