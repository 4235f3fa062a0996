"""An engine's start-up: the model (and draft model), the KV pools, the runners, the memory plan.

Invariants:
- Memory is planned before it is spent: graph and activation memory are measured first (start-up
  capture captures each path's largest shape on a scratch pool; background/lazy capture plans a
  graph budget instead), the KV pool is sized from what is left, and only then are the graphs
  captured: capture never competes with a KV pool sized without it.
- Bad combinations (a graph backend that cannot hold the model's host-planned ops) are refused
  before the weights load.
- With a draft model, its KV pool has as many pages as the target's (one memory plan) and its
  runners (``draft``, ``draft_extend``) capture into their own pools.
- With tensor parallelism every rank runs this alike: graph shapes and the KV page count are
  agreed across ranks (``distributed.agreement``).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Iterator

import torch

from nanograph.arith import ceil_div
from nanograph.attention import get_attention_backend
from nanograph.distributed.agreement import agree_equal, agree_min, agreed
from nanograph.distributed.group import TensorParallel
from nanograph.engine.config import EngineConfig, parse_graph_memory
from nanograph.engine.kv_cache import KVCache, bytes_per_token
from nanograph.engine.memory import MemoryReport
from nanograph.engine.speculative import load_draft_model
from nanograph.loader.errors import ModelLoadError
from nanograph.models import build_model, get_moe_backend
from nanograph.runners.decode_runner import DecodeRunner, DraftRunner
from nanograph.runners.graph_budget import GraphBudget
from nanograph.runners.graph_runner import GraphRunner
from nanograph.runners.live_capture import LiveCapture
from nanograph.runners.model_runner import ModelRunner
from nanograph.runners.prefill_runner import PrefillRunner
from nanograph.runners.selection import host_planned_ops, make_backend, resolve_backend
from nanograph.runners.shapes import (
    ShapeKey,
    decode_batch_sizes,
    decode_shapes,
    prefill_shapes,
    prefill_token_buckets,
    verify_shapes,
)
from nanograph.runners.verify_runner import DraftExtendRunner, VerifyRunner
from nanograph.runners.warmup import (
    ForwardLimits,
    compile_kernels,
    scratch_batch,
    warm_up_kernels,
)

logger = logging.getLogger("nanograph")

# KV sizing keeps the largest shape's measured pool bytes times this free for all shapes:
# smaller shapes reuse the largest one's memory, plus what each shape keeps alive.
GRAPH_RESERVE_MARGIN = 1.25
_RUNNER_TYPES: dict[str, type[GraphRunner]] = {
    r.path: r for r in (DecodeRunner, PrefillRunner, VerifyRunner, DraftRunner, DraftExtendRunner)
}
_DRAFT_PATHS = ("draft", "draft_extend")  # the draft model's runners


class Startup:
    """Builds what an engine runs on; the engine takes the attributes it keeps from it."""

    def __init__(self, config: EngineConfig, tp: TensorParallel) -> None:
        self.config = config
        self.tp = tp
        self.device = tp.device
        self.dtype = config.torch_dtype
        self.live_capture: LiveCapture | None = None  # background/lazy capture (one rank only)
        # seconds per start-up phase, in order (a device synchronises before each phase ends)
        self.phases: dict[str, float] = {}
        # No cyclic GC while loading: the imports it pulls in (transformers, triton, dynamo) and
        # the GGUF reader make ~300k objects, each full collection re-scans all of them, and
        # loading makes no cyclic garbage worth collecting (smollm2-135m on the CPU machine:
        # ready 5.1 -> 4.4 s, peak RSS +7 of 1,163 MiB; level on an H100, where capture leads).
        collecting = gc.isenabled()  # as the caller had it
        gc.disable()
        try:
            with agreed(tp, "loading the model"), self._phase("weights"):
                self._load_model()
        finally:
            if collecting:
                gc.enable()
        self.max_model_len = min(
            config.max_model_len or self.model_config.max_position_embeddings,
            self.model_config.max_position_embeddings,
        )
        self.draft_model = None
        if config.speculative_algorithm == "draft_model":
            with self._phase("draft_weights"):
                self.draft_model = load_draft_model(config, self.model_config, self.max_model_len)
            self.graph_backends |= self._draft_graph_backends()
        models = [self.model] + ([self.draft_model] if self.draft_model is not None else [])
        self.memory = MemoryReport(
            weights=sum(p.numel() * p.element_size() for m in models for p in m.parameters()),
            rank=tp.rank,
            ranks=tp.size,
        )
        self.draft_kv: KVCache | None = None
        self.draft_runner: ModelRunner | None = None
        self.kv_cache, self.runner = self._build_kv_cache_and_runners()
        logger.info(
            "start-up phases: %s", ", ".join(f"{k} {v:.1f} s" for k, v in self.phases.items())
        )

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - start

    def _load_model(self) -> None:
        from nanograph.loader import init_dummy_weights, load_weights, resolve_model

        config = self.config
        self.source = resolve_model(config.model, config.load_format)
        self.model_config = self.source.config
        if config.quantization == "mxfp4":  # experts kept 4-bit (ModelConfig checks the model)
            self.model_config = self.model_config.replace(mxfp4_experts=True)
        self.attention = get_attention_backend(config.attention_backend, self.device)
        self.moe = (
            get_moe_backend(config.moe_backend, self.device) if self.model_config.is_moe else None
        )
        self.graph_backends = self._graph_backends()  # refuse bad combinations before loading
        # the tokenizer (and a chat template given in its place) before the weights: its
        # mistakes come back in a second
        has_tokenizer = self.source.has_tokenizer and self.tp.is_driver
        self.tokenizer = self.source.tokenizer() if has_tokenizer else None
        if config.chat_template is not None:
            if not self.source.has_tokenizer:
                raise ModelLoadError(
                    "chat_template needs the model's tokenizer, and this model has none: "
                    "leave it out"
                )
            if self.tokenizer is not None:  # other tensor-parallel ranks hold none
                self.tokenizer.set_chat_template(config.chat_template)
        self.model = build_model(self.model_config, self.dtype, self.device, self.moe, self.tp)
        if self.source.kind == "dummy":
            init_dummy_weights(self.model, seed=config.seed)
        else:
            load_weights(self.model, self.source.weights(), progress=config.progress)

    def _graph_backends(self) -> dict[str, str]:
        """Resolved graph backend per path, refusing combinations that cannot capture."""
        backends = {}
        host_planned = host_planned_ops(self.attention, self.moe)
        for path in ("decode", "prefill"):
            flag = f"{path}_cuda_graph"
            name = resolve_backend(
                flag, getattr(self.config, flag), self.config.graph_backend(path), host_planned
            )
            if name is not None:
                backends[path] = name
        if self.config.speculative_algorithm is None:
            return backends
        # verify is the target's small-batch path: it captures like decode
        if "decode" in backends:
            backends["verify"] = backends["decode"]
        return backends

    def _shapes(self, path: str) -> list[ShapeKey]:
        cfg = self.config
        max_bs = min(cfg.cuda_graph_max_bs, cfg.max_num_seqs)
        batch_sizes = list(cfg.cuda_graph_bs or decode_batch_sizes(max_bs))
        if path in ("decode", "draft"):
            return decode_shapes(batch_sizes)
        if path == "verify":
            return verify_shapes(batch_sizes, cfg.speculative_num_draft_tokens + 1)
        if path == "draft_extend":  # and one- and two-token catch-ups (DraftExtendRunner)
            lens = {1, 2, cfg.speculative_num_draft_tokens + 1}
            return [s for n in sorted(lens) for s in verify_shapes(batch_sizes, n)]
        tokens = cfg.prefill_graph_tokens or prefill_token_buckets(cfg.chunked_prefill_size)
        # a forward never holds more tokens than its request slots can bring at full context
        reachable = cfg.prefill_graph_slots * self.max_model_len
        return prefill_shapes([t for t in tokens if t <= reachable], cfg.prefill_graph_slots)

    def _graph_runner(
        self, path: str, backend: str, kv: KVCache, shapes: list[ShapeKey], probe: bool = False
    ) -> GraphRunner:
        runner_type = _RUNNER_TYPES[path]
        k = self.config.speculative_num_draft_tokens
        extra, context = {}, self.max_model_len
        if issubclass(runner_type, VerifyRunner):
            extra["query_len"] = k + 1
        if runner_type is DraftRunner:
            extra["loop_steps"] = self._draft_loop_steps(backend)
            context += k  # a loop's steps past a request's drafts look up the pages there
        draft = path in _DRAFT_PATHS
        # The drafter's captures run no warm-up (the target's run two): its kernels compiled
        # at start-up, and the memory plan's probe (one warm-up, then a capture of the largest
        # shape: `probe`) already ran every one of them on the capture stream, cuBLAS's
        # workspace for that stream included. A warm-up of a loop graph would run its k-1
        # steps eagerly once more: two warm-ups made draft capture 1.45x the target's, one
        # 1.18x.
        warmup = (1 if probe else 0) if draft else None
        return runner_type(
            self.draft_model if draft else self.model, self.attention, kv.k, kv.v,
            make_backend(backend, debug=self.config.debug_cuda_graph, warmup=warmup), shapes,
            kv.pages_needed(context), kv.page_size, self.device, tp=self.tp, **extra,
        )  # fmt: skip

    def _draft_graph_backends(self) -> dict[str, str]:
        """Resolved backend of the draft model's runners (after it is loaded: its MoE, if any,
        decides what it can hold)."""
        flag = "speculative_draft_cuda_graph"
        name = resolve_backend(
            flag, getattr(self.config, flag), self.config.graph_backend("speculative_draft"),
            self._draft_host_planned_ops(),
        )  # fmt: skip
        return dict.fromkeys(_DRAFT_PATHS, name) if name is not None else {}

    def _draft_host_planned_ops(self) -> list[str]:
        """The draft model's ops that read the host (its own MoE backend, if it is MoE)."""
        is_moe = self.draft_model is not None and self.draft_model.config.is_moe
        moe = get_moe_backend(self.config.moe_backend, self.device) if is_moe else None
        return host_planned_ops(self.attention, moe)

    def _draft_loop_steps(self, backend: str) -> int:
        """Steps the draft runner's graphs hold: all k-1 after the first draft in one graph
        when the metadata can advance on the device (graph-safe attention and MoE) under a
        backend that captures plain CUDA graphs; else 0 (one step per graph). tc_piecewise
        keeps one step per graph: compiling k-1 forwards in one program multiplies its
        compile time and is untested."""
        safe = not self._draft_host_planned_ops()
        return (
            self.config.speculative_num_draft_tokens - 1
            if safe and backend in ("full", "breakable")
            else 0
        )

    def _kv_cache(self, num_pages: int, draft: bool = False) -> KVCache:
        # the model's own config: with tensor parallelism, this rank's shard of the KV heads
        config = (self.draft_model if draft else self.model).config
        return KVCache(config, num_pages, self.config.page_size, self.dtype, self.device)

    def _build_kv_cache_and_runners(self) -> tuple[KVCache, ModelRunner]:
        """Measures graph and activation memory first, then sizes the KV pool from what is
        left, then captures: capture never competes with a KV pool sized without it. With
        background/lazy capture the graph budget is planned here and capture comes later. With
        a draft model, its KV pool has as many pages as the target's (one memory plan) and its
        runners (``draft``, ``draft_extend``) capture into their own pools (start-up capture
        only: the config refuses speculation with background/lazy capture)."""
        backends = self.graph_backends
        mode = self.config.capture_mode
        budget = None
        has_draft = self.draft_model is not None
        # ranks started separately (torchrun) parse their own flags: they must capture alike
        agree_equal(self.tp, "graph shapes", {path: self._shapes(path) for path in backends})
        if self.device.type == "cuda":
            # a two-page pool is enough to measure and compile: those batches read the scratch
            # page and write no KV
            scratch = {False: self._kv_cache(2)} | (
                {True: self._kv_cache(2, True)} if has_draft else {}
            )
            with self._phase("kernel_compile"):  # every variant first, in parallel
                for draft, model in ((False, self.model), (True, self.draft_model)):
                    if model is not None:
                        pool = scratch[draft]
                        compile_kernels(
                            ModelRunner(model, self.attention, pool.k, pool.v, self.device),
                            self._forward_limits(), self.config.progress,
                        )  # fmt: skip
                        del pool
            with self._phase("memory_plan"):
                self.memory.activation_peak = self._measure_activation_peak(scratch[False])
                if mode == "startup":
                    self._measure_graph_reserve(scratch)
                elif backends:
                    budget = self._graph_budget()
                    self.memory.graph_reserve = budget.limit
                    # a capture's warm-up forwards run eagerly beside the serving thread's
                    self.memory.capture_warmup_reserve = self.memory.activation_peak
                del scratch
                gc.collect()
                torch.cuda.empty_cache()
        with self._phase("kv_pool"):
            num_pages = self._num_pages()
            kv = self._kv_cache(num_pages)
            self.draft_kv = self._kv_cache(num_pages, draft=True) if has_draft else None
            self.memory.kv_pool = kv.nbytes + (self.draft_kv.nbytes if has_draft else 0)
        runners = {
            path: self._graph_runner(
                path, backend, self.draft_kv if path in _DRAFT_PATHS else kv, self._shapes(path)
            )
            for path, backend in backends.items()
        }
        if mode == "startup":
            for path, graph_runner in runners.items():
                with self._phase("capture"):
                    graph_runner.capture(progress=self.config.progress)
                self.memory.graph_pools[path] = graph_runner.pool_bytes()
        elif budget is not None:
            self.live_capture = LiveCapture(
                runners, mode, self.config.ladder_mode, budget, self.device
            )
        target = [r for path, r in runners.items() if path not in _DRAFT_PATHS]
        runner = ModelRunner(self.model, self.attention, kv.k, kv.v, self.device, target)
        if has_draft:
            self.draft_runner = ModelRunner(
                self.draft_model, self.attention, self.draft_kv.k, self.draft_kv.v, self.device,
                [r for path, r in runners.items() if path in _DRAFT_PATHS],
            )  # fmt: skip
        if self.device.type == "cuda":
            # after start-up capture, which compiled the variants its graphs hold: this compiles
            # the rest (with background/lazy capture: all of them, before serving begins)
            for model, pool in ((self.model, kv), (self.draft_model, self.draft_kv)):
                if model is not None:
                    with self._phase("kernel_warmup"):
                        eager = ModelRunner(model, self.attention, pool.k, pool.v, self.device)
                        warm_up_kernels(eager, self._forward_limits(), self.config.progress)
        return kv, runner

    def _measure_graph_reserve(self, scratch: dict[bool, KVCache]) -> None:
        """Start-up capture: captures each path's largest shape on the scratch pool (the
        draft model's for its paths: ``scratch[True]``) and keeps its pool size (with a
        margin) free for the graphs."""
        for path, backend in self.graph_backends.items():
            largest = max(self._shapes(path))
            # tc_piecewise would compile the probe shape a second time (seconds per shape);
            # a breakable capture holds the same activations (measured: a larger pool)
            probe_backend = "breakable" if backend == "tc_piecewise" else backend
            kv = scratch[path in _DRAFT_PATHS]
            probe = self._graph_runner(path, probe_backend, kv, [largest], probe=True)
            probe.capture(progress=False)
            # smaller shapes reuse the largest one's pool; keep a margin for their outputs
            self.memory.graph_reserve += int(probe.pool_bytes() * GRAPH_RESERVE_MARGIN)
            probe.release()
            del probe, kv

    def _graph_budget(self) -> GraphBudget:
        """The graph-memory budget of background/lazy capture: --cuda-graph-memory (bytes, or
        a fraction of the memory free now), else estimated from the activation peak."""
        limit = None
        if self.config.cuda_graph_memory is not None:
            kind, amount = parse_graph_memory(self.config.cuda_graph_memory)
            free, _ = torch.cuda.mem_get_info(self.device)
            limit = int(amount if kind == "bytes" else amount * free)
        return GraphBudget.planned(
            {path: max(self._shapes(path)).num_tokens for path in self.graph_backends},
            self.memory.activation_peak,
            self._forward_limits().max_tokens,  # as measured
            limit,
        )

    def _forward_limits(self) -> ForwardLimits:
        """A forward holds up to a chunk of tokens; a request puts at most a chunk, within the
        context (one token left for the answer), into one. With a context shorter than the
        chunk a forward of several requests holds the whole chunk."""
        chunk = self.config.chunked_prefill_size
        return ForwardLimits(self.config.page_size, chunk, min(chunk, self.max_model_len - 1))

    def _measure_activation_peak(self, scratch: KVCache) -> int:
        """Allocator peak of one eager forward of chunked_prefill_size tokens (requests as long
        as the context allows), above baseline."""
        limits = self._forward_limits()
        batch = scratch_batch(limits.max_tokens, limits)
        runner = ModelRunner(self.model, self.attention, scratch.k, scratch.v, self.device)
        torch.cuda.synchronize(self.device)
        base = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        runner.forward(batch)
        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device) - base

    def _num_pages(self) -> int:
        cfg = self.config
        # this rank's KV heads (a shard of them with tensor parallelism)
        per_token = bytes_per_token(self.model.config, self.dtype)
        if self.draft_model is not None:  # the draft pool gets as many pages as the target's
            per_token += bytes_per_token(self.draft_model.config, self.dtype)
        per_page = per_token * cfg.page_size
        if self.device.type == "cuda":
            total = torch.cuda.get_device_properties(self.device).total_memory
            self.memory.device_total = total
            budget = int(total * cfg.mem_fraction) - torch.cuda.memory_allocated(self.device)
            budget -= self.memory.graph_reserve + self.memory.activation_peak
            budget -= self.memory.capture_warmup_reserve
        else:
            budget = cfg.kv_cache_bytes
        # never more than every sequence slot at full length could use
        cap = cfg.max_num_seqs * ceil_div(self.max_model_len, cfg.page_size) + 1
        if cfg.max_total_tokens is not None:
            cap = min(cap, ceil_div(cfg.max_total_tokens, cfg.page_size) + 1)
        # every rank holds the same pages (rank 0 schedules them): the fewest any rank can hold
        num_pages = agree_min(self.tp, max(min(budget // per_page, cap), 0))
        if num_pages < 2:
            raise MemoryError(
                f"not enough memory for a KV pool: {budget / 2**20:.0f} MiB left after weights, "
                "graphs and activations; raise --mem-fraction / --kv-cache-bytes, lower "
                "--chunked-prefill-size, or use a smaller model"
            )
        return int(num_pages)
