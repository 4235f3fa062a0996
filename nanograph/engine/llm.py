"""The offline API: ``LLM(model=..., **engine_args).generate(prompts, SamplingParams(...))``.

A prompt is a string (raw completion), a list of token ids, a chat conversation (a list of
``{"role", "content"}`` dicts, rendered with the model's chat template), or vLLM's
``{"prompt": ...}`` / ``{"prompt_token_ids": [...]}``: see ``prompts``. A list of those is a
batch. Every prompt gets a ``RequestOutput``, in order; a bad one carries
``finish_reason == "error"`` and ``error`` while the others complete normally. ``generate``
never leaves a request inside the engine, whatever raised.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nanograph.engine.config import ALIASES, EAGER_SWITCHES, EngineConfig, resolve_aliases
from nanograph.engine.engine import Engine
from nanograph.engine.logprobs import TokenLogprob
from nanograph.engine.prompts import Message, Prompt, is_single_prompt, prompt_token_ids
from nanograph.engine.request import Request
from nanograph.engine.sampling_params import SamplingParams
from nanograph.progress import counter_bar


@dataclass(frozen=True)
class RequestOutput:
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length" | "error" | "abort"
    error: str | None
    ttft_s: float | None  # time to first token
    decode_tokens_per_s: float | None  # after the first token
    num_preemptions: int
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    # one per token of token_ids when SamplingParams.logprobs was set, else None
    logprobs: list[TokenLogprob] | None = None

    @property
    def ok(self) -> bool:
        return self.finish_reason in ("stop", "length")


class LLM:
    def __init__(self, model: str = "smollm2-135m", **engine_args: Any) -> None:
        """``engine_args``: ``EngineConfig``'s fields, or vLLM's / SGLang's names for them
        (``gpu_memory_utilization``, ``mem_fraction_static``, ``enforce_eager``,
        ``disable_cuda_graph``: see ``config.ALIASES``)."""
        unknown = set(engine_args) - EngineConfig.field_names() - set(ALIASES) - set(EAGER_SWITCHES)
        if unknown:
            raise TypeError(
                f"unknown engine argument(s) {sorted(unknown)}; "
                f"valid: {sorted(EngineConfig.field_names() - {'model'})}, and vLLM's / "
                f"SGLang's {sorted([*ALIASES, *EAGER_SWITCHES])}"
            )
        self.engine = Engine(EngineConfig(model=model, **resolve_aliases(engine_args)))

    def close(self) -> None:
        """Stops the background capture thread and the engine's other tensor-parallel ranks;
        also at exit."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """``use_tqdm``: a progress bar of finished prompts and output tokens/s, on a terminal
        (and unless the engine was made with ``progress=False``)."""
        batch = [prompts] if is_single_prompt(prompts) else list(prompts)
        params = SamplingParams() if sampling_params is None else sampling_params
        params_list = [params] * len(batch) if isinstance(params, SamplingParams) else list(params)
        if len(params_list) != len(batch):
            raise ValueError(
                f"got {len(batch)} prompts but {len(params_list)} SamplingParams: "
                "give one, or one per prompt"
            )
        requests = []
        show = use_tqdm and self.engine.config.progress
        bar = counter_bar(len(batch), desc="Processed prompts", show=show, unit="prompt")
        try:
            for prompt, p in zip(batch, params_list):
                requests.append(self._request(prompt, p))
            updater = None if bar is None else _BarUpdater(bar, requests)
            self.engine.run(requests, updater)
            if updater is not None:
                updater(final=True)
        except BaseException:
            for request in requests:  # those queued before the exception: none stays behind
                self.engine.abort(request, "error", "generate was interrupted")
            raise
        finally:
            if bar is not None:
                bar.close()
        return [self._output(r) for r in requests]

    def _request(self, prompt: Any, params: Any) -> Request:
        """The engine's request for one prompt, or a finished error request for a bad one."""
        try:
            if not isinstance(params, SamplingParams):
                raise ValueError(
                    f"sampling params must be a SamplingParams, got {type(params).__name__}"
                )
            ids = prompt_token_ids(self.engine.tokenizer, prompt)
        except ValueError as e:
            request = Request(-1, [], params)
            request.finish("error", str(e))
            return request
        return self.engine.add_request(ids, params)

    def chat(
        self,
        conversations: list[Message] | Sequence[list[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # one conversation
        return self.generate(list(conversations), sampling_params, use_tqdm)

    def _output(self, r: Request) -> RequestOutput:
        # with stop strings the engine keeps the text (cut before the stop string, possibly
        # empty); without, the tokens are decoded once here
        text = r.text
        stops = isinstance(r.params, SamplingParams) and r.params.stop
        if not stops and r.output_ids and self.engine.tokenizer is not None:
            text = self.engine.tokenizer.decode(r.output_ids)
        decode_rate = None
        if r.first_token_time is not None and r.finish_time and len(r.output_ids) > 1:
            span = r.finish_time - r.first_token_time
            decode_rate = (len(r.output_ids) - 1) / span if span > 0 else None
        return RequestOutput(
            prompt_token_ids=r.prompt_ids,
            text=text,
            token_ids=list(r.output_ids),
            finish_reason=r.finish_reason or "error",
            error=r.error,
            ttft_s=(r.first_token_time - r.arrival_time) if r.first_token_time else None,
            decode_tokens_per_s=decode_rate,
            num_preemptions=r.num_preemptions,
            cached_tokens=r.num_cached_tokens,
            logprobs=list(r.logprobs) if getattr(r.params, "logprobs", None) is not None else None,
        )


class _BarUpdater:
    """After each engine step: the bar's finished prompts and output tokens/s, at most ten
    times a second (counting walks every request)."""

    def __init__(self, bar: Any, requests: list[Request]) -> None:
        self.bar, self.requests = bar, requests
        self.start = self.shown = time.perf_counter()

    def __call__(self, final: bool = False) -> None:
        now = time.perf_counter()
        if now - self.shown < 0.1 and not final:
            return
        self.shown = now
        done = sum(r.finish_reason is not None for r in self.requests)
        tokens = sum(len(r.output_ids) for r in self.requests)
        self.bar.set_postfix_str(f"output {tokens / (now - self.start):.0f} tok/s", refresh=False)
        self.bar.update(done - self.bar.n)
