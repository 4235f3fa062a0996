"""The engine: loads a model, sizes the KV pool, and runs scheduler -> runner -> sampler steps.

Invariants:
- A request that is invalid (empty, too long, bad token ids) finishes at once with
  ``finish_reason == "error"`` and a message saying what to do; it never enters the scheduler,
  so it cannot disturb the other requests.
- ``step`` launches at most one forward; every scheduled request gains a computed chunk and,
  at the end of its pending tokens, a sampled token. With speculative decoding
  (``engine/speculative.py``) a step runs serially: one plain forward for the requests that
  do not decode, then drafts and one verify forward for those that do, each of which gains
  its accepted drafts and one token. KV pages are released the moment the host
  learns that a request finished (through ``Scheduler.finish``: to the pool, or with prefix
  caching its computed whole pages to the cache, where nothing reads them until reused).
- Nothing a request brings can poison the engine. Sampling parameters and prompts are checked
  before a request exists (``SamplingParams``, ``prompts``); what still raises inside a step
  fails the requests it concerns and leaves the engine as usable as before: an exception while
  reading one request's token fails that request; when a forward (or its sampling) raises, each
  of its requests runs again alone at once, so only the culprit fails. A failed or aborted
  request's pages are released at once (a failed request's are never cached).
- Overlap schedule (default): the host launches step t+1 before it reads step t's tokens, so
  its scheduling and input preparation run while the device computes. Step t+1 takes step t's
  tokens from the device (``ForwardBatch.future_rows``); a request that step t finishes (a
  stop token, a stop string) may compute one token in vain in step t+1, whose KV lands in its
  own pages before they are freed and is never read. Greedy and seeded outputs equal the
  serial schedule's; unseeded sampling shares one noise draw with such rows, so it differs.
- Tensor parallelism (``tensor_parallel_size`` N > 1, ``nanograph.distributed``): every rank
  builds an ``Engine`` with its shard of the weights and of the KV pool; start-up phases, the
  KV page count and capture outcomes are agreed by all ranks. Rank 0 schedules, samples and
  sends each step to the others (``distributed.steps``); on ranks 1..N-1 the constructor never
  returns: it serves rank 0's steps, then exits the process. With N = 1 nothing of this runs.
"""

from __future__ import annotations

import gc
import itertools
import logging
import time
from typing import TYPE_CHECKING

import torch

from nanograph.attention import get_attention_backend
from nanograph.distributed import launch
from nanograph.distributed.agreement import agree_equal, agree_min, agreed
from nanograph.distributed.steps import run_step
from nanograph.engine.config import EngineConfig, parse_graph_memory
from nanograph.engine.kv_cache import KVCache, bytes_per_token
from nanograph.engine.memory import MemoryReport
from nanograph.engine.prefix_cache import PrefixCache
from nanograph.engine.request import UNRESOLVED, Request, Status, TokenInFlight
from nanograph.engine.sampler import Sampler
from nanograph.engine.sampling_params import SamplingParams
from nanograph.engine.scheduler import Scheduler
from nanograph.engine.speculative import SpeculativeDecoder, load_draft_model
from nanograph.models import build_model, get_moe_backend
from nanograph.runners.decode_runner import DecodeRunner, DraftRunner
from nanograph.runners.forward_batch import ForwardBatch
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
from nanograph.runners.warmup import warm_up_kernels
from nanograph.spec.draft_model import DraftModelDrafter

if TYPE_CHECKING:
    from nanograph.loader.tokenizer import IncrementalDecoder

logger = logging.getLogger("nanograph")

# KV sizing keeps the largest shape's measured pool bytes times this free for all shapes:
# smaller shapes reuse the largest one's memory, plus what each shape keeps alive.
GRAPH_RESERVE_MARGIN = 1.25
_RUNNER_TYPES: dict[str, type[GraphRunner]] = {
    r.path: r for r in (DecodeRunner, PrefillRunner, VerifyRunner, DraftRunner, DraftExtendRunner)
}
_DRAFT_PATHS = ("draft", "draft_extend")  # the draft model's runners


class _InFlight:
    """A launched step: its sampled tokens on the device, and a host copy on its way."""

    def __init__(self, requests: list[Request], indices: list[int], tokens: torch.Tensor) -> None:
        self.requests = requests  # row i of tokens belongs to requests[i] ...
        self.indices = indices  # ... at output_ids[indices[i]]
        self.tokens = tokens
        self.ready: torch.cuda.Event | None = None
        if tokens.is_cuda:  # copy now, in stream order, so reading waits for this step only
            self.host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            self.host.copy_(tokens, non_blocking=True)
            self.ready = torch.cuda.Event()
            self.ready.record()
        else:
            self.host = tokens

    def read(self) -> list[int]:
        if self.ready is not None:
            self.ready.synchronize()
        return self.host.tolist()


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.tp = launch.start(config)  # one rank of size 1 unless tensor_parallel_size > 1
        self.live_capture: LiveCapture | None = None  # background/lazy capture (one rank only)
        if not self.tp.is_driver:  # rank 0 shows the progress bars and the memory of all ranks
            config = config.replace(progress=False)
        with launch.failure_reported(self.tp):
            self._start(config)
        if not self.tp.is_driver:
            from nanograph.distributed.worker import serve_steps

            serve_steps(self)  # never returns

    def close(self) -> None:
        """Stops the background capture thread (after the capture in progress) and the other
        tensor-parallel ranks (nothing to do with one rank)."""
        if self.live_capture is not None:
            self.live_capture.close()
        launch.shutdown(self.tp)

    def _start(self, config: EngineConfig) -> None:
        self.config = config
        self.device = self.tp.device
        self.dtype = config.torch_dtype
        start = time.perf_counter()
        with agreed(self.tp, "loading the model"):
            self._load_model()
        self.max_model_len = min(
            config.max_model_len or self.model_config.max_position_embeddings,
            self.model_config.max_position_embeddings,
        )
        self.draft_model = (
            load_draft_model(config, self.model_config, self.max_model_len)
            if config.speculative_algorithm == "draft_model" else None
        )  # fmt: skip
        if self.draft_model is not None:
            self.graph_backends |= self._draft_graph_backends()
        self.kernel_warmup_seconds = 0.0  # CUDA: compiling every kernel variant at start-up
        models = [self.model] + ([self.draft_model] if self.draft_model is not None else [])
        self.memory = MemoryReport(
            weights=sum(p.numel() * p.element_size() for m in models for p in m.parameters()),
            rank=self.tp.rank,
            ranks=self.tp.size,
        )
        self.draft_kv: KVCache | None = None
        self.draft_runner: ModelRunner | None = None
        self.kv_cache, self.runner = self._build_kv_cache_and_runners()
        self.prefix_cache = (
            None if config.disable_prefix_caching
            else PrefixCache(self.kv_cache.allocator, config.page_size)
        )  # fmt: skip
        self.scheduler = Scheduler(
            self.kv_cache, config.chunked_prefill_size, config.max_num_seqs, self.max_model_len,
            self.prefix_cache,
            config.speculative_num_draft_tokens if config.speculative_algorithm else 0,
        )  # fmt: skip
        self.sampler = Sampler(self.device, seed=config.seed)
        self.speculative = self._speculative_decoder()
        self.eos_token_ids = set(self.model_config.eos_token_ids)
        if self.tokenizer is not None:
            self.eos_token_ids |= set(self.tokenizer.eos_token_ids)
        self._ids = itertools.count()
        self._decoders: dict[int, IncrementalDecoder] = {}  # stop-string requests only
        self._in_flight: _InFlight | None = None  # launched, its tokens not read yet
        self.load_seconds = time.perf_counter() - start
        # every rank's memory report, for rank 0's start-up table (rank 0's own: memory_report)
        self.rank_memory = self.tp.all_gather_objects(self.memory)
        self.rank_memory[self.tp.rank] = self.memory  # this rank's: the one that stays current
        if config.progress and self.tp.is_driver:
            self.memory_report()
            logger.info("%s", "\n".join(m.table() for m in self.rank_memory))
        if self.live_capture is not None:
            self.live_capture.start()  # serving may begin now; graphs arrive as captured

    def _load_model(self) -> None:
        from nanograph.loader import init_dummy_weights, load_weights, resolve_model

        config = self.config
        self.source = resolve_model(config.model, config.load_format)
        self.model_config = self.source.config
        self.attention = get_attention_backend(config.attention_backend, self.device)
        self.moe = (
            get_moe_backend(config.moe_backend, self.device) if self.model_config.is_moe else None
        )
        self.graph_backends = self._graph_backends()  # refuse bad combinations before loading
        self.model = build_model(self.model_config, self.dtype, self.device, self.moe, self.tp)
        if self.source.kind == "dummy":
            init_dummy_weights(self.model, seed=config.seed)
        else:
            load_weights(self.model, self.source.weights(), progress=config.progress)
        has_tokenizer = self.source.has_tokenizer and self.tp.is_driver
        self.tokenizer = self.source.tokenizer() if has_tokenizer else None

    def wait_for_graphs(self, timeout: float) -> bool:
        """Background capture: blocks until the capture thread has nothing left to capture;
        True at once for the other modes. For tests and benchmarks."""
        return self.live_capture is None or self.live_capture.wait(timeout)

    def graph_capture_stats(self) -> dict:
        """Background/lazy capture: ``LiveCapture.stats()``; empty with start-up capture."""
        return self.live_capture.stats() if self.live_capture is not None else {}

    @property
    def weights_bytes(self) -> int:
        return self.memory.weights

    def memory_report(self) -> MemoryReport:
        """The start-up memory report with the prefix cache's figures as of now, and with
        background/lazy capture the graph pools, histograms and ladders as of now."""
        if self.live_capture is not None:
            self.memory.graph_capture = self.live_capture.stats()
            self.memory.graph_pools = {
                path: live.pool_bytes for path, live in self.live_capture.runners.items()
            }
        if self.prefix_cache is not None:
            stats = self.prefix_cache.stats()
            page_bytes = self.kv_cache.nbytes // self.kv_cache.num_pages
            self.memory.prefix_cache = stats.as_dict() | {
                "cached_bytes": stats.cached_pages * page_bytes
            }
        return self.memory

    # ---- start-up -------------------------------------------------------------------------
    def host_planned_ops(self) -> list[str]:
        """The model's ops that read the host (not graph-safe), with graph-safe alternatives."""
        return host_planned_ops(self.attention, self.moe)

    def _graph_backends(self) -> dict[str, str]:
        """Resolved graph backend per path, refusing combinations that cannot capture."""
        backends = {}
        host_planned = self.host_planned_ops()
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

    def _speculative_decoder(self) -> SpeculativeDecoder | None:
        if self.config.speculative_algorithm is None:
            return None
        drafter = None
        if self.draft_runner is not None:
            drafter = DraftModelDrafter(
                self.draft_runner, self.draft_kv, self.sampler, self.config.chunked_prefill_size
            )
        return SpeculativeDecoder(self.runner, self.sampler, self.config.page_size, drafter)

    def _shapes(self, path: str) -> list[ShapeKey]:
        cfg = self.config
        max_bs = min(cfg.cuda_graph_max_bs, cfg.max_num_seqs)
        batch_sizes = list(cfg.cuda_graph_bs or decode_batch_sizes(max_bs))
        if path in ("decode", "draft"):
            return decode_shapes(batch_sizes)
        if path in ("verify", "draft_extend"):
            return verify_shapes(batch_sizes, cfg.speculative_num_draft_tokens + 1)
        tokens = cfg.prefill_graph_tokens or prefill_token_buckets(cfg.chunked_prefill_size)
        # a forward never holds more tokens than its request slots can bring at full context
        reachable = cfg.prefill_graph_slots * self.max_model_len
        return prefill_shapes([t for t in tokens if t <= reachable], cfg.prefill_graph_slots)

    def _graph_runner(
        self, path: str, backend: str, kv: KVCache, shapes: list[ShapeKey]
    ) -> GraphRunner:
        runner_type = _RUNNER_TYPES[path]
        k = self.config.speculative_num_draft_tokens
        extra, context = {}, self.max_model_len
        if issubclass(runner_type, VerifyRunner):
            extra["query_len"] = k + 1
        if runner_type is DraftRunner:
            extra["loop_steps"] = self._draft_loop_steps(backend)
            context += k  # a loop's steps past a request's drafts look up the pages there
        model = self.draft_model if path in _DRAFT_PATHS else self.model
        return runner_type(
            model, self.attention, kv.k, kv.v,
            make_backend(backend, debug=self.config.debug_cuda_graph), shapes,
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
            # a two-page pool is enough to measure: measurement batches read the scratch page
            scratch = {False: self._kv_cache(2)} | (
                {True: self._kv_cache(2, True)} if has_draft else {}
            )
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
                graph_runner.capture(progress=self.config.progress)
                self.memory.graph_pools[path] = graph_runner.pool_bytes()
        elif budget is not None:
            self.live_capture = LiveCapture(
                runners, mode, self.config.cuda_graph_ladder, budget, self.device
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
            start = time.perf_counter()
            for model, pool in ((self.model, kv), (self.draft_model, self.draft_kv)):
                if model is not None:
                    eager = ModelRunner(model, self.attention, pool.k, pool.v, self.device)
                    warm_up_kernels(eager, self.config.page_size, self.config.progress)
            self.kernel_warmup_seconds = time.perf_counter() - start
            logger.info("kernels warmed up in %.1f s", self.kernel_warmup_seconds)
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
            probe = self._graph_runner(path, probe_backend, kv, [largest])
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
            min(self.config.chunked_prefill_size, self.max_model_len - 1),  # as measured
            limit,
        )

    def _measure_activation_peak(self, scratch: KVCache) -> int:
        """Allocator peak of one eager forward at chunked_prefill_size tokens, above baseline."""
        n = min(self.config.chunked_prefill_size, self.max_model_len - 1)
        page = self.config.page_size
        batch = ForwardBatch(
            input_ids=[0] * n, positions=list(range(n)), seq_lens=[n], query_lens=[n],
            page_tables=[[0] * -(-n // page)], slot_mapping=[-1] * n, sample_rows=[n - 1],
            page_size=page,
        )  # fmt: skip
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
        cap = cfg.max_num_seqs * (-(-self.max_model_len // cfg.page_size)) + 1
        if cfg.max_total_tokens is not None:
            cap = min(cap, -(-cfg.max_total_tokens // cfg.page_size) + 1)
        # every rank holds the same pages (rank 0 schedules them): the fewest any rank can hold
        num_pages = agree_min(self.tp, max(min(budget // per_page, cap), 0))
        if num_pages < 2:
            raise MemoryError(
                f"not enough memory for a KV pool: {budget / 2**20:.0f} MiB left after weights, "
                "graphs and activations; raise --mem-fraction / --kv-cache-bytes, lower "
                "--chunked-prefill-size, or use a smaller model"
            )
        return int(num_pages)

    # ---- requests -------------------------------------------------------------------------
    def add_request(self, prompt_ids: list[int], params: SamplingParams) -> Request:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        request = Request(next(self._ids), list(prompt_ids), params)
        problem = self._validate(request)
        if problem:
            request.finish("error", problem)
            logger.debug("request %d rejected: %s", request.request_id, problem)
        else:
            self.scheduler.add(request)
        return request

    def _validate(self, request: Request) -> str | None:
        n, vocab = len(request.prompt_ids), self.model_config.vocab_size
        if n == 0:
            return "the prompt is empty: give at least one token"
        if n >= self.max_model_len:
            return (
                f"the prompt has {n} tokens but the context length is {self.max_model_len}: "
                "shorten the prompt (one token must remain for the answer)"
            )
        bad = next(
            (t for t in request.prompt_ids if type(t) is not int or not 0 <= t < vocab), None
        )
        if bad is not None:
            return f"token id {bad} is outside the vocabulary (0..{vocab - 1})"
        if not self.scheduler.fits_alone(request):
            pages = self.scheduler.life_pages(request)
            return (
                f"the request needs {pages * self.config.page_size} KV slots but the pool holds "
                f"{self.kv_cache.capacity_tokens}: lower max_tokens or give the KV pool more memory"
            )
        return None

    def has_work(self) -> bool:
        return self.scheduler.has_work() or self._in_flight is not None

    def abort(self, request: Request, reason: str = "abort", error: str | None = None) -> None:
        """Ends a request now (a client went away, a caller gave up): its pages go back to the
        pool at once and a step in flight that computed for it is ignored when read."""
        if request.status is Status.FINISHED:
            return
        while request.output_ids and request.output_ids[-1] == UNRESOLVED:
            request.output_ids.pop()
        request.future = None
        request.finish(reason, error)
        self._forget(request)

    def _forget(self, request: Request) -> None:
        """Releases what the engine holds for a finished request."""
        self.scheduler.finish(request)
        self.sampler.release(request.request_id)
        if self.speculative is not None and self.speculative.drafter is not None:
            self.speculative.drafter.release(request.request_id)
        self._decoders.pop(request.request_id, None)

    # ---- one step -------------------------------------------------------------------------
    def step(self) -> list[Request]:
        """Launches one forward and reads the tokens of the one before it (overlap schedule)
        or of this one (``disable_overlap_schedule``); returns the requests that finished."""
        if self.speculative is not None:
            return self._speculative_step()
        failed, launched = self._launch()
        previous, self._in_flight = self._in_flight, launched
        finished = failed + (self._resolve(previous) if previous is not None else [])
        if self.config.disable_overlap_schedule and launched is not None:
            self._in_flight = None
            finished += self._resolve(launched)
        return finished

    def _launch(self) -> tuple[list[Request], _InFlight | None]:
        """Schedules and launches a forward and its sampling, without reading any token."""
        step = self.scheduler.schedule()
        if not step.requests:
            return [], None
        return self._launch_forward(step.requests, step.num_new)

    def _launch_forward(
        self, requests: list[Request], num_new: list[int]
    ) -> tuple[list[Request], _InFlight | None]:
        """Launches the forward of scheduled requests and its sampling; returns the requests
        that failed and the launched step."""
        failed: list[Request] = []
        samples = [n == r.num_pending for r, n in zip(requests, num_new)]
        try:
            tokens = self._forward_and_sample(requests, num_new, samples)
        except Exception as e:  # nothing of this step was applied to its requests yet
            kept, tokens, errored = self._retry_alone(requests, num_new, samples, e)
            failed = errored
            if not kept:
                return failed, None
            requests, num_new, samples = (
                [requests[i] for i in kept], [num_new[i] for i in kept], [samples[i] for i in kept]
            )  # fmt: skip
        for request, n in zip(requests, num_new):
            request.num_computed += n
        sampled = [r for r, s in zip(requests, samples) if s]
        launched = _InFlight(sampled, [len(r.output_ids) for r in sampled], tokens)
        for row, request in enumerate(sampled):
            request.output_ids.append(UNRESOLVED)
            request.future = TokenInFlight(launched, row)
        return failed, launched

    def _speculative_step(self) -> list[Request]:
        """A step with speculative decoding, serial (``engine/speculative.py`` says why):
        requests with room for drafts are verified, the others (prefill chunks, requests at
        their last token) run one plain forward; both are read before the step returns."""
        step, finished = self.scheduler.schedule(), []
        drafter = self.speculative.drafter
        if drafter is not None:  # preempted or finished requests give their draft pages back
            drafter.keep_only(self.scheduler.running)
        verify = [i for i, n in enumerate(step.num_drafts) if n > 0]
        plain = [i for i, n in enumerate(step.num_drafts) if n == 0]
        if plain:
            failed, launched = self._launch_forward(
                [step.requests[i] for i in plain], [step.num_new[i] for i in plain]
            )
            finished += failed + (self._resolve(launched) if launched is not None else [])
        if verify:
            requests = [step.requests[i] for i in verify]
            finished += self._verify(requests, [step.num_drafts[i] for i in verify])
        return finished

    def _verify(self, requests: list[Request], limits: list[int]) -> list[Request]:
        """Drafts, verifies and applies the accepted tokens of decoding requests; returns those
        that finished. If the speculative step raises, they decode one plain token instead
        (nothing of the step was applied to them)."""
        try:
            accepted = self.speculative.step(requests, limits)
        except Exception as e:
            logger.warning("a speculative step of %d requests raised %r: decoding them plainly",
                           len(requests), e, exc_info=e)  # fmt: skip
            failed, launched = self._launch_forward(requests, [1] * len(requests))
            return failed + (self._resolve(launched) if launched is not None else [])
        finished = []
        now = time.perf_counter()
        for request, tokens in zip(requests, accepted):
            # the verify forward wrote KV for the last token and the accepted drafts
            request.num_computed += len(tokens)
            if request.first_token_time is None:
                request.first_token_time = now
            reason, index = None, len(request.output_ids)
            try:
                for token in tokens:
                    index = len(request.output_ids)
                    request.output_ids.append(token)
                    if reason := self._accept(request, index, token):
                        break
            except Exception as e:  # e.g. the tokenizer refusing a token: this request only
                logger.error("request %d failed: %r", request.request_id, e, exc_info=e)
                self.abort(request, "error", f"internal error while reading a token: {e}")
                finished.append(request)
                continue
            if reason:
                del request.output_ids[index + (reason != "stop-token") :]
                request.finish("stop" if reason == "stop-token" else reason)
                self._forget(request)
                finished.append(request)
                continue
            self.scheduler.roll_back(request)
            if self.speculative.drafter is not None:
                self.speculative.drafter.accepted(request, len(tokens) - 1)
        return finished

    def _forward_and_sample(
        self, requests: list[Request], num_new: list[int], samples: list[bool]
    ) -> torch.Tensor:
        """Launches the forward of ``requests`` and the sampling of their sampled rows."""
        in_flight = self._in_flight
        # a request whose last new token is still on the device takes it from the step in flight
        future = [
            r.future.row if r.future is not None and r.future.step is in_flight
            and r.num_computed + n == r.num_tokens else None
            for r, n in zip(requests, num_new)
        ]  # fmt: skip
        batch = ForwardBatch.build(
            [r.pending_tokens(n) for r, n in zip(requests, num_new)],
            [r.num_computed for r in requests],
            [r.pages for r in requests],
            self.config.page_size,
            samples,
            future,
        )
        in_flight_tokens = in_flight.tokens if in_flight else None
        logits = run_step(self.tp, self.runner.forward, batch, in_flight_tokens)
        sampled = [r for r, s in zip(requests, samples) if s]
        return self.sampler(logits, [r.request_id for r in sampled], [r.params for r in sampled])

    def _retry_alone(
        self, requests: list[Request], num_new: list[int], samples: list[bool], error: Exception
    ) -> tuple[list[int], torch.Tensor | None, list[Request]]:
        """A step's forward or sampling raised: each of its requests runs again alone, so one
        bad request fails and the others go on. Returns the indices that ran, their sampled
        tokens in order, and the requests that failed (aborted with the error)."""
        logger.warning("a step of %d requests raised %r: running each alone", len(requests), error)
        kept, tokens, failed = [], [], []
        for i, request in enumerate(requests):
            try:
                if len(requests) == 1:
                    raise error  # it already ran alone
                token = self._forward_and_sample([request], [num_new[i]], [samples[i]])
            except Exception as e:
                logger.error("request %d failed: %r", request.request_id, e, exc_info=e)
                self.abort(request, "error", f"internal error while computing it: {e!r}")
                failed.append(request)
            else:
                kept.append(i)
                tokens.append(token)
        return kept, (torch.cat(tokens) if tokens else None), failed

    def _resolve(self, step: _InFlight) -> list[Request]:
        """Reads a launched step's tokens into its requests; returns those that finished."""
        tokens = step.read()
        finished = []
        now = time.perf_counter()
        for request, index, token in zip(step.requests, step.indices, tokens):
            if request.future is not None and request.future.step is step:
                request.future = None
            if request.status is Status.FINISHED:
                continue  # finished by an earlier token; this one was computed in vain
            if request.first_token_time is None:
                request.first_token_time = now
            try:
                reason = self._accept(request, index, token)
            except Exception as e:  # e.g. the tokenizer refusing a token: this request only
                logger.error("request %d failed: %r", request.request_id, e, exc_info=e)
                self.abort(request, "error", f"internal error while reading a token: {e}")
                finished.append(request)
                continue
            if reason:
                del request.output_ids[index + (reason != "stop-token") :]  # later in-flight ones
                request.future = None
                request.finish("stop" if reason == "stop-token" else reason)
                self._forget(request)
                finished.append(request)
        return finished

    def _accept(self, request: Request, index: int, token: int) -> str | None:
        """Puts a sampled token at ``output_ids[index]``; returns a finish reason when the
        request is done ("stop-token": the token is a stop token and is not kept)."""
        params = request.params
        if token in params.stop_token_ids or (
            token in self.eos_token_ids and not params.ignore_eos
        ):
            return "stop-token"
        request.output_ids[index] = token
        if params.stop and self.tokenizer is not None:
            # incremental text: each token decodes once, and only the new tail is searched
            decoder = self._decoders.get(request.request_id)
            if decoder is None:
                decoder = self._decoders[request.request_id] = self.tokenizer.decode_stream()
            seen = len(request.text)
            request.text += decoder.step(token)
            hits = [
                i for stop in params.stop
                if (i := request.text.find(stop, max(0, seen - len(stop) + 1))) >= 0
            ]  # fmt: skip
            if hits:
                request.text = request.text[: min(hits)]
                return "stop"
        if (
            index + 1 >= params.max_tokens
            or len(request.prompt_ids) + index + 1 >= self.max_model_len
        ):
            return "length"
        return None

    def run(self, requests: list[Request]) -> None:
        """Steps until every request in ``requests`` has finished. A step left in flight (one
        that a stop token made useless) is read too when nothing else waits: the engine ends
        idle, holding no device work. Whatever raises (a bug, a KeyboardInterrupt), the
        requests of this call are aborted before it propagates: none stays in the engine."""
        try:
            while any(r.status != Status.FINISHED for r in requests):
                self.step()
            if self._in_flight is not None and not self.scheduler.has_work():
                self.step()
        except BaseException:
            for request in requests:
                self.abort(request, "error", "the engine stopped while running this request")
            if not self.scheduler.has_work():
                self._in_flight = None  # its requests are gone; nothing will read it
            raise
