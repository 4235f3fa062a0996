"""Runs a ``ForwardBatch`` through the model and returns the logits of its sampled rows.

A batch goes to the graph runner of its path: the caller names it (``"verify"``,
``"draft_extend"``, ...) or it follows from the batch (a decode batch to ``"decode"``, anything
else to ``"prefill"``). When the path has no runner or its runner cannot take the batch, the
same model runs eagerly through the same attention context. Which backend a runner uses is
invisible here. ``forward_counts`` says how many forwards of each path replayed a graph and
how many ran eagerly (the server's metrics).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from nanograph.attention.base import AttentionBackend
from nanograph.attention.op import ForwardContext, forward_context
from nanograph.models.llama import CausalLM
from nanograph.runners.attention_inputs import eager_inputs
from nanograph.runners.forward_batch import ForwardBatch
from nanograph.runners.graph_runner import GraphRunner


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        attention: AttentionBackend,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
        device: torch.device,
        graph_runners: list[GraphRunner] | None = None,  # at most one per path
    ) -> None:
        self.model = model
        self.attention = attention
        self.k_caches, self.v_caches = k_caches, v_caches
        self.device = device
        self.graph_runners = {r.path: r for r in graph_runners or []}
        self.eager_forwards = {"decode": 0, "prefill": 0} | dict.fromkeys(self.graph_runners, 0)

    @torch.inference_mode()
    def forward(
        self, batch: ForwardBatch, in_flight: torch.Tensor | None = None, path: str | None = None
    ) -> torch.Tensor:
        """Logits (float32) of ``batch.sample_rows``, shape [len(sample_rows), vocab].
        ``in_flight``: the sampled tokens of the step still running, for ``future_rows``;
        ``path``: the runner to try (default: by the batch's mode)."""
        path = path or ("decode" if batch.mode == "decode" else "prefill")
        runner = self.graph_runners.get(path)
        hidden = runner.forward(batch, in_flight) if runner is not None else None
        if hidden is None:
            self.eager_forwards[path] = self.eager_forwards.get(path, 0) + 1
            hidden = self.eager_forward(batch, in_flight)
        rows = torch.tensor(batch.sample_rows, dtype=torch.long).to(self.device, non_blocking=True)
        return self.model.compute_logits(hidden[rows])

    @contextlib.contextmanager
    def graphs_off(self) -> Iterator[None]:
        """Every forward inside runs eagerly, whatever graphs the runner holds: a bench times
        a graph backend and eager on one engine, alternating, so both see the same host at the
        same moment (``bench prefill --eager-beside``)."""
        held, self.graph_runners = self.graph_runners, {}
        try:
            yield
        finally:
            self.graph_runners = held

    def forward_counts(self) -> dict[str, dict[str, int]]:
        """Per path ("decode", "prefill", ...): forwards that replayed a graph and that ran
        eagerly."""
        return {
            path: {
                "graph": runner.replays if (runner := self.graph_runners.get(path)) else 0,
                "eager": eager,
            }
            for path, eager in self.eager_forwards.items()
        }

    @torch.inference_mode()
    def eager_forward(
        self, batch: ForwardBatch, in_flight: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Final hidden states of every row, without graphs."""
        ids, pos, meta = eager_inputs(batch, self.device)
        batch.fill_future(ids, in_flight)
        with forward_context(ForwardContext(self.attention, meta, self.k_caches, self.v_caches)):
            return self.model(ids, pos)
