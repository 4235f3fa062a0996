"""The offline API: ``LLM(model=..., **engine_args).generate(prompts, SamplingParams(...))``.

A prompt is a string (raw completion), a list of token ids, or a chat conversation (a list of
``{"role", "content"}`` dicts, rendered with the model's chat template). A list of those is a
batch. Every prompt gets a ``RequestOutput``; a bad one carries ``finish_reason == "error"``
and ``error`` while the others complete normally.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nanograph.engine.config import EngineConfig
from nanograph.engine.engine import Engine
from nanograph.engine.request import Request
from nanograph.engine.sampling_params import SamplingParams

Message = dict[str, str]
Prompt = str | list[int] | list[Message]


@dataclass(frozen=True)
class RequestOutput:
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length" | "error"
    error: str | None
    ttft_s: float | None  # time to first token
    decode_tokens_per_s: float | None  # after the first token
    num_preemptions: int

    @property
    def ok(self) -> bool:
        return self.finish_reason != "error"


class LLM:
    def __init__(self, model: str = "smollm2-135m", **engine_args: Any) -> None:
        unknown = set(engine_args) - EngineConfig.field_names()
        if unknown:
            raise TypeError(
                f"unknown engine argument(s) {sorted(unknown)}; "
                f"valid: {sorted(EngineConfig.field_names() - {'model'})}"
            )
        self.engine = Engine(EngineConfig(model=model, **engine_args))

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        batch = [prompts] if _is_single(prompts) else list(prompts)
        params = sampling_params or SamplingParams()
        params_list = [params] * len(batch) if isinstance(params, SamplingParams) else list(params)
        if len(params_list) != len(batch):
            raise ValueError(
                f"got {len(batch)} prompts but {len(params_list)} SamplingParams: "
                "give one, or one per prompt"
            )
        requests = []
        for prompt, p in zip(batch, params_list):
            try:
                ids = self._tokenize(prompt)
            except ValueError as e:
                request = Request(-1, [], p)
                request.finish("error", str(e))
            else:
                request = self.engine.add_request(ids, p)
            requests.append(request)
        self.engine.run(requests)
        return [self._output(r) for r in requests]

    def chat(
        self,
        conversations: list[Message] | Sequence[list[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # one conversation
        return self.generate(list(conversations), sampling_params)

    def _tokenize(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            raise ValueError(
                f"model {self.engine.config.model!r} has no tokenizer (dummy weights): "
                "pass prompts as lists of token ids"
            )
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("the prompt is empty: give at least one token")
            return tokenizer.encode(prompt)
        if isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt):
            if not prompt:
                raise ValueError("the conversation is empty: give at least one message")
            return tokenizer.apply_chat_template(prompt, add_generation_prompt=True)
        raise ValueError(
            f"a prompt must be a string, a list of token ids or a list of messages, "
            f"got {type(prompt).__name__}"
        )

    def _output(self, r: Request) -> RequestOutput:
        text = r.text
        if not text and r.output_ids and self.engine.tokenizer is not None:
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
        )


def _is_single(prompts: Any) -> bool:
    if isinstance(prompts, str):
        return True
    if isinstance(prompts, list) and prompts and all(isinstance(t, int) for t in prompts):
        return True
    return isinstance(prompts, list) and bool(prompts) and all(isinstance(m, dict) for m in prompts)
