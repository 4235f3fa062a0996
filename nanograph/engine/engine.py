"""The engine: runs scheduler -> runner -> sampler steps over what ``engine/startup.py`` built.

Start-up (the models, the KV pools, the runners and the memory plan) is ``engine/startup.py``;
when a sampled token ends its request is ``engine/stops.py``; what a speculative step drafts,
verifies, applies and rolls back is ``engine/speculative.py``. This module is the step loop.

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

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import NamedTuple

import torch

from nanograph.distributed import launch
from nanograph.distributed.steps import run_step
from nanograph.engine import logprobs
from nanograph.engine.config import EngineConfig
from nanograph.engine.memory import MemoryReport
from nanograph.engine.penalties import Penalties, bad_word_ids
from nanograph.engine.prefix_cache import PrefixCache
from nanograph.engine.prompts import first_bad_token, truncate
from nanograph.engine.request import UNRESOLVED, Request, Status, TokenInFlight
from nanograph.engine.sampler import Sampler
from nanograph.engine.sampling_params import SamplingParams
from nanograph.engine.scheduler import Scheduler
from nanograph.engine.speculative import SpeculativeDecoder
from nanograph.engine.startup import Startup
from nanograph.engine.stops import StopChecker
from nanograph.engine.structured import Grammars
from nanograph.runners.forward_batch import ForwardBatch
from nanograph.runners.live_capture import LiveCapture
from nanograph.runners.selection import host_planned_ops
from nanograph.spec.draft_model import DraftModelDrafter
from nanograph.spec.ngram import NgramDrafter
from nanograph.spec.proposal import Drafter

logger = logging.getLogger("nanograph")

# how long a step with nothing but structured outputs compiling waits for one to finish: new
# requests reach the engine between steps, so this bounds their wait too
COMPILE_POLL_S = 0.005


class _Launch(NamedTuple):
    """What a forward and its sampling put on the device: the sampled tokens, their packed
    logprob rows (``engine/logprobs.py``) when a sampled request asked, and the packed rows of
    the prompt tokens scored (``prompt_logprobs``): ``scored[i] = (request, count)`` owns the
    next ``count`` of them, in order."""

    tokens: torch.Tensor
    rows: torch.Tensor | None = None
    scored: tuple[tuple[Request, int], ...] = ()
    score_rows: torch.Tensor | None = None


class _InFlight:
    """A launched step: its sampled tokens (and packed logprob rows, when a request asked or a
    prompt is scored) on the device, and host copies on their way."""

    def __init__(self, requests: list[Request], indices: list[int], launch: _Launch) -> None:
        self.requests = requests  # row i of tokens belongs to requests[i] ...
        self.indices = indices  # ... at output_ids[indices[i]]
        self.tokens = tokens = launch.tokens
        self.scored = launch.scored
        self.ready: torch.cuda.Event | None = None
        self._read: tuple[list[int], list[list[float]] | None, list[list[float]]] | None = None
        logprob_rows, score_rows = launch.rows, launch.score_rows
        if not tokens.is_cuda:
            self.host, self.host_rows, self.host_scores = tokens, logprob_rows, score_rows
            return
        # The copies to the host run on a stream of their own, after this step's sampling: on
        # the step's stream a copy engine's work costs a launch gap of several us before and
        # after it (~8 us each side on the H200, h200/engine_step_trace_79063a3/), which the
        # next step's inputs and graph would wait behind.
        stream = _copy_stream(tokens.device)
        stream.wait_stream(torch.cuda.current_stream(tokens.device))
        with torch.cuda.stream(stream):
            self.host = _to_host(tokens)
            self.host_rows = None if logprob_rows is None else _to_host(logprob_rows)
            self.host_scores = None if score_rows is None else _to_host(score_rows)
            self.ready = torch.cuda.Event()  # reading waits for this step's copies only
            self.ready.record(stream)
        for values in (tokens, logprob_rows, score_rows):
            if values is not None:  # the allocator reuses them only after the copy
                values.record_stream(stream)

    def read(self) -> tuple[list[int], list[list[float]] | None, list[list[float]]]:
        """The tokens, the packed logprob rows (``engine/logprobs.py``) or None, and the
        packed rows of the scored prompt tokens (read once: a structured output's tokens are
        read ahead of the rest)."""
        if self._read is None:
            if self.ready is not None:
                self.ready.synchronize()
            rows = None if self.host_rows is None else self.host_rows.tolist()
            scores = [] if self.host_scores is None else self.host_scores.tolist()
            self._read = self.host.tolist(), rows, scores
        return self._read


def _prompt_scores(
    requests: list[Request], num_new: list[int]
) -> tuple[list[int], list[int], tuple[tuple[Request, int], ...]]:
    """The rows of a forward of ``requests`` (``num_new`` tokens each) whose logits score a
    prompt token (``prompt_logprobs``): row of position p scores prompt token p + 1, each once
    (a recompute after preemption does not score again). Returns the rows, the tokens they
    score, and (request, count) per scoring request."""
    rows: list[int] = []
    targets: list[int] = []
    scored = []
    start = 0
    for request, n in zip(requests, num_new):
        if request.scores_prompt:
            first = max(request.num_computed, request.num_prompt_scored)
            last = min(request.num_computed + n, len(request.prompt_ids) - 1)
            if first < last:
                offset = start - request.num_computed  # the row of position p: offset + p
                rows += range(offset + first, offset + last)
                targets += request.prompt_ids[first + 1 : last + 1]
                scored.append((request, last - first))
        start += n
    return rows, targets, tuple(scored)


def _to_host(values: torch.Tensor) -> torch.Tensor:
    """A host copy of a device tensor, started now on the current stream (pinned, async)."""
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
    return host.copy_(values, non_blocking=True)


_COPY_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _copy_stream(device: torch.device) -> torch.cuda.Stream:
    """The stream a device's sampled tokens go to the host on (one per device)."""
    if device not in _COPY_STREAMS:
        _COPY_STREAMS[device] = torch.cuda.Stream(device)
    return _COPY_STREAMS[device]


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
        self.grammars.close()
        launch.shutdown(self.tp)

    def _start(self, config: EngineConfig) -> None:
        self.config = config
        self.device = self.tp.device
        self.dtype = config.torch_dtype
        start = time.perf_counter()
        parts = Startup(config, self.tp)
        self.source, self.model_config, self.tokenizer = (
            parts.source, parts.model_config, parts.tokenizer
        )  # fmt: skip
        self.attention, self.moe = parts.attention, parts.moe
        self.model, self.draft_model = parts.model, parts.draft_model
        self.max_model_len = parts.max_model_len
        self.graph_backends = parts.graph_backends
        self.memory, self.startup_phases = parts.memory, parts.phases
        self.kv_cache, self.draft_kv = parts.kv_cache, parts.draft_kv
        self.runner, self.draft_runner = parts.runner, parts.draft_runner
        self.live_capture = parts.live_capture
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
        eos_token_ids = set(self.model_config.eos_token_ids)
        if self.tokenizer is not None:
            eos_token_ids |= set(self.tokenizer.eos_token_ids)
        vocab = self.model_config.vocab_size  # an EOS id past the logits cannot be masked
        self.penalties = Penalties(self.device, {t for t in eos_token_ids if t < vocab})
        self.speculative = self._speculative_decoder()
        self.stops = StopChecker(eos_token_ids, self.tokenizer, self.max_model_len)
        self.grammars = Grammars(self.tokenizer, vocab, eos_token_ids)
        self._ids = itertools.count()
        self._in_flight: _InFlight | None = None  # launched, its tokens not read yet
        # the step in flight whose structured outputs' tokens the next launch reads between
        # its forward and its sampling (``_read_ahead``), else None
        self._read_ahead: _InFlight | None = None
        self._scoring: set[int] = set()  # live requests with prompt_logprobs
        self.load_seconds = time.perf_counter() - start
        # every rank's memory report, for rank 0's start-up table (rank 0's own: memory_report)
        self.rank_memory = self.tp.all_gather_objects(self.memory)
        self.rank_memory[self.tp.rank] = self.memory  # this rank's: the one that stays current
        if config.progress and self.tp.is_driver:
            self.memory_report()
            logger.info("%s", "\n".join(m.table() for m in self.rank_memory))
        if self.live_capture is not None:
            self.live_capture.start()  # serving may begin now; graphs arrive as captured

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

    def _speculative_decoder(self) -> SpeculativeDecoder | None:
        if self.config.speculative_algorithm is None:
            return None
        if self.draft_runner is None:
            c = self.config
            drafter: Drafter = NgramDrafter(
                c.speculative_ngram_min_match_window_size, c.speculative_ngram_max_match_window_size
            )
        else:
            drafter = DraftModelDrafter(
                self.draft_runner, self.draft_kv, self.sampler, self.config.chunked_prefill_size
            )
        return SpeculativeDecoder(self.runner, self.sampler, self.config.page_size, drafter)

    # ---- requests -------------------------------------------------------------------------
    def add_request(self, prompt_ids: list[int], params: SamplingParams) -> Request:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        prompt_ids = truncate(list(prompt_ids), params.truncate_prompt_tokens, self.max_model_len)
        request = Request(next(self._ids), prompt_ids, params)
        problem = self._validate(request)
        if problem:
            request.finish("error", problem)
            logger.debug("request %d rejected: %s", request.request_id, problem)
        else:
            # a structured output reaches the scheduler once its form has compiled
            # (``_admit_compiled``): no step waits for a compile
            if not self.grammars.compiling(request):
                self.scheduler.add(request)
            self.penalties.admit(request)
            if request.params.prompt_logprobs is not None:
                self._scoring.add(request.request_id)
        return request

    def _tokenize_bad_words(self, request: Request) -> str | None:
        """Sets ``request.bad_words`` to its words' token forms; a problem, if any."""
        if self.tokenizer is None:
            return "bad_words needs the model's tokenizer, and this model was loaded without one"
        vocab, forms = self.model_config.vocab_size, []
        for word in request.params.bad_words:
            for form in bad_word_ids(self.tokenizer, (word,)):
                if not form:
                    return f"bad_words: {word!r} is no tokens for this tokenizer: leave it out"
                if max(form) >= vocab:
                    return (f"bad_words: {word!r} holds token id {max(form)}, outside the "
                            f"vocabulary (0..{vocab - 1}): leave it out")  # fmt: skip
                forms.append(form)
        request.bad_words = tuple(dict.fromkeys(forms))
        return None

    def _validate(self, request: Request) -> str | None:
        n, vocab = len(request.prompt_ids), self.model_config.vocab_size
        if n == 0:
            return "the prompt is empty: give at least one token"
        if request.params.n != 1:
            return (
                f"n={request.params.n}: an engine request is one completion; LLM.generate and "
                "the server run one per completion (SamplingParams.choices())"
            )
        if n >= self.max_model_len:
            return (
                f"the prompt has {n} tokens but the context length is {self.max_model_len}: "
                "shorten the prompt (one token must remain for the answer)"
            )
        params = request.params
        if self.speculative is not None and (
            params.logprobs is not None or params.prompt_logprobs is not None
            or params.adjusts_logits or params.structured_outputs is not None
        ):  # fmt: skip
            return (
                "logprobs, prompt_logprobs, penalties, logit_bias, allowed_token_ids, "
                "bad_words, min_tokens and structured_outputs are not computed with "
                "speculative decoding: "
                "leave them out, or serve this model without a speculative algorithm"
            )
        biased = next((t for t, _ in request.params.logit_bias if t >= vocab), None)
        if biased is not None:
            return f"logit_bias token id {biased} is outside the vocabulary (0..{vocab - 1})"
        allowed = request.params.allowed_token_ids or ()
        if allowed and allowed[-1] >= vocab:  # sorted
            return f"allowed_token_ids holds {allowed[-1]}, outside the vocabulary (0..{vocab - 1})"
        if params.bad_words:
            problem = self._tokenize_bad_words(request)
            if problem:
                return problem
        bad = first_bad_token(request.prompt_ids, vocab)
        if bad is not None:
            token = request.prompt_ids[bad]
            return f"token id {token!r} is outside the vocabulary (0..{vocab - 1})"
        if not self.scheduler.fits_alone(request):
            pages = self.scheduler.life_pages(request)
            return (
                f"the request needs {pages * self.config.page_size} KV slots but the pool holds "
                f"{self.kv_cache.capacity_tokens}: lower max_tokens or give the KV pool more memory"
            )
        if params.structured_outputs is not None:  # last: its matcher lives from here on
            return self.grammars.admit(request)
        return None

    def has_work(self) -> bool:
        return (
            self.scheduler.has_work() or self._in_flight is not None
            or self.grammars.num_compiling > 0
        )  # fmt: skip

    @property
    def broken(self) -> str | None:
        """Why no step can run any more (a tensor-parallel rank died or a step failed midway
        through its collectives), or None: a front's loop then ends instead of failing every
        later request."""
        return self.tp.peer_failure or self.tp.broken

    @property
    def num_waiting(self) -> int:
        """Requests admitted and not yet running: the scheduler's queue and the structured
        outputs still compiling."""
        return len(self.scheduler.waiting) + self.grammars.num_compiling

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
        self.scheduler.finish(request)  # one it never had (a form compiling) has nothing to free
        self.sampler.release(request.request_id)
        self.penalties.release(request.request_id)
        if self.speculative is not None:
            self.speculative.release(request.request_id)
        self.stops.release(request.request_id)
        self.grammars.release(request.request_id)
        self._scoring.discard(request.request_id)

    def _finish(self, request: Request, reason: str) -> None:
        """Finishes a request for a reason ``StopChecker.accept`` gave."""
        request.finish("stop" if reason == "stop-token" else reason)
        self._forget(request)

    def _fail_reading(self, request: Request, error: Exception) -> None:
        """Reading one of a request's tokens raised (e.g. the tokenizer refusing a token):
        that request fails, the others go on."""
        logger.error("request %d failed: %r", request.request_id, error, exc_info=error)
        self.abort(request, "error", f"internal error while reading a token: {error}")

    # ---- one step -------------------------------------------------------------------------
    def step(self) -> list[Request]:
        """Launches one forward and reads the tokens of the one before it (overlap schedule)
        or of this one (``disable_overlap_schedule``); returns the requests that finished."""
        failed = self._admit_compiled() if self.grammars.num_compiling else []
        if self.speculative is not None:
            return failed + self._speculative_step()
        finished = failed + self._step()
        if (
            self.grammars.num_compiling
            and self._in_flight is None
            and not self.scheduler.has_work()
        ):
            self.grammars.wait(COMPILE_POLL_S)  # only compiles are left: no spinning on them
        return finished

    def _admit_compiled(self) -> list[Request]:
        """Hands the requests whose structured output has compiled to the scheduler; fails
        those whose form did not compile. Returns the failed ones."""
        failed = []
        for request, problem in self.grammars.compiled():
            if problem is None:
                self.scheduler.add(request)
            else:
                request.finish("error", problem)
                self._forget(request)
                failed.append(request)
        return failed

    def _step(self) -> list[Request]:
        previous = self._in_flight
        if previous is not None and self.grammars.any_in(previous.requests):
            # a structured output's next mask needs its token in flight: the next forward is
            # launched first, and the token read while it runs (``_read_ahead``)
            self._read_ahead = previous
        try:
            failed, launched = self._launch()
        finally:  # read or not (nothing was scheduled), it is not the next step's to read
            self._read_ahead = None
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
            launch = self._forward_and_sample(requests, num_new, samples)
        except Exception as e:  # nothing of this step was applied to its requests yet
            kept, launch, errored = self._retry_alone(requests, num_new, samples, e)
            failed = errored
            if launch is None:
                return failed, None
            requests, num_new, samples = (
                [requests[i] for i in kept], [num_new[i] for i in kept], [samples[i] for i in kept]
            )  # fmt: skip
        for request, n in zip(requests, num_new):
            request.num_computed += n
        for request, count in launch.scored:
            request.num_prompt_scored += count
        sampled = [r for r, s in zip(requests, samples) if s]
        launched = _InFlight(sampled, [len(r.output_ids) for r in sampled], launch)
        for row, request in enumerate(sampled):
            request.output_ids.append(UNRESOLVED)
            request.future = TokenInFlight(launched, row)
        return failed, launched

    def _speculative_step(self) -> list[Request]:
        """A step with speculative decoding, serial (``engine/speculative.py`` says why):
        requests with room for drafts are verified, the others (prefill chunks, requests at
        their last token) run one plain forward; both are read before the step returns."""
        step, finished = self.scheduler.schedule(), []
        # preempted or finished requests give their draft pages back
        self.speculative.keep_only(self.scheduler.running)
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
        for request, end in self.speculative.apply(requests, accepted, self.stops.accept,
                                                   self.scheduler):  # fmt: skip
            if isinstance(end, Exception):
                self._fail_reading(request, end)
            else:
                self._finish(request, end)
            finished.append(request)
        return finished

    def _forward_and_sample(
        self, requests: list[Request], num_new: list[int], samples: list[bool]
    ) -> _Launch:
        """Launches the forward of ``requests``, the sampling of their sampled rows and the
        scoring of their prompt rows (``prompt_logprobs``)."""
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
        score_rows, targets, scored = [], [], ()
        if self._scoring:  # nearly never: a decode step does not walk its requests for this
            score_rows, targets, scored = _prompt_scores(requests, num_new)
        if score_rows:  # their logits come after the sampled rows'
            batch = replace(batch, sample_rows=batch.sample_rows + score_rows)
        in_flight_tokens = in_flight.tokens if in_flight else None
        logits = run_step(self.tp, self.runner.forward, batch, in_flight_tokens)
        if self._read_ahead is not None:
            self._read_grammar_tokens()
        sampled = [r for r, s in zip(requests, samples) if s]
        if scored:  # a slice costs host time: only a scoring step takes them
            logits, prompt_logits = logits[: len(sampled)], logits[len(sampled) :]
        params = [r.params for r in sampled]
        penalized = logits
        if self.penalties.live:  # nearly never: a step does not walk its requests for this
            flight_rows = [f for f, s in zip(future, samples) if s]
            penalized = self.penalties.apply(logits, sampled, (in_flight_tokens, flight_rows))
        penalized = self.grammars.mask(penalized, sampled)
        tokens = self.sampler(penalized, [r.request_id for r in sampled], params)
        self.penalties.record(tokens, sampled)
        rows = None  # the raw logits' (engine/logprobs.py)
        if any(p.logprobs is not None for p in params):
            rows = logprobs.packed(logits, tokens)
        if not scored:
            return _Launch(tokens, rows)
        targets = torch.tensor(targets, device=prompt_logits.device)
        return _Launch(tokens, rows, scored, logprobs.packed(prompt_logits, targets))

    def _read_grammar_tokens(self) -> None:
        """Reads the tokens of the step in flight (waiting for it, while the forward just
        launched runs) and advances their requests' structured outputs, so that this step's
        masks follow them; ``_resolve`` reads the same tokens later. Once a step."""
        ahead, self._read_ahead = self._read_ahead, None
        tokens, _, _ = ahead.read()
        self.grammars.advance(
            [(r, t) for r, t in zip(ahead.requests, tokens) if r.status is not Status.FINISHED]
        )

    def _retry_alone(
        self, requests: list[Request], num_new: list[int], samples: list[bool], error: Exception
    ) -> tuple[list[int], _Launch | None, list[Request]]:
        """A step's forward or sampling raised: each of its requests runs again alone, so one
        bad request fails and the others go on. Returns the indices that ran, what they
        launched together (as ``_forward_and_sample``; None when none ran), and the requests
        that failed (aborted with the error)."""
        logger.warning("a step of %d requests raised %r: running each alone", len(requests), error)
        kept, launches, failed = [], [], []
        for i, request in enumerate(requests):
            try:
                if len(requests) == 1:
                    raise error  # it already ran alone
                launches.append(self._forward_and_sample([request], [num_new[i]], [samples[i]]))
            except Exception as e:
                logger.error("request %d failed: %r", request.request_id, e, exc_info=e)
                self.abort(request, "error", f"internal error while computing it: {e!r}")
                failed.append(request)
            else:
                kept.append(i)
        if not launches:
            return kept, None, failed
        rows = None
        if any(x.rows is not None for x in launches):  # rows of requests that did not ask: 0
            rows = torch.cat([
                torch.zeros(len(x.tokens), logprobs.WIDTH, device=x.tokens.device)
                if x.rows is None else x.rows for x in launches
            ])  # fmt: skip
        scores = [x.score_rows for x in launches if x.score_rows is not None]
        return kept, _Launch(
            torch.cat([x.tokens for x in launches]), rows,
            tuple(s for x in launches for s in x.scored), torch.cat(scores) if scores else None,
        ), failed  # fmt: skip

    def _resolve(self, step: _InFlight) -> list[Request]:
        """Reads a launched step's tokens into its requests; returns those that finished."""
        tokens, rows, scores = step.read()
        at = 0
        for request, count in step.scored:  # before its sampled token, which may finish it
            k = request.params.prompt_logprobs
            request.prompt_logprobs += [logprobs.unpack(row, k) for row in scores[at : at + count]]
            at += count
        finished = []
        now = time.perf_counter()
        for row, (request, index, token) in enumerate(zip(step.requests, step.indices, tokens)):
            if request.future is not None and request.future.step is step:
                request.future = None
            if request.status is Status.FINISHED:
                continue  # finished by an earlier token; this one was computed in vain
            if request.first_token_time is None:
                request.first_token_time = now
            if request.params.logprobs is not None:  # tokens resolve in order: this is index
                request.logprobs.append(logprobs.unpack(rows[row], request.params.logprobs))
            try:
                reason = self.stops.accept(request, index, token)
                if not reason and request in self.grammars:
                    reason = self.grammars.accept(request, token)
            except Exception as e:
                self._fail_reading(request, e)
                finished.append(request)
                continue
            if reason:
                del request.output_ids[index + (reason != "stop-token") :]  # later in-flight ones
                del request.logprobs[len(request.output_ids) :]
                request.future = None
                self._finish(request, reason)
                finished.append(request)
        return finished

    def run(self, requests: list[Request], after_step: Callable[[], None] | None = None) -> None:
        """Steps until every request in ``requests`` has finished (``after_step``: called after
        each step, e.g. a progress bar's). A step left in flight (one that a stop token made
        useless) is read too when nothing else waits: the engine ends idle, holding no device
        work. Whatever raises (a bug, a KeyboardInterrupt), the requests of this call are
        aborted before it propagates: none stays in the engine."""
        try:
            while any(r.status != Status.FINISHED for r in requests):
                self.step()
                if after_step is not None:
                    after_step()
            if self._in_flight is not None and not self.scheduler.has_work():
                self.step()
        except BaseException:
            for request in requests:
                self.abort(request, "error", "the engine stopped while running this request")
            if not self.scheduler.has_work():
                self._in_flight = None  # its requests are gone; nothing will read it
            raise
