"""Workloads of ``nanograph bench serve``: token-id prompts with a fixed output length each.

Prompts are lists of token ids drawn uniformly below ``vocab_size`` (default 20,000: inside every
preset's vocabulary), sent to ``/v1/completions`` with ``ignore_eos`` so each request produces
exactly its output length. Token ids need no tokenizer, so dummy-weight models and any
OpenAI-compatible engine (vLLM, SGLang) get identical requests.

- ``random``: input and output lengths uniform in ``[len * (1 - range_ratio), len * (1 +
  range_ratio)]`` (vLLM's ``--random-range-ratio``; 0 = every request the same).
- ``sharegpt``: a synthetic stand-in for ShareGPT conversations (no download): input and output
  lengths are log-normal, a short median with a long tail, clipped to ``[4, max_input_len]`` and
  ``[4, max_output_len]``. The parameters below were chosen to resemble the shape of ShareGPT's
  first-turn lengths (most prompts short, a few thousand-token ones; replies of a few hundred
  tokens), not fitted to the dataset: compare runs of this workload with each other, not with
  published ShareGPT numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# log-normal lengths: median exp(mu) tokens, spread sigma (natural log)
SHAREGPT_INPUT_MEDIAN, SHAREGPT_INPUT_SIGMA = 160, 1.1
SHAREGPT_OUTPUT_MEDIAN, SHAREGPT_OUTPUT_SIGMA = 180, 0.9
MIN_LEN = 4


@dataclass(frozen=True)
class Workload:
    dataset: str  # "random" | "sharegpt"
    input_len: int = 1024
    output_len: int = 256
    range_ratio: float = 0.0
    max_input_len: int = 2048
    max_output_len: int = 1024
    vocab_size: int = 20000

    def describe(self) -> dict:
        if self.dataset == "random":
            return {
                "dataset": "random",
                "input_len": self.input_len,
                "output_len": self.output_len,
                "range_ratio": self.range_ratio,
                "vocab_size": self.vocab_size,
            }
        return {
            "dataset": "sharegpt (synthetic, log-normal)",
            "input_median": SHAREGPT_INPUT_MEDIAN,
            "input_sigma": SHAREGPT_INPUT_SIGMA,
            "output_median": SHAREGPT_OUTPUT_MEDIAN,
            "output_sigma": SHAREGPT_OUTPUT_SIGMA,
            "clip_input": [MIN_LEN, self.max_input_len],
            "clip_output": [MIN_LEN, self.max_output_len],
            "vocab_size": self.vocab_size,
        }

    def requests(self, n: int, seed: int) -> list[tuple[list[int], int]]:
        """``n`` (prompt token ids, output length) pairs; the same for the same seed."""
        rng = np.random.default_rng(seed)
        if self.dataset == "random":
            inputs = _uniform(rng, self.input_len, self.range_ratio, n)
            outputs = _uniform(rng, self.output_len, self.range_ratio, n)
        elif self.dataset == "sharegpt":
            inputs = _lognormal(
                rng, SHAREGPT_INPUT_MEDIAN, SHAREGPT_INPUT_SIGMA, self.max_input_len, n
            )
            outputs = _lognormal(
                rng, SHAREGPT_OUTPUT_MEDIAN, SHAREGPT_OUTPUT_SIGMA, self.max_output_len, n
            )
        else:
            raise ValueError(f"unknown dataset {self.dataset!r}: random or sharegpt")
        return [
            (rng.integers(0, self.vocab_size, int(i)).tolist(), int(o))
            for i, o in zip(inputs, outputs)
        ]


def _uniform(rng: np.random.Generator, length: int, ratio: float, n: int) -> np.ndarray:
    low = max(1, int(length * (1 - ratio)))
    high = max(low, int(length * (1 + ratio)))
    return rng.integers(low, high + 1, n)


def _lognormal(rng: np.random.Generator, median: int, sigma: float, cap: int, n: int):
    lengths = np.rint(rng.lognormal(np.log(median), sigma, n)).astype(int)
    return np.clip(lengths, MIN_LEN, max(MIN_LEN, cap))
