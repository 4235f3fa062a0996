"""The offline API: ``LLM(model=..., **engine_args).generate(prompts, SamplingParams(...))``.

A prompt is a string (raw completion), a list of token ids, a chat conversation (a list of
``{"role", "content"}`` dicts, rendered with the model's chat template), or vLLM's
``{"prompt": ...}`` / ``{"prompt_token_ids": [...]}``: see ``prompts``. A list of those is a
batch. Every prompt gets a ``RequestOutput``, in order, with vLLM's shape: its
``SamplingParams.n`` completions in ``outputs`` (an engine request each); a bad prompt's
completions carry ``finish_reason == "error"`` and ``error`` while the others complete normally.
``generate`` never leaves a request inside the engine, whatever raised.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nanograph.engine.config import ENGINE_ARG_ALIASES, EngineConfig, resolve_aliases
from nanograph.engine.engine import Engine
from nanograph.engine.logprobs import TokenLogprob
from nanograph.engine.prompts import (
    Message,
    Prompt,
    is_single_prompt,
    prompt_text,
    prompt_token_ids,
)
from nanograph.engine.request import Request
from nanograph.engine.sampling_params import SamplingParams
from nanograph.progress import counter_bar


@dataclass(frozen=True)
class CompletionOutput:
    """One completion of a prompt (vLLM's ``CompletionOutput``)."""

    index: int  # among the prompt's n completions
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length" | "error" | "abort"
    # the stop token id or stop string that ended it (None for EOS, "length", errors)
    stop_reason: int | str | None
    error: str | None
    # one per token of token_ids when SamplingParams.logprobs was set, else None
    logprobs: list[TokenLogprob] | None
    cumulative_logprob: float | None  # their sum, when logprobs were asked for
    ttft_s: float | None  # time to first token
    decode_tokens_per_s: float | None  # after the first token
    num_preemptions: int

    @property
    def ok(self) -> bool:
        return self.finish_reason in ("stop", "length")


@dataclass(frozen=True)
class RequestOutput:
    """One prompt's result (vLLM's ``RequestOutput``): its ``SamplingParams.n`` completions
    in ``outputs``. ``text``, ``token_ids``, ``finish_reason``, ``stop_reason``, ``error``,
    ``logprobs``, ``ok``, ``ttft_s``, ``decode_tokens_per_s`` and ``num_preemptions`` are the
    first completion's, the only one unless n > 1."""

    request_id: str
    prompt: str | None  # the text, when the prompt was text (None for token ids, a chat)
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    finished: bool = True  # every completion ended (generate returns finished outputs)
    # with SamplingParams.prompt_logprobs: one per prompt token, None for the first (vLLM's);
    # None when not asked for or the request failed before its prompt was scored
    prompt_logprobs: list[TokenLogprob | None] | None = None

    text = property(lambda self: self.outputs[0].text)
    token_ids = property(lambda self: self.outputs[0].token_ids)
    finish_reason = property(lambda self: self.outputs[0].finish_reason)
    stop_reason = property(lambda self: self.outputs[0].stop_reason)
    error = property(lambda self: self.outputs[0].error)
    logprobs = property(lambda self: self.outputs[0].logprobs)
    ok = property(lambda self: self.outputs[0].ok)
    ttft_s = property(lambda self: self.outputs[0].ttft_s)
    decode_tokens_per_s = property(lambda self: self.outputs[0].decode_tokens_per_s)
    num_preemptions = property(lambda self: self.outputs[0].num_preemptions)


class LLM:
    def __init__(self, model: str = "smollm2-135m", **engine_args: Any) -> None:
        """``engine_args``: ``EngineConfig``'s fields, or vLLM's / SGLang's names for them
        (``gpu_memory_utilization``, ``mem_fraction_static``, ``enable_prefix_caching``,
        ``enforce_eager``, ``disable_cuda_graph``: see ``config.ENGINE_ARG_ALIASES``)."""
        unknown = set(engine_args) - EngineConfig.field_names() - set(ENGINE_ARG_ALIASES)
        if unknown:
            raise TypeError(
                f"unknown engine argument(s) {sorted(unknown)}; "
                f"valid: {sorted(EngineConfig.field_names() - {'model'})}, and vLLM's / "
                f"SGLang's {sorted(ENGINE_ARG_ALIASES)}"
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
        return self._generate(batch, sampling_params, use_tqdm)

    def chat(
        self,
        conversations: list[Message] | Sequence[list[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[RequestOutput]:
        """One conversation or a list of them. ``chat_template_kwargs``: variables for the
        model's chat template (vLLM's; e.g. ``{"enable_thinking": False}`` for Qwen3);
        ``tools``: OpenAI's tool definitions, for templates that render them (vLLM's). The
        answer is text: a model's tool calls are in it, as the model writes them."""
        if not isinstance(chat_template_kwargs, dict | None) or any(
            not isinstance(k, str) for k in chat_template_kwargs or {}
        ):
            raise ValueError(
                "chat_template_kwargs must be a dict of template variable names to values, "
                f"got {chat_template_kwargs!r}"
            )
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # one conversation
        template = {"chat_template_kwargs": chat_template_kwargs, "tools": tools}
        return self._generate(list(conversations), sampling_params, use_tqdm, template)

    def _generate(
        self, batch: list, sampling_params: Any, use_tqdm: bool,
        template: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:  # fmt: skip
        """``template``: ``prompt_token_ids``' chat template options (``chat`` gives them)."""
        params = SamplingParams() if sampling_params is None else sampling_params
        if not isinstance(params, SamplingParams | list | tuple):  # a dict would list its keys
            raise TypeError(
                "sampling_params must be a SamplingParams or a list of them (one per prompt), "
                f"got {type(params).__name__}"
                + (": build SamplingParams(**params)" if isinstance(params, dict) else "")
            )
        params_list = [params] * len(batch) if isinstance(params, SamplingParams) else list(params)
        if len(params_list) != len(batch):
            raise ValueError(
                f"got {len(batch)} prompts but {len(params_list)} SamplingParams: "
                "give one, or one per prompt"
            )
        groups: list[list[Request]] = []  # each prompt's n requests, one per completion
        show = use_tqdm and self.engine.config.progress
        bar = counter_bar(len(batch), desc="Processed prompts", show=show, unit="prompt")
        try:
            for prompt, p in zip(batch, params_list):
                groups.append(self._requests(prompt, p, template or {}))
            updater = None if bar is None else _BarUpdater(bar, groups)
            self.engine.run([r for group in groups for r in group], updater)
            if updater is not None:
                updater(final=True)
        except BaseException:
            for group in groups:  # those queued before the exception: none stays behind
                for request in group:
                    self.engine.abort(request, "error", "generate was interrupted")
            raise
        finally:
            if bar is not None:
                bar.close()
        return [self._output(prompt, group) for prompt, group in zip(batch, groups)]

    def _requests(self, prompt: Any, params: Any, template: dict[str, Any]) -> list[Request]:
        """The engine's requests for one prompt, one per completion, or finished error
        requests for a bad one."""
        try:
            if not isinstance(params, SamplingParams):
                raise ValueError(
                    f"sampling params must be a SamplingParams, got {type(params).__name__}"
                )
            ids = prompt_token_ids(self.engine.tokenizer, prompt, **template)
        except ValueError as e:
            request = Request(-1, [], params)
            request.finish("error", str(e))
            return [request] * params.n if isinstance(params, SamplingParams) else [request]
        return [self.engine.add_request(ids, p) for p in params.choices()]

    def _output(self, prompt: Any, group: list[Request]) -> RequestOutput:
        first = group[0]
        return RequestOutput(
            request_id=str(first.request_id),
            prompt=prompt_text(prompt),
            prompt_token_ids=first.prompt_ids,
            outputs=[self._completion(i, r) for i, r in enumerate(group)],
            num_cached_tokens=first.num_cached_tokens,
            prompt_logprobs=_prompt_logprobs(first),
        )

    def _completion(self, index: int, r: Request) -> CompletionOutput:
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
        logprobs = None
        if getattr(r.params, "logprobs", None) is not None:
            logprobs = list(r.logprobs)
        return CompletionOutput(
            index=index,
            text=text,
            token_ids=list(r.output_ids),
            finish_reason=r.finish_reason or "error",
            stop_reason=r.stop_reason,
            error=r.error,
            logprobs=logprobs,
            cumulative_logprob=None if logprobs is None else sum(t.logprob for t in logprobs),
            ttft_s=(r.first_token_time - r.arrival_time) if r.first_token_time else None,
            decode_tokens_per_s=decode_rate,
            num_preemptions=r.num_preemptions,
        )


def _prompt_logprobs(request: Request) -> list[TokenLogprob | None] | None:
    """vLLM's ``prompt_logprobs``: None for the first token, then each token's scores."""
    if getattr(request.params, "prompt_logprobs", None) is None:
        return None
    if len(request.prompt_logprobs) != max(0, len(request.prompt_ids) - 1):
        return None  # it failed before its prompt was scored
    return [None, *request.prompt_logprobs]


class _BarUpdater:
    """After each engine step: the bar's finished prompts and output tokens/s, at most ten
    times a second (counting walks every request)."""

    def __init__(self, bar: Any, groups: list[list[Request]]) -> None:
        self.bar, self.groups = bar, groups
        self.start = self.shown = time.perf_counter()

    def __call__(self, final: bool = False) -> None:
        now = time.perf_counter()
        if now - self.shown < 0.1 and not final:
            return
        self.shown = now
        done = sum(all(r.finish_reason is not None for r in group) for group in self.groups)
        tokens = sum(len(r.output_ids) for group in self.groups for r in group)
        self.bar.set_postfix_str(f"output {tokens / (now - self.start):.0f} tok/s", refresh=False)
        self.bar.update(done - self.bar.n)
