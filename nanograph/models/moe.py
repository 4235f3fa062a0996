"""The mixture-of-experts layer of Qwen3-MoE and gpt-oss, with two expert implementations.

Invariants:
- One module for both families: a router (``Linear``, with a bias for gpt-oss), then routing
  and experts through the chosen ``MoEBackend``; routing is on the device either way (``route``:
  torch ops with static shapes; the triton backend's one-kernel ``kernels.moe.route``).
  Weights are ``w13 [E, 2I, H]`` (gate/up), ``w2 [E, H, I]`` and, for gpt-oss, biases; the
  layout is ``kernels.moe``'s (gpt-oss keeps its checkpoint's interleaved gate/up columns, so
  its tensors load as transposed views of ours, no copy). With ``mxfp4_experts`` (gpt-oss)
  ``w13`` / ``w2`` hold MXFP4 codes ``[E, N, K / 2]`` uint8 and ``w13_scales`` / ``w2_scales``
  their scales ``[E, N, K / 32]`` (``kernels.moe``'s layout, the checkpoint's pairs as they
  are); only the triton backend runs them. Each backend makes its dense experts
  (``MoEBackend.empty_experts``): the native one's are those shapes as transposed views of
  ``[E, H, 2I]`` / ``[E, I, H]`` memory, so its per-expert products (rows times a weight
  transposed) are NN GEMMs (on the H100 8% less GPU time over gpt-oss-20b's two products than
  the TN ones of the triton layout).
- ``triton`` is graph-safe (no host reads, static shapes): captured inline by every graph
  backend. ``torch_native`` is the plain per-expert loop: the host reads how many tokens each
  expert got, so it is a ``split_op``: an eager break under ``breakable``, a split point under
  ``tc_piecewise``; ``full`` graphs cannot hold it (the engine refuses that combination).
- The native MoE's split op holds only the per-expert products (and the gate/up bias and
  activation between them, each one launch over all rows; the down bias is added after it, in
  the graph): sorting the pairs by expert before it and combining them after it have static
  shapes, so graphs capture them. It writes into an output allocated before it (inside the
  graph), like attention, so a break has nothing to copy out.
- The fused batch-1 decode (``forward_add``, triton experts on one rank) takes the
  post-attention norm in the router's GEMV (which writes the normalised row for the experts)
  and adds the experts' sum into the residual stream in the down projection's kernel.
"""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod

import torch
from torch import nn

from nanograph.distributed.collectives import all_reduce
from nanograph.distributed.group import TensorParallel
from nanograph.graph import split_op
from nanograph.kernels import reference
from nanograph.layers import ops
from nanograph.models.config import ModelConfig

MOE_BACKENDS = ("auto", "triton", "torch_native")


class MoEBackend(ABC):
    """How a MoE layer routes and runs its experts."""

    name: str
    #: launches the same kernels with the same shapes for any routing (no host reads)
    graph_safe: bool

    @abstractmethod
    def forward(self, layer: MoE, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """x [T, H] and its router logits [T, E] -> the layer's output [T, H]."""

    def warmup_token_counts(self, layer: MoE, dtype: torch.dtype, max_tokens: int) -> list[int]:
        """Token counts of forwards (up to ``max_tokens``) that together compile every kernel
        variant this backend's experts can launch; [] when it compiles none."""
        return []

    def empty_experts(self, experts: int, n: int, k: int) -> nn.Parameter:
        """A dense expert weight ``[E, N, K]`` (uninitialised), in the memory layout this
        backend's products read: contiguous, as ``kernels.moe`` reads it."""
        return nn.Parameter(torch.empty(experts, n, k))


class TritonMoE(MoEBackend):
    name = "triton"
    graph_safe = True

    def forward(self, layer: MoE, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)  # every row is written
        self._experts(layer, x, logits, out, accumulate=False)
        return out

    def forward_add(
        self, layer: MoE, x: torch.Tensor, logits: torch.Tensor, stream: torch.Tensor
    ) -> None:
        """``stream += experts(x)`` for a one-row ``x`` (the fused decode's residual stream,
        added by the down projection's kernel: no separate add)."""
        self._experts(layer, x, logits, stream, accumulate=True)

    def warmup_token_counts(self, layer: MoE, dtype: torch.dtype, max_tokens: int) -> list[int]:
        from nanograph.kernels import moe as kernels  # imports triton: only when used

        return kernels.tile_token_counts(layer.w13, layer.w13_scales, layer.top_k, dtype,
                                         max_tokens)  # fmt: skip

    @staticmethod
    def _experts(
        layer: MoE, x: torch.Tensor, logits: torch.Tensor, out: torch.Tensor, accumulate: bool
    ) -> None:
        args = (x, logits, layer.w13, layer.w2, layer.w13_bias, layer.w2_bias, layer.top_k,
                layer.softmax_first, layer.renormalize, layer.activation_id, layer.alpha,
                layer.limit, out, accumulate, layer.w13_scales, layer.w2_scales)  # fmt: skip
        (_fused_moe_op if torch.compiler.is_compiling() else _fused_moe)(*args)


class TorchNativeMoE(MoEBackend):
    name = "torch_native"
    graph_safe = False

    def forward(self, layer: MoE, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        weights, ids = route(logits, layer.top_k, layer.softmax_first, layer.renormalize)
        return native_moe(
            x, layer.w13, layer.w2, layer.w13_bias, layer.w2_bias, weights, ids,
            layer.activation_id, layer.alpha, layer.limit, layer.views_key,
        )  # fmt: skip

    def empty_experts(self, experts: int, n: int, k: int) -> nn.Parameter:
        """``[E, N, K]`` as a transposed view of ``[E, K, N]`` memory: the loop multiplies each
        expert's rows by its weight transposed, which is then contiguous (NN products)."""
        return nn.Parameter(torch.empty(experts, k, n).transpose(1, 2))


def get_moe_backend(name: str, device: torch.device) -> MoEBackend:
    """``auto`` is ``triton`` on CUDA and ``torch_native`` elsewhere (the interpreter is slow)."""
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch_native"
    if name == "triton":  # on CPU only under TRITON_INTERPRET=1 (EngineConfig checks it)
        return TritonMoE()
    if name == "torch_native":
        return TorchNativeMoE()
    raise ValueError(f"unknown MoE backend {name!r}; choose one of {', '.join(MOE_BACKENDS)}")


_ACTIVATIONS = ("silu", "clamped_swiglu")


def _fused_moe(
    x: torch.Tensor, logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
    b13: torch.Tensor | None, b2: torch.Tensor | None, top_k: int, softmax_first: bool,
    renormalize: bool, activation: int, alpha: float, limit: float, out: torch.Tensor,
    accumulate: bool = False, w13_scales: torch.Tensor | None = None,
    w2_scales: torch.Tensor | None = None,
) -> None:  # fmt: skip
    from nanograph.kernels import moe as kernels  # imports triton: only when used

    weights, ids = kernels.route(logits, top_k, softmax_first, renormalize)
    kernels.fused_experts(x, w13, w2, b13, b2, weights, ids, _ACTIVATIONS[activation], alpha,
                          limit, out=out, accumulate=accumulate, w13_scales=w13_scales,
                          w2_scales=w2_scales)  # fmt: skip


# What dynamo records while tracing (tc_piecewise): one opaque node inside a compiled piece.
_fused_moe_op = torch.library.custom_op("nanograph::fused_moe", mutates_args=("out",))(_fused_moe)
_fused_moe_op.register_fake(lambda *args: None)


def native_moe(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, b13: torch.Tensor | None,
    b2: torch.Tensor | None, weights: torch.Tensor, ids: torch.Tensor, activation: int,
    alpha: float, limit: float, views_key: int = -1,
) -> torch.Tensor:  # fmt: skip
    """Each expert's tokens through that expert, one expert at a time (``views_key``: the
    layer's, from ``expert_views_key``, keeps the experts' weight views from one call to the
    next; -1 makes them every call). Only the loop, whose
    shapes follow the routing, is the split op; the work around it has the same shapes for any
    routing, so graphs capture it: the (token, expert) pairs sorted by expert, each expert's
    end among them, the rows gathered in that order, and each row's gate/up bias, before the
    loop; the down bias added, scaled, put back in pair order and summed over k after it. On
    CUDA the loop is host-bound, so every launch the break leaves to a graph shortens it. The
    biases are added to the rounded products (as transformers' gpt-oss does), not inside
    them: a product with a bias is cuBLASLt's, whose every call plans afresh on the host."""
    tokens, top_k = ids.shape
    expert_ids, order = torch.sort(ids.reshape(-1), stable=True)
    experts = torch.arange(w13.shape[0], device=ids.device)
    # each expert's count of sorted pairs, from its end among them (bincount would read its
    # max on the host)
    ends = torch.searchsorted(expert_ids, experts, right=True)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    rows = x[order // top_k]
    gate_up_bias = None if b13 is None else b13[expert_ids]
    down = torch.empty_like(rows)  # allocated here, inside the graph: the break only fills it
    native_experts(rows, counts, w13, w2, gate_up_bias, activation, alpha, limit, views_key, down)
    if b2 is not None:
        down = down + b2[expert_ids]
    scales = weights.reshape(-1)[order].to(x.dtype)[:, None]
    # back to pair order, then a sum over k: deterministic (an index_add_ of duplicate token
    # rows would add in any order on CUDA)
    by_pair = torch.empty_like(down).index_copy_(0, order, down * scales)
    return by_pair.view(tokens, top_k, -1).sum(dim=1, dtype=torch.float32).to(x.dtype)


@split_op("nanograph::native_experts", fake=lambda *args: None, mutates_args=("out",))
def native_experts(
    rows: torch.Tensor, counts: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
    gate_up_bias: torch.Tensor | None, activation: int, alpha: float, limit: float,
    views_key: int, out: torch.Tensor,
) -> None:  # fmt: skip
    """out = the rows, sorted by expert, through their experts (the down bias left to the
    caller): expert e has the next ``counts[e]`` rows, which the host reads (a sync), so the
    shapes follow the routing; ``gate_up_bias``: each row's expert's gate/up bias. Each
    expert's products write its contiguous slice of one buffer, and the bias and activation
    run once over all of them (elementwise, so no row sees another): two launches an expert,
    where a product, the activation and a copy an expert took five (SwiGLU) to eleven
    (gpt-oss' clamped one). Only experts with rows are split out: with few tokens most have
    none."""
    live = [(expert, count) for expert, count in enumerate(counts.tolist()) if count]
    experts, sizes = [e for e, _ in live], [c for _, c in live]
    gate_up = _products(rows, _expert_views(views_key, 0, w13), experts, sizes)
    if gate_up_bias is not None:
        gate_up += gate_up_bias
    act = reference.moe_activation(gate_up, _ACTIVATIONS[activation], alpha, limit)
    _products(act, _expert_views(views_key, 1, w2), experts, sizes, out=out)


# The native loop's per-expert weight views, made on a layer's first forward and dropped with
# the layer (``expert_views_key``): unbinding them on every forward cost the break ~0.1 ms a
# product on the CPU machine's host (128 experts), where each of its launches costs ~5 us.
# The split op's schema takes tensors and numbers, not the layer, so it finds them by a key.
_EXPERT_VIEWS: dict[tuple[int, int], tuple] = {}


def expert_views_key(layer: nn.Module) -> int:
    """A key for ``layer``'s expert views, whose cache entries go when the layer does."""
    key = id(layer)
    weakref.finalize(layer, _forget_views, key)
    return key


def _forget_views(key: int) -> None:
    for product in (0, 1):
        _EXPERT_VIEWS.pop((key, product), None)


def _expert_views(key: int, product: int, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each expert's weight, transposed, as views: kept under ``key`` (when it is not -1)
    while the weights are the same tensor in the same memory."""
    stamp = (w.data_ptr(), w.shape, w.dtype)
    cached = _EXPERT_VIEWS.get((key, product))
    if cached is not None and cached[0] == stamp:
        return cached[1]
    views = w.transpose(1, 2).unbind(0)
    if key != -1:
        _EXPERT_VIEWS[(key, product)] = (stamp, views)
    return views


def _products(
    x: torch.Tensor, weights: tuple[torch.Tensor, ...], ids: list[int], sizes: list[int],
    out: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """rows @ w[e].T for each expert ``ids[i]``'s ``sizes[i]`` consecutive rows of x (the
    sizes cover x), each written into its slice of one output (``out``, else a new one;
    ``mm`` with ``out=``: no copy); ``weights``: each w[e] transposed (``_expert_views``).
    The rows' and the output's per-expert views come from one ``split`` each: on CUDA this
    loop is bound by the host's per-op cost, and indexing every view separately took ~40% of
    it (a ``.t()`` an expert ~20% of the rest, on the CPU machine)."""
    if out is None:
        out = x.new_empty(x.shape[0], weights[0].shape[1])
    for expert, xs, outs in zip(ids, x.split(sizes), out.split(sizes)):
        torch.mm(xs, weights[expert], out=outs)
    return out


def route(
    logits: torch.Tensor, top_k: int, softmax_first: bool, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (weights [T, K] in the logits' dtype, expert ids [T, K] int64).

    ``softmax_first`` (Qwen3-MoE): softmax over all experts in fp32, top-k, optionally
    renormalised to sum to 1. Otherwise (gpt-oss): top-k of the logits, softmax over the k.
    Device-side torch ops with static shapes: graph-safe, no host reads.
    """
    if softmax_first:
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, top_k, dim=-1)
        if renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(logits.dtype), ids
    values, ids = torch.topk(logits, top_k, dim=-1)
    return torch.softmax(values, dim=-1, dtype=values.dtype), ids


class MoE(nn.Module):
    """Router + experts of one layer (every layer of a MoE model has one)."""

    def __init__(
        self, config: ModelConfig, backend: MoEBackend, tp: TensorParallel | None = None
    ) -> None:
        super().__init__()
        self.tp = tp  # experts hold this rank's share of their width; outputs are all-reduced
        num_experts, hidden = config.num_experts, config.hidden_size
        inter = config.expert_intermediate_size
        gpt_oss = config.moe_activation == "clamped_swiglu"
        self.backend = backend
        self.views_key = -1 if backend.graph_safe else expert_views_key(self)
        self.top_k = config.num_experts_per_tok
        self.softmax_first = not gpt_oss
        self.renormalize = config.norm_topk_prob
        self.activation_id = _ACTIVATIONS.index(config.moe_activation)
        self.alpha, self.limit = config.swiglu_alpha, config.swiglu_limit
        self.router = nn.Linear(hidden, num_experts, bias=gpt_oss)
        if config.mxfp4_experts:
            if not isinstance(backend, TritonMoE):
                raise ValueError(
                    f"MXFP4 experts run on the triton MoE backend, not {backend.name}: use "
                    "--moe-backend triton, or drop --quantization mxfp4 to dequantize them"
                )

            def packed(*shape: int) -> nn.Parameter:
                return nn.Parameter(torch.empty(*shape, dtype=torch.uint8), requires_grad=False)

            self.w13 = packed(num_experts, 2 * inter, hidden // 2)
            self.w2 = packed(num_experts, hidden, inter // 2)
            self.w13_scales = packed(num_experts, 2 * inter, hidden // 32)
            self.w2_scales = packed(num_experts, hidden, inter // 32)
        else:
            self.w13 = backend.empty_experts(num_experts, 2 * inter, hidden)
            self.w2 = backend.empty_experts(num_experts, hidden, inter)
            self.w13_scales = self.w2_scales = None
        self.w13_bias = nn.Parameter(torch.empty(num_experts, 2 * inter)) if gpt_oss else None
        self.w2_bias = nn.Parameter(torch.empty(num_experts, hidden)) if gpt_oss else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = ops.linear(x, self.router.weight, self.router.bias)
        return all_reduce(self.backend.forward(self, x, logits), self.tp)

    @property
    def adds_into_stream(self) -> bool:
        """Whether ``forward_add`` can run: the triton experts on one rank."""
        return isinstance(self.backend, TritonMoE) and (self.tp is None or not self.tp.enabled)

    def forward_add(
        self, stream: torch.Tensor, norm_weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """``stream += self(rmsnorm(stream, norm_weight, eps))`` in place for one row (the fused
        decode); returns ``stream``. The router's GEMV takes the norm in its prologue and
        writes the normalised row the experts read, so no norm kernel runs before it."""
        x = torch.empty_like(stream)
        logits = ops.norm_linear(stream, norm_weight, eps, self.router.weight,
                                 bias=self.router.bias, normed_out=x)  # fmt: skip
        self.backend.forward_add(self, x, logits, stream)
        return stream
