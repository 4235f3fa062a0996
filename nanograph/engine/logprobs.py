"""Log-probabilities of output tokens (OpenAI's ``logprobs``), computed beside sampling.

What they are: the log-softmax of the model's logits at the position that produced a token,
before temperature, top-k/p or min-p (vLLM's default, "raw" log-probabilities): the model's
own belief, the same whatever sampling settings a request uses. Greedy tokens are the top one.

Invariants:
- A step computes them only when one of its sampled requests asks (``SamplingParams.logprobs``
  not None); otherwise sampling is exactly as without this module.
- One packed float32 row per sampled row: the chosen token's log-probability and its rank
  (1 + the tokens more likely), then the ``MAX_LOGPROBS`` largest log-probabilities, then
  their token ids (exact in float32 below 2**24). A fixed width lets rows of different steps
  and of rows run alone concatenate.
- The host reads the rows with the step's tokens (after the same event); a request keeps one
  ``TokenLogprob`` per output token, in order, cut with its tokens.
- Prompt tokens (vLLM's ``prompt_logprobs``) are scored the same way, from the logits of the
  rows before them, in the forwards that compute them (``Engine._forward_and_sample``): their
  packed rows travel beside the sampled ones.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from nanograph.engine.sampling_params import MAX_LOGPROBS

WIDTH = 2 + 2 * MAX_LOGPROBS
_TOP = 2  # where the top log-probabilities start in a packed row; their ids at _TOP + MAX


class TokenLogprob(NamedTuple):
    logprob: float  # of the token
    top: tuple[tuple[int, float], ...]  # (token id, log-probability), most likely first
    rank: int = 1  # the token's among the vocabulary: 1 + the tokens more likely (vLLM's)


def packed(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``[rows, WIDTH]`` float32 for ``logits [rows, vocab]`` and the sampled ``tokens [rows]``."""
    values = torch.log_softmax(logits.float(), dim=-1)
    chosen = values.gather(1, tokens.view(-1, 1).long())
    top = values.topk(min(MAX_LOGPROBS, values.shape[-1]), dim=-1)
    out = torch.zeros(values.shape[0], WIDTH, dtype=torch.float32, device=values.device)
    k = top.values.shape[-1]
    out[:, :1] = chosen
    out[:, 1:2] = 1 + (values > chosen).sum(-1, keepdim=True)
    out[:, _TOP : _TOP + k] = top.values
    out[:, _TOP + MAX_LOGPROBS : _TOP + MAX_LOGPROBS + k] = top.indices.float()
    return out


def unpack(row: list[float], count: int) -> TokenLogprob:
    """A packed row's token and its ``count`` most likely alternatives."""
    ids = row[_TOP + MAX_LOGPROBS : _TOP + MAX_LOGPROBS + count]
    top = tuple(zip(map(int, ids), row[_TOP : _TOP + count]))
    return TokenLogprob(row[0], top, int(row[1]))
