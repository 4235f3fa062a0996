"""Kernel warm-up at start-up: every kernel variant a request can reach is compiled before the
engine takes requests.

Why: Triton compiles a kernel per launch configuration (tiles, split count) and dtype the first
time it sees one. Left to the first requests, a fresh machine paid seconds (bf16) to minutes
(float32) of compilation on a request's path. Batch-dependent integers are not specialized
(``do_not_specialize``), so what remains is the finite set of configurations the attention
backend reports; each is launched once through the model's own eager forward (so each variant
is compiled with the very arguments a request passes), and the same forwards compile the fused
norm, rope and GEMV kernels. Compiled kernels land in Triton's disk cache, so later start-ups
on the same machine load them instead of compiling.

It runs after graph capture, which compiled the variants its graphs hold, so it compiles only
the rest (the shapes eager fallbacks can reach).

Invariant: the warm-up reads only the scratch page 0 and writes no KV (every slot is -1).
"""

from __future__ import annotations

import contextlib
import time

import torch

from nanograph.arith import ceil_div
from nanograph.runners.forward_batch import ForwardBatch
from nanograph.runners.model_runner import ModelRunner


def warm_up_kernels(runner: ModelRunner, page_size: int, progress: bool = False) -> float:
    """Runs one eager forward (and its logits) per attention launch variant, plus a plain
    batch-1 decode; returns the seconds it took."""
    start = time.perf_counter()
    config = runner.model.config
    dtype = runner.model.model.embed_tokens.weight.dtype
    variants = runner.attention.launch_variants(
        config.num_attention_heads, config.num_key_value_heads, config.head_dim, runner.device,
        dtype,
    )  # fmt: skip
    variants = [(1, contextlib.nullcontext()), *variants]
    if progress:
        from tqdm import tqdm

        variants = tqdm(variants, desc="compiling kernels", unit="variant", leave=False)
    for tokens, selected in variants:
        with selected:
            runner.forward(scratch_batch(tokens, page_size))
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
    return time.perf_counter() - start


def scratch_batch(tokens: int, page_size: int) -> ForwardBatch:
    """One request of ``tokens`` tokens over the scratch page, writing no KV."""
    return ForwardBatch(
        input_ids=[0] * tokens, positions=list(range(tokens)), seq_lens=[tokens],
        query_lens=[tokens], page_tables=[[0] * ceil_div(tokens, page_size)],
        slot_mapping=[-1] * tokens, sample_rows=[tokens - 1], page_size=page_size,
    )  # fmt: skip
