"""Fixtures of the GPU tests: small random Qwen3 checkpoints (a few layers keep tc_piecewise
compiles short), saved once per name and session."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch


@pytest.fixture(scope="session")
def small_qwen3(tmp_path_factory) -> Callable[..., str]:
    """``small_qwen3(name, layers=4, hidden=512, seed=0, max_positions=2048)``: the folder of a
    random Qwen3 (8 q / 4 kv heads of 64, vocabulary 4096, FFN 2 x hidden)."""
    saved: dict[tuple, str] = {}

    def make(name: str, layers: int = 4, hidden: int = 512, seed: int = 0,
             max_positions: int = 2048) -> str:  # fmt: skip
        key = (name, layers, hidden, seed, max_positions)
        if key not in saved:
            import transformers

            config = transformers.Qwen3Config(
                vocab_size=4096, hidden_size=hidden, intermediate_size=2 * hidden,
                num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4,
                head_dim=64, max_position_embeddings=max_positions, tie_word_embeddings=False,
            )  # fmt: skip
            torch.manual_seed(seed)
            path = tmp_path_factory.mktemp(name)
            transformers.Qwen3ForCausalLM(config).save_pretrained(path)
            saved[key] = str(path)
        return saved[key]

    return make
