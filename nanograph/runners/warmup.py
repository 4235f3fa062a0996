"""Kernel warm-up at start-up: every kernel variant a request can reach is compiled before the
engine takes requests.

Why: Triton compiles a kernel per launch configuration (tiles, split count) and dtype the first
time it sees one. Left to the first requests, a fresh machine paid seconds (bf16) to minutes
(float32) of compilation on a request's path. Batch-dependent integers are not specialized
(``do_not_specialize``), so what remains is the finite set of configurations the attention
backend reports; each is launched once through the model's own eager forward (so each variant
is compiled with the very arguments a request passes), and the same forwards compile the fused
norm, rope and GEMV kernels. A model whose kernels pick their launch configuration from the
token count (the triton MoE's tiles) names the token counts that reach each
(``CausalLM.warmup_token_counts``), and a plain forward of each runs too. Compiled kernels
land in Triton's disk cache, so later start-ups on the same machine load them instead of
compiling.

On CUDA, ``compile_kernels`` first compiles every variant at once, right after the weights
load: the same forwards, with the attention launches only submitting their compiles to a
thread pool (kernels/launch.py: ``parallel_compiles``). Capture and ``warm_up_kernels`` then
find every variant compiled. ``warm_up_kernels`` runs after graph capture and launches every
variant once, compiling whatever the ahead pass could not (no asynchronous Triton).

Invariant: the warm-up reads only the scratch page 0 and writes no KV (every slot is -1).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from collections.abc import Iterator
from concurrent.futures import as_completed
from dataclasses import dataclass

import torch

from nanograph.arith import ceil_div
from nanograph.kernels.launch import parallel_compiles
from nanograph.layers import ops
from nanograph.runners.forward_batch import ForwardBatch
from nanograph.runners.model_runner import ModelRunner

logger = logging.getLogger("nanograph")

# threads compiling attention variants at once: the host's cores, at most the variant count
MAX_COMPILE_THREADS = 16


@dataclass(frozen=True)
class ForwardLimits:
    """The shapes a forward can take: what the warm-up and the memory plan's scratch forwards
    cover."""

    page_size: int
    max_tokens: int  # tokens in one forward: the chunk (chunked_prefill_size)
    max_query: int  # tokens one request puts into a forward: a chunk, within the context


def compile_kernels(runner: ModelRunner, limits: ForwardLimits, progress: bool = False) -> float:
    """Compiles every kernel variant the warm-up launches, the attention variants in parallel;
    returns the seconds it took. CUDA only: the forwards run, with attention outputs zeroed."""
    start = time.perf_counter()
    variants = _variants(runner, limits)
    workers = max(1, min(MAX_COMPILE_THREADS, os.cpu_count() or 1, len(variants)))
    with parallel_compiles(workers) as compiles:
        if compiles is None:
            return 0.0  # warm_up_kernels compiles them, one after another
        for tokens, selected in variants:
            with selected:
                ops.argmax(runner.forward(scratch_batch(tokens, limits)))  # greedy's pick
        if progress and compiles:
            from tqdm import tqdm

            done = as_completed(list(compiles))  # cache hits finish at once
            for _ in tqdm(done, total=len(compiles), desc="compiling kernels", unit="variant",
                          leave=False):  # fmt: skip
                pass
    torch.cuda.synchronize(runner.device)
    seconds = time.perf_counter() - start
    logger.info("compiled %d attention variants on %d threads in %.1f s", len(variants), workers,
                seconds)  # fmt: skip
    return seconds


def warm_up_kernels(runner: ModelRunner, limits: ForwardLimits, progress: bool = False) -> float:
    """Runs one eager forward (its logits and their argmax) per attention launch variant, plus
    a plain batch-1 decode and 2-token forward and the model's own token counts; returns the
    seconds it took."""
    start = time.perf_counter()
    variants = _variants(runner, limits)
    if progress:
        from tqdm import tqdm

        variants = tqdm(variants, desc="compiling kernels", unit="variant", leave=False)
    for tokens, selected in variants:
        with selected:
            ops.argmax(runner.forward(scratch_batch(tokens, limits)))  # greedy's pick
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
    return time.perf_counter() - start


def _variants(
    runner: ModelRunner, limits: ForwardLimits
) -> list[tuple[int, contextlib.AbstractContextManager]]:
    """(query tokens, a context selecting the launch) per attention variant, each in the
    unfused forward (a one-token forced launch stands for the decode of many rows, which is
    never fused), a plain batch-1 decode (the fused layer where it applies), a plain 2-token
    forward (the few-row products a verify or a small decode batch reaches, with the norms
    taken in where the fused few-row layer applies: one variant per product shape for 2 to
    FEW_ROWS rows) and a plain forward of each further token count the model names, up to a
    chunk. An attention variant whose launching query is longer than any request's can be
    (``max_query``) is chosen only for such queries: it is never launched, and left out."""
    config = runner.model.config
    dtype = runner.model.model.embed_tokens.weight.dtype
    variants = runner.attention.launch_variants(
        config.num_attention_heads, config.num_key_value_heads, config.head_dim, runner.device,
        dtype,
    )  # fmt: skip
    plain = contextlib.nullcontext()
    counts = [t for t in runner.model.warmup_token_counts(limits.max_tokens) if t > 2]
    return [(1, plain), (2, plain), *((t, plain) for t in counts),
            *((t, _unfused(c)) for t, c in variants if t <= limits.max_query)]  # fmt: skip


@contextlib.contextmanager
def _unfused(selected: contextlib.AbstractContextManager) -> Iterator[None]:
    with ops.unfused_decode(), selected:
        yield


def scratch_batch(tokens: int, limits: ForwardLimits) -> ForwardBatch:
    """A forward of ``tokens`` tokens over the scratch page, writing no KV: one request, or as
    many of ``max_query`` tokens (and a shorter last) as a forward of more tokens than one
    request can hold takes. A few tokens' logits are all computed (the LM head's few-row
    product, as a verify's), otherwise each request's last token's, as a prefill samples."""
    lengths = [min(limits.max_query, tokens - s) for s in range(0, tokens, limits.max_query)]
    ends = list(itertools.accumulate(lengths))
    sample_rows = list(range(tokens)) if tokens <= ops.FEW_ROWS else [e - 1 for e in ends]
    return ForwardBatch(
        input_ids=[0] * tokens, positions=[p for n in lengths for p in range(n)],
        seq_lens=lengths, query_lens=lengths,
        page_tables=[[0] * ceil_div(n, limits.page_size) for n in lengths],
        slot_mapping=[-1] * tokens, sample_rows=sample_rows, page_size=limits.page_size,
    )  # fmt: skip
