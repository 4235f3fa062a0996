"""The base of the typed runners: one execution path captured on one graph backend.

Each path is a subclass that says what its shapes hold: ``DecodeRunner`` and ``DraftRunner``
(one token per request), ``PrefillRunner`` (token buckets x request slots), ``VerifyRunner`` and
``DraftExtendRunner`` (up to k+1 tokens per request). A subclass gives its ``path`` name, the
static ``max_query_len`` of a shape, the per-request lengths of the dummy batch a shape is
captured with, and whether dispatch limits padding; everything else lives here.

Invariants:
- Owns its shapes, one ``StaticInputs`` sized at the largest shape, one graph pool and one
  max-size output buffer shared by every shape; shapes are captured largest first so smaller
  ones reuse the pool's memory.
- Knows nothing of how a backend captures: it hands ``backend.capture`` a callable over its
  static buffers and replays what comes back.
- A batch it cannot take (too many tokens or requests, too much padding, a shape that failed to
  capture) returns ``None`` from ``forward``: the caller runs it eagerly. Nothing is half-done.
  A failed capture never fails start-up: the shape stays eager, with one warning for all.
- With tensor parallelism every rank captures the same shapes in the same order and a shape's
  outcome is agreed after it (``distributed.agreement``): a shape that failed on any rank runs
  eagerly on every rank, so no rank replays a graph (with its collectives) that another runs
  eagerly; the warning names the failing rank.
- Capture runs inside the same ``forward_context`` as replay (per shape, built once), so breaks
  and split ops see the static metadata both times.
- With background or lazy capture (``live``, see live_runner.py) ``forward`` hands the batch to
  the live runner, which decides which ready graph serves it; ``capture`` is then not called.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from nanograph.arith import ceil_div
from nanograph.attention.base import AttentionBackend
from nanograph.attention.op import ForwardContext, forward_context
from nanograph.distributed.agreement import agree_failure
from nanograph.distributed.group import TensorParallel
from nanograph.graph import Backend, Graph, GraphCaptureError, new_pool
from nanograph.models.llama import CausalLM
from nanograph.progress import progress_bar
from nanograph.runners.forward_batch import ForwardBatch
from nanograph.runners.shapes import ShapeKey, choose_shape
from nanograph.runners.static_inputs import StaticInputs

if TYPE_CHECKING:
    from nanograph.runners.live_runner import LiveRunner

logger = logging.getLogger("nanograph")


@dataclass
class ShapeRecord:
    capture_s: float
    pool_bytes: int  # pool size after this shape was captured


class GraphRunner(ABC):
    path: ClassVar[str]  # the name of the path: logs, metrics, the memory report
    # prefill-like paths: padded rows cost real GEMM work, so dispatch refuses > 2x padding
    limit_padding: ClassVar[bool] = False

    def __init__(
        self,
        model: CausalLM,
        attention: AttentionBackend,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
        backend: Backend,
        shapes: list[ShapeKey],
        max_pages: int,
        page_size: int,
        device: torch.device,
        tp: TensorParallel | None = None,
    ) -> None:
        if not shapes:
            raise ValueError(f"{self.path} runner needs at least one shape")
        self.tp = tp or TensorParallel(device=device)
        self.model = model
        self.attention = attention
        self.k_caches, self.v_caches = k_caches, v_caches
        self.backend = backend
        self.shapes = sorted(shapes)
        largest_tokens = max(s.num_tokens for s in shapes)
        largest_slots = max(s.num_slots for s in shapes)
        self.static = StaticInputs(largest_tokens, largest_slots, max_pages, page_size, device)
        hidden = model.config.hidden_size
        dtype = model.model.embed_tokens.weight.dtype
        self.output = torch.empty(largest_tokens, hidden, dtype=dtype, device=device)
        self.pool = new_pool()
        self.graphs: dict[ShapeKey, Graph] = {}
        self.contexts: dict[ShapeKey, ForwardContext] = {}
        self.records: dict[ShapeKey, ShapeRecord] = {}
        self.failed: dict[ShapeKey, BaseException] = {}  # shapes that stay eager
        self._captured: list[ShapeKey] = []  # sorted, for dispatch
        self.replays = 0
        self.fallbacks = 0
        self.live: LiveRunner | None = None  # set by LiveRunner: background or lazy capture

    @abstractmethod
    def max_query_len(self, shape: ShapeKey) -> int:
        """The static bound on one request's new tokens in ``shape`` (attention's grid)."""

    @abstractmethod
    def dummy_query_lens(self, shape: ShapeKey) -> list[int]:
        """Per-request token counts of the batch ``shape`` is captured with (they fill it)."""

    # ---- capture ------------------------------------------------------------------------
    def capture(self, progress: bool = True) -> None:
        """Captures every shape, largest first. A shape that fails (out of memory, or an op
        that cannot be captured) runs eagerly; all failures are reported in one warning."""
        order = sorted(self.shapes, reverse=True)
        start = time.perf_counter()
        failed: dict[ShapeKey, BaseException] = {}
        bar = progress_bar(order, desc=f"capture {self.path} ({self.backend.name})", show=progress)
        for shape in bar:
            error = None
            try:
                self._capture_one(shape)
            except (torch.cuda.OutOfMemoryError, GraphCaptureError) as e:
                error = e
            error = agree_failure(self.tp, f"{self.path} capture of {shape}", error)
            if error is not None:
                failed[shape] = error
                self.graphs.pop(shape, None)  # captured here, failed on another rank
                self.contexts.pop(shape, None)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
        if failed:
            first = next(iter(failed.values()))
            logger.warning(
                "%s graphs: %d of %d shapes could not be captured and run eagerly (%s). "
                "First error: %s: %s",
                self.path, len(failed), len(order), ", ".join(map(str, failed)),
                type(first).__name__, first,
            )  # fmt: skip
        self.failed = failed
        self._captured = sorted(self.graphs)
        logger.info(
            "%s graphs: %d shapes on %s in %.1f s, pool %.0f MiB",
            self.path, len(self.graphs), self.backend.name, time.perf_counter() - start,
            self.pool_bytes() / 2**20,
        )  # fmt: skip

    def _capture_one(self, shape: ShapeKey) -> None:
        self.static.copy_from(self._dummy_batch(shape), shape)
        ctx = ForwardContext(
            self.attention,
            self.static.metadata(shape, self.max_query_len(shape)),
            self.k_caches,
            self.v_caches,
        )
        t0 = time.perf_counter()
        with forward_context(ctx), torch.inference_mode():
            graph, _ = self.backend.capture(self._graph_fn(shape), pool=self.pool)
        self.graphs[shape], self.contexts[shape] = graph, ctx
        self.records[shape] = ShapeRecord(time.perf_counter() - t0, graph.stats.pool_bytes)
        logger.debug(
            "%s graph %s: %.3f s, pool %.1f MiB: %r", self.path, shape,
            self.records[shape].capture_s, self.records[shape].pool_bytes / 2**20, graph,
        )  # fmt: skip

    def _graph_fn(self, shape: ShapeKey) -> Callable[[], torch.Tensor]:
        """What a shape's graph holds: one forward of the model over the static inputs, its
        final hidden states written into the runner's output buffer."""
        n = shape.num_tokens
        ids, positions, out = self.static.input_ids[:n], self.static.positions[:n], self.output[:n]

        def forward() -> torch.Tensor:
            out.copy_(self.model(ids, positions))
            return out

        return forward

    def _dummy_batch(self, shape: ShapeKey) -> ForwardBatch:
        """A batch that fills ``shape`` and writes no KV (slot -1), reading the scratch page."""
        page = self.static.page_size
        per_request = self.dummy_query_lens(shape)
        tokens = sum(per_request)
        return ForwardBatch(
            input_ids=[0] * tokens,
            positions=[0] * tokens,
            seq_lens=per_request,
            query_lens=per_request,
            page_tables=[[0] * ceil_div(q, page) for q in per_request],
            slot_mapping=[-1] * tokens,
            sample_rows=[],
            page_size=page,
        )

    def pool_bytes(self) -> int:
        return self.pool.reserved_bytes() if self.graphs else 0

    # ---- replay -------------------------------------------------------------------------
    def dispatch(self, batch: ForwardBatch) -> ShapeKey | None:
        if batch.max_pages > self.static.max_pages:
            return None
        # only captured shapes: a batch whose bucket failed to capture takes the next one up
        shape = choose_shape(
            self._captured, batch.num_tokens, batch.num_requests,
            limit_padding=self.limit_padding,
        )  # fmt: skip
        # the attention grid was captured for at most max_query_len new tokens per request:
        # past it, the smallest shape whose bound holds (draft-extend's one-token shapes sit
        # among its k+1-token ones), else none
        longest = max(batch.query_lens)
        if shape is not None and longest > self.max_query_len(shape):
            holding = [s for s in self._captured if self.max_query_len(s) >= longest]
            shape = choose_shape(holding, batch.num_tokens, batch.num_requests,
                                 limit_padding=self.limit_padding)  # fmt: skip
        return shape

    @torch.inference_mode()
    def forward(
        self, batch: ForwardBatch, in_flight: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """Final hidden states of the batch's real rows, or None if no graph can take it.
        ``in_flight``: the sampled tokens of the step still running, for ``future_rows``."""
        if self.live is not None:
            return self.live.forward(batch, in_flight)
        shape = self.dispatch(batch)
        if shape is None:
            self.fallbacks += 1
            return None
        return self.replay(shape, batch, in_flight)

    def replay(
        self, shape: ShapeKey, batch: ForwardBatch, in_flight: torch.Tensor | None
    ) -> torch.Tensor:
        """Pads ``batch`` into the captured ``shape`` and replays its graph."""
        self.static.copy_from(batch, shape)
        batch.fill_future(self.static.input_ids, in_flight)
        with forward_context(self.contexts[shape]):
            self.graphs[shape].replay()
        self.replays += 1
        return self.output[: batch.num_tokens]

    def release(self) -> None:
        """Drops every graph and the pool (memory goes back once the caller empties the cache)."""
        self.graphs.clear()
        self.contexts.clear()
        self._captured = []
        self.pool = new_pool()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.backend.name}, shapes={len(self.graphs)}/"
            f"{len(self.shapes)}, replays={self.replays}, fallbacks={self.fallbacks})"
        )


__all__ = ["GraphRunner", "ShapeRecord"]
