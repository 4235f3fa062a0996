"""Verification of drafts against the target: greedy acceptance and rejection sampling.

Layout: request b verifies ``drafts[b]`` (r_b tokens, possibly none) with r_b + 1 target rows
starting at ``starts[b]``: row ``starts[b] + i`` is the target's distribution for the token
after draft i-1 (row ``starts[b]`` follows the request's last accepted token).

Invariants:
- Each request gets ``a + 1`` tokens: its first ``a`` drafts (those accepted) and one token of
  the target's (the correction at the first rejection, or a bonus token after all r_b).
- Greedy: a draft is accepted iff it equals the target's argmax, so the tokens equal what
  plain greedy decoding produces one step at a time.
- Rejection sampling (Leviathan et al. 2023, Chen et al. 2023): draft d_i, drawn from the
  drafter's q_i, is accepted with probability min(1, p_i(d_i) / q_i(d_i)); at the first
  rejection the token is drawn from normalize(max(p_i - q_i, 0)); after r_b acceptances from
  p_{r_b}. The output distribution is exactly the target's. A deterministic drafter (n-gram)
  is the case q_i = one-hot(d_i); a greedy request is the case p_i = one-hot(argmax), which
  reduces to the greedy rule.
- Pure functions of their inputs: the random draws come in as tensors (the sampler owns the
  generators and the per-request seeds).
"""

from __future__ import annotations

import torch

from nanograph.layers import ops


def accepted_prefix(drafts: list[int], target: list[int]) -> int:
    """How many leading drafts equal the target's tokens (``target[i]`` follows draft i-1)."""
    a = 0
    while a < len(drafts) and drafts[a] == target[a]:
        a += 1
    return a


def greedy_verify(
    target_tokens: list[int], starts: list[int], drafts: list[list[int]]
) -> list[list[int]]:
    """Accepted tokens per request from the target's argmax tokens of every verify row."""
    out = []
    for start, draft in zip(starts, drafts, strict=True):
        rows = target_tokens[start : start + len(draft) + 1]
        out.append(rows[: accepted_prefix(draft, rows) + 1])
    return out


def rejection_verify(
    target_probs: torch.Tensor,
    starts: list[int],
    drafts: list[list[int]],
    draft_probs: torch.Tensor | None,
    uniforms: torch.Tensor,
    exponentials: torch.Tensor,
) -> list[list[int]]:
    """Accepted tokens per request by speculative rejection sampling.

    ``target_probs``: [rows, V], the target's sampling distribution of every verify row.
    ``draft_probs``: [D, V] for the D drafts in request-major order, or None when each draft
    was chosen deterministically (q = one-hot). ``uniforms``: [D] in [0, 1), one per draft.
    ``exponentials``: [len(drafts), V] Exp(1) noise for each request's final token (drawn by
    the exponential race: argmax of p / E is a sample of p).
    """
    device = target_probs.device
    flat = [t for d in drafts for t in d]
    rows = [s + i for s, d in zip(starts, drafts, strict=True) for i in range(len(d))]
    accept: list[bool] = []
    if flat:
        tokens = torch.tensor(flat, dtype=torch.long, device=device)
        p = target_probs[torch.tensor(rows, dtype=torch.long, device=device), tokens]
        q = draft_probs.gather(1, tokens[:, None])[:, 0] if draft_probs is not None else 1.0
        accept = (uniforms * q < p).tolist()  # u < p / q without dividing by a zero q
    counts, offset = [], 0
    for d in drafts:
        a = 0
        while a < len(d) and accept[offset + a]:
            a += 1
        counts.append(a)
        offset += len(d)
    final_rows = torch.tensor([s + a for s, a in zip(starts, counts)], device=device)
    final = target_probs[final_rows]
    residual = final.clone()
    offset = 0
    for b, (d, a) in enumerate(zip(drafts, counts)):
        if a < len(d):  # rejected at draft a: draw from max(p - q, 0)
            if draft_probs is not None:
                residual[b] -= draft_probs[offset + a]
            else:
                residual[b, d[a]] -= 1.0
        offset += len(d)
    residual.clamp_(min=0)
    # p - q vanishes only when p == q, where the rejection had probability 0: guard rounding
    empty = residual.sum(dim=-1, keepdim=True) <= 0
    residual = torch.where(empty, final, residual)
    last = ops.argmax(residual / exponentials).tolist()
    return [d[:a] + [t] for d, a, t in zip(drafts, counts, last)]


__all__ = ["accepted_prefix", "greedy_verify", "rejection_verify"]
