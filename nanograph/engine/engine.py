"""The engine: loads a model, sizes the KV pool, and runs scheduler -> runner -> sampler steps.

Invariants:
- A request that is invalid (empty, too long, bad token ids) finishes at once with
  ``finish_reason == "error"`` and a message saying what to do; it never enters the scheduler,
  so it cannot disturb the other requests.
- ``step`` runs exactly one forward; every scheduled request either gains a computed chunk, a
  sampled token, or finishes. KV pages are freed the moment a request finishes.
"""

from __future__ import annotations

import itertools
import logging
import time

import torch

from nanograph.attention import get_attention_backend
from nanograph.engine.config import EngineConfig
from nanograph.engine.kv_cache import KVCache, bytes_per_token
from nanograph.engine.request import Request, Status
from nanograph.engine.sampler import Sampler
from nanograph.engine.sampling_params import SamplingParams
from nanograph.engine.scheduler import Scheduler
from nanograph.models import build_model
from nanograph.runners.forward_batch import ForwardBatch
from nanograph.runners.model_runner import ModelRunner

logger = logging.getLogger("nanograph")


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        from nanograph.loader import init_dummy_weights, load_weights, resolve_model

        self.config = config
        self.device = config.torch_device
        self.dtype = config.torch_dtype
        start = time.perf_counter()
        self.source = resolve_model(config.model, config.load_format)
        self.model_config = self.source.config
        self.attention = get_attention_backend(config.attention_backend, self.device)
        self.model = build_model(self.model_config, self.dtype, self.device)
        if self.source.kind == "dummy":
            init_dummy_weights(self.model, seed=config.seed)
        else:
            load_weights(self.model, self.source.weights(), progress=config.progress)
        self.tokenizer = self.source.tokenizer() if self.source.has_tokenizer else None
        self.weights_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.max_model_len = min(
            config.max_model_len or self.model_config.max_position_embeddings,
            self.model_config.max_position_embeddings,
        )
        self.kv_cache = KVCache(
            self.model_config, self._num_pages(), config.page_size, self.dtype, self.device
        )
        self.scheduler = Scheduler(self.kv_cache, config.chunked_prefill_size, config.max_num_seqs)
        self.sampler = Sampler(self.device, seed=config.seed)
        self.runner = ModelRunner(
            self.model, self.attention, self.kv_cache.k, self.kv_cache.v, self.device
        )
        self.eos_token_ids = set(self.model_config.eos_token_ids)
        if self.tokenizer is not None:
            self.eos_token_ids |= set(self.tokenizer.eos_token_ids)
        self._ids = itertools.count()
        self.load_seconds = time.perf_counter() - start

    # ---- start-up -------------------------------------------------------------------------
    def _num_pages(self) -> int:
        cfg = self.config
        per_page = bytes_per_token(self.model_config, self.dtype) * cfg.page_size
        if self.device.type == "cuda":
            total = torch.cuda.get_device_properties(self.device).total_memory
            budget = int(total * cfg.mem_fraction) - torch.cuda.memory_allocated(self.device)
            budget -= self._activation_reserve()
        else:
            budget = cfg.kv_cache_bytes
        # never more than every sequence slot at full length could use
        cap = cfg.max_num_seqs * (-(-self.max_model_len // cfg.page_size)) + 1
        num_pages = min(budget // per_page, cap)
        if num_pages < 2:
            raise MemoryError(
                f"not enough memory for a KV pool: {budget / 2**20:.0f} MiB left after weights; "
                "raise --mem-fraction / --kv-cache-bytes or use a smaller model"
            )
        return int(num_pages)

    def _activation_reserve(self) -> int:
        """Bytes kept free for the largest eager forward (chunked_prefill_size tokens)."""
        c = self.model_config
        element = torch.empty((), dtype=self.dtype).element_size()
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        per_token = 4 * c.hidden_size + q + 2 * kv + 3 * c.intermediate_size
        return 2 * self.config.chunked_prefill_size * per_token * element + 2**30

    # ---- requests -------------------------------------------------------------------------
    def add_request(self, prompt_ids: list[int], params: SamplingParams) -> Request:
        request = Request(next(self._ids), list(prompt_ids), params)
        problem = self._validate(request)
        if problem:
            request.finish("error", problem)
            logger.warning("request %d rejected: %s", request.request_id, problem)
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
        bad = next((t for t in request.prompt_ids if not 0 <= t < vocab), None)
        if bad is not None:
            return f"token id {bad} is outside the vocabulary (0..{vocab - 1})"
        pages = self.kv_cache.pages_needed(min(n + request.params.max_tokens, self.max_model_len))
        if pages > self.kv_cache.allocator.num_usable:
            return (
                f"the request needs {pages * self.config.page_size} KV slots but the pool holds "
                f"{self.kv_cache.capacity_tokens}: lower max_tokens or give the KV pool more memory"
            )
        return None

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    # ---- one step -------------------------------------------------------------------------
    def step(self) -> list[Request]:
        """Runs one forward; returns the requests that finished during it."""
        step, failed = self.scheduler.schedule()
        for request in failed:
            request.finish("error", "the KV pool cannot hold this request even alone")
        if not step.requests:
            return failed
        samples = [step.samples(i) for i in range(len(step.requests))]
        batch = ForwardBatch.build(
            [r.token_ids for r in step.requests],
            [r.num_computed for r in step.requests],
            step.num_new,
            [r.pages for r in step.requests],
            self.config.page_size,
            samples,
        )
        logits = self.runner.forward(batch)
        sampled = [r for r, s in zip(step.requests, samples) if s]
        tokens = self.sampler(logits, [r.request_id for r in sampled], [r.params for r in sampled])
        for request, n in zip(step.requests, step.num_new):
            request.num_computed += n
        finished = list(failed)
        now = time.perf_counter()
        for request, token in zip(sampled, tokens):
            if request.first_token_time is None:
                request.first_token_time = now
            reason = self._append(request, token)
            if reason:
                request.finish(reason)
                self.scheduler.finish(request)
                self.sampler.release(request.request_id)
                finished.append(request)
        return finished

    def _append(self, request: Request, token: int) -> str | None:
        """Appends a sampled token; returns a finish reason when the request is done."""
        params = request.params
        if token in params.stop_token_ids or (
            token in self.eos_token_ids and not params.ignore_eos
        ):
            return "stop"
        request.output_ids.append(token)
        if params.stop and self.tokenizer is not None:
            text = self.tokenizer.decode(request.output_ids)
            hits = [text.index(s) for s in params.stop if s in text]
            if hits:
                request.text = text[: min(hits)]
                return "stop"
        if len(request.output_ids) >= params.max_tokens or request.num_tokens >= self.max_model_len:
            return "length"
        return None

    def run(self, requests: list[Request]) -> None:
        """Steps until every request in ``requests`` has finished."""
        while any(r.status != Status.FINISHED for r in requests):
            self.step()
