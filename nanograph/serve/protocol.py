"""OpenAI request schemas, their translation to engine inputs, and OpenAI error bodies.

Invariants:
- Field types are checked strictly (pydantic strict mode: ``"5"`` is not a number, ``true`` is
  not an integer); unknown fields are ignored, as OpenAI's API does. Value ranges are checked
  once, by ``SamplingParams`` and ``prompt_token_ids``, so the server and ``LLM`` accept and
  refuse exactly the same things, with the same messages.
- Every refusal is an ``ApiError`` carrying its HTTP status and OpenAI's error body
  ``{"error": {"message", "type", "param", "code"}}``.
- ``n`` choices (1-128, OpenAI's limit) are ``n`` engine requests of the same prompt; with a
  ``seed``, choice i samples with ``seed + i`` so seeded choices differ and each is
  reproducible (greedy choices are equal). A completions request may carry a list of prompts:
  choice ``p * n + i`` is prompt p's i-th (at most 128 choices in all). The per-choice
  parameters are ``SamplingParams.choices()``, as ``LLM.generate``'s.
- ``chat_template_kwargs`` (vLLM's and SGLang's extension, chat and ``/tokenize``) are the
  chat template's variables, e.g. Qwen3's ``enable_thinking`` (its answer then opens no think
  block, so ``--reasoning-parser qwen3`` reads it as all content); naming an argument of
  ``apply_chat_template`` itself is refused (param ``chat_template_kwargs``).
- ``echo`` puts each prompt (as given, or its ids decoded) in front of its choices' text;
  with ``logprobs`` the logprobs object starts with the prompt's tokens (the first one's
  log-probability and alternatives null, as OpenAI's), scored by the engine
  (``SamplingParams.prompt_logprobs``): what lm-evaluation-harness reads for loglikelihoods.
  vLLM's ``prompt_logprobs: k`` gives each choice vLLM's ``prompt_logprobs`` list.
- Structured outputs (``engine/structured.py``): OpenAI's ``response_format``
  (``json_object``, ``json_schema``; vLLM's ``structural_tag`` in either of its forms), vLLM's
  ``structured_outputs`` and ``guided_json`` /
  ``guided_regex`` / ``guided_choice`` / ``guided_grammar``, SGLang's ``regex`` /
  ``json_schema`` / ``ebnf``: one of them per request (two: 400), a bad form is a 400 naming
  the field it came in.
- ``tool_choice`` ``"required"`` or a named function is a structured output too (vLLM's):
  the calls' JSON schema (``forced_tool_schema``), read back as calls (``ForcedCalls``).
- Options the engine cannot honour are refused with 400 rather than silently ignored: best_of,
  suffix, OpenAI's deprecated ``functions`` / ``function_call`` (unless ``"none"``), and
  audio. Unknown fields outside these lists are still ignored.
- Tools (``tools`` with ``tool_choice`` absent or ``"auto"``) need the server's
  ``--tool-call-parser`` (else 400, param ``tools``): they go to the chat template and the
  answer is parsed for calls (``tool_calls.py``). With ``tool_choice: "none"`` the model does
  not see them and answers in text. ``tools`` must be a list of ``{"type": "function",
  "function": {"name": str, ...}}`` (also on ``/tokenize``).
- Messages reach the template as the model's templates expect them: text parts joined,
  an assistant's ``tool_calls`` arguments (JSON text on the wire) parsed into objects, its
  ``content: null`` as ``""``. Bad JSON there is a 400 naming the message.
- Log-probabilities as OpenAI asks for them: chat's ``logprobs: true`` with ``top_logprobs``
  alternatives (0-20), completions' ``logprobs: N`` (0-20, OpenAI allows 5); both become
  ``SamplingParams.logprobs`` (the model's raw log-probabilities: ``engine/logprobs.py``).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from nanograph.engine.prompts import check_tools, prompt_token_ids
from nanograph.engine.sampling_params import MAX_CHOICES, MAX_LOGPROBS, SamplingParams

# OpenAI's legacy completions default; chat completions default to the rest of the context
COMPLETION_DEFAULT_MAX_TOKENS = 16


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status,
            message,
            type_,
            param,
            code,
        )
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: every chunk carries the usage so far


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None  # vLLM's extension
    ignore_eos: bool = False  # vLLM's extension: generate max_tokens tokens whatever comes
    # vLLM's extension: each choice (and stream chunk) also carries its output token ids
    return_token_ids: bool = False
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None  # vLLM's extension (transformers' definition)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    response_format: Any = None  # structured outputs: OpenAI's ...
    guided_json: Any = None  # ... vLLM's extensions ...
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structured_outputs: Any = None
    regex: Any = None  # ... and SGLang's
    json_schema: Any = None
    ebnf: Any = None
    min_tokens: int | None = None  # vLLM's
    prompt_logprobs: int | None = None  # vLLM's
    include_stop_str_in_output: bool | None = None  # vLLM's
    truncate_prompt_tokens: int | None = None  # vLLM's
    allowed_token_ids: list[int] | None = None  # vLLM's
    bad_words: list[str] | None = None  # vLLM's


class ChatRequest(_Request):
    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    functions: list[Any] | None = None  # OpenAI's deprecated form of tools
    function_call: str | dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    # vLLM's and SGLang's extension: the chat template's variables (Qwen3's enable_thinking)
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


class TokenizeRequest(BaseModel):
    """vLLM's ``/tokenize``: a completion prompt or a conversation."""

    model_config = ConfigDict(extra="ignore", strict=True)
    model: str | None = None
    prompt: str | list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Any] | None = None  # vLLM's: for the chat template


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str | None = None
    tokens: list[int]


def echoed_prompts(tokenizer: Any, request: CompletionRequest, ids: list[list[int]]) -> list[str]:
    """Each prompt's text for ``echo``: as given, or the ids it ran as (``ids``: cut by
    ``truncate_prompt_tokens``) decoded."""
    return [p if isinstance(p, str) and request.truncate_prompt_tokens is None
            else "" if tokenizer is None else tokenizer.decode(i)
            for p, i in zip(_prompt_batch(request), ids)]  # fmt: skip


def _prompt_batch(request: CompletionRequest) -> list:
    """The request's prompts: a string or a token-id list is one prompt; a list of them, many."""
    prompt = request.prompt
    many = isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list)
    return prompt if many else [prompt]


def tokenize(tokenizer: Any, request: TokenizeRequest) -> list[int]:
    """The ids the completions or chat endpoint would run for the same prompt or messages."""
    if (request.prompt is None) == (request.messages is None):
        raise ApiError(400, "give either prompt or messages", param="prompt")
    if request.messages is not None:
        _check_tools(request.tools)
        return _chat_ids(
            tokenizer, request.messages, request.chat_template_kwargs, request.tools or None
        )
    return _prompt_ids(tokenizer, request.prompt, "prompt")


def detokenize(tokenizer: Any, request: DetokenizeRequest) -> str:
    if tokenizer is None:
        raise ApiError(400, "this model has no tokenizer: it takes and gives token ids only")
    vocab = tokenizer.vocab_size
    bad = next((t for t in request.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise ApiError(
            400, f"token id {bad} is outside the vocabulary (0..{vocab - 1})", param="tokens"
        )
    return tokenizer.decode(request.tokens)


def parse(model: type[BaseModel], body: Any) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        # union members appear in the location ("stop", "str"): name the request's field only
        loc = [str(p) for p in first["loc"] if not str(p).startswith(("str", "list", "int"))]
        param = ".".join(loc) or None
        where = f"{param}: " if param else "the request body: "
        raise ApiError(400, where + first["msg"], param=param) from None


def refuse_unsupported(request: _Request, tool_call_parser: str | None = None) -> None:
    """``tool_call_parser``: the server's ``--tool-call-parser`` (None: tools are refused)."""
    if not 1 <= request.n <= MAX_CHOICES:
        raise ApiError(
            400, f"n must be an integer in [1, {MAX_CHOICES}], got {request.n}", param="n"
        )
    if isinstance(request, ChatRequest) and request.top_logprobs is not None:
        if not request.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        if not 0 <= request.top_logprobs <= MAX_LOGPROBS:
            raise ApiError(
                400,
                f"top_logprobs must be an integer in [0, {MAX_LOGPROBS}], "
                f"got {request.top_logprobs}",
                param="top_logprobs",
            )
    no = "is not supported by this server"
    unsupported = [
        ("best_of", (getattr(request, "best_of", None) or 1) != 1, no),
        ("suffix", bool(getattr(request, "suffix", None)), no),
    ]
    for name, asked, why in unsupported:
        if asked:
            raise ApiError(400, f"{name} {why}: leave it out", param=name)
    if isinstance(request, ChatRequest):
        _refuse_beyond_text(request, tool_call_parser)  # the tools checked before they are read
    structured_outputs(request)  # its errors before the prompt is read


# the request fields that ask for a structured output -> StructuredOutputs' field for each:
# vLLM's, then SGLang's (response_format, OpenAI's, is read apart)
_FORMS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
          "guided_grammar": "grammar", "regex": "regex", "json_schema": "json",
          "ebnf": "grammar"}  # fmt: skip


def structured_source(request: _Request) -> str | None:
    """The field a request asked for its structured output with (None: none)."""
    return next(iter(_asked_forms(request)), None)


def _asked_forms(request: _Request) -> list[str]:
    form = request.response_format
    text = form is None or (isinstance(form, dict) and form.get("type", "text") == "text")
    named = [n for n in ("structured_outputs", *_FORMS) if getattr(request, n) is not None]
    forced = ["tool_choice"] if forces_tool_call(request) else []
    return ([] if text else ["response_format"]) + forced + named


def structured_outputs(request: _Request) -> dict[str, Any] | None:
    """``SamplingParams.structured_outputs`` of a request: OpenAI's ``response_format``
    (``json_object``, or ``json_schema`` with its ``schema``; vLLM's ``structural_tag``),
    vLLM's ``structured_outputs``
    and ``guided_*`` fields, SGLang's ``regex``, ``json_schema`` (JSON text) and ``ebnf``; at
    most one of them."""
    asked = _asked_forms(request)
    if len(asked) > 1:
        raise ApiError(400, f"{' and '.join(asked)} each ask for a structured output: give one",
                       param=asked[1])  # fmt: skip
    if not asked:
        return None
    name = asked[0]
    if name == "response_format":
        return _response_format(request.response_format)
    if name == "tool_choice":
        return {"json": forced_tool_schema(request)}
    if name == "structured_outputs":
        if not isinstance(request.structured_outputs, dict):
            raise ApiError(400, "structured_outputs must be an object, e.g. "
                           '{"json": {...schema...}} or {"regex": "..."}', param=name)  # fmt: skip
        return request.structured_outputs
    return {_FORMS[name]: getattr(request, name)}


def _response_format(form: Any) -> dict[str, Any]:
    kind = form.get("type") if isinstance(form, dict) else None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = form.get("json_schema")
        if isinstance(spec, dict) and isinstance(spec.get("schema"), dict):
            return {"json": spec["schema"]}
        raise ApiError(400, 'response_format json_schema needs {"json_schema": {"name": ..., '
                       '"schema": {...}}}', param="response_format")  # fmt: skip
    if kind == "structural_tag":  # vLLM's: the whole object, in either of its two forms
        return {"structural_tag": form}
    raise ApiError(400, "response_format type must be text, json_object, json_schema or "
                   f"structural_tag, got {kind!r}", param="response_format")  # fmt: skip


def _refuse_beyond_text(request: ChatRequest, tool_call_parser: str | None) -> None:
    """Chat's answers other than text and tool calls: the deprecated functions (unless their
    choice is "none"), tool choices of no known form (a forced one's tools and name are
    checked too), tools with "auto" but no parser to read the calls, and audio."""
    if request.function_call != "none" and (request.functions or request.function_call):
        raise ApiError(
            400,
            "functions and function_call (OpenAI's deprecated form) are not supported: send "
            'tools instead, or set function_call to "none" for an answer in text',
            param="functions" if request.functions else "function_call",
        )
    _check_tools(request.tools)
    choice = request.tool_choice
    if not isinstance(choice, dict) and choice not in (None, "auto", "none", "required"):
        raise ApiError(400, 'tool_choice must be "auto", "none", "required" or {"type": '
                       f'"function", "function": {{"name": ...}}}}, got {choice!r}',
                       param="tool_choice")  # fmt: skip
    forced_tool_schema(request)  # a forced choice's errors
    if uses_tools(request) and not forces_tool_call(request) and tool_call_parser is None:
        raise ApiError(
            400,
            "tool calling needs a tool-call parser: start the server with --tool-call-parser "
            'hermes (the Hermes/Qwen format), or set tool_choice to "none" for an answer in text',
            param="tools",
        )
    if request.audio is not None or any(m != "text" for m in request.modalities or ()):
        raise ApiError(
            400, "this server answers in text only: leave audio and modalities out",
            param="audio" if request.audio is not None else "modalities",
        )  # fmt: skip


def uses_tools(request: ChatRequest) -> bool:
    """Whether the model sees the request's tools and its answer is read for tool calls."""
    return bool(request.tools) and request.tool_choice != "none"


def forces_tool_call(request: _Request) -> bool:
    """``tool_choice`` ``"required"`` or a named function (vLLM's: a structured output)."""
    choice = getattr(request, "tool_choice", None)
    return choice == "required" or isinstance(choice, dict)


def forced_tool_name(request: ChatRequest) -> str | None:
    """The function a named ``tool_choice`` calls (None for ``"required"``)."""
    choice = request.tool_choice
    return choice["function"]["name"] if isinstance(choice, dict) else None


def forced_tool_schema(request: _Request) -> dict[str, Any] | None:
    """The JSON schema a forcing ``tool_choice`` constrains the answer to, as vLLM's: the named
    function's parameters, or for ``"required"`` a list of at least one ``{"name",
    "parameters"}`` of the tools (None when the choice forces nothing)."""
    if not forces_tool_call(request):
        return None
    tools = {t["function"]["name"]: t["function"] for t in request.tools or ()}
    if not tools:
        raise ApiError(400, f"tool_choice {request.tool_choice!r} needs tools", param="tools")
    params = lambda f: f.get("parameters") or {"type": "object", "properties": {}}  # noqa: E731
    choice = request.tool_choice
    if choice == "required":
        calls = [{"type": "object", "required": ["name", "parameters"],
                  "properties": {"name": {"enum": [name]}, "parameters": params(f)}}
                 for name, f in tools.items()]  # fmt: skip
        return {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    function = choice.get("function") if choice.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise ApiError(400, 'a named tool_choice is {"type": "function", "function": {"name": '
                       '...}}', param="tool_choice")  # fmt: skip
    if name not in tools:
        raise ApiError(400, f"tool_choice names {name!r}, which is not among the tools",
                       param="tool_choice")  # fmt: skip
    return params(tools[name])


def _check_tools(tools: list | None) -> None:
    try:
        check_tools(tools)
    except ValueError as e:
        raise ApiError(400, str(e), param="tools") from None


def chat_prompt_ids(tokenizer: Any, request: ChatRequest) -> list[int]:
    tools = request.tools if uses_tools(request) else None
    return _chat_ids(tokenizer, request.messages, request.chat_template_kwargs, tools)


def _chat_ids(
    tokenizer: Any, messages: list, template_kwargs: dict[str, Any] | None, tools: list | None
) -> list[int]:
    conversation = [_template_message(i, m) for i, m in enumerate(messages)]
    try:
        return prompt_token_ids(tokenizer, conversation, template_kwargs, tools)
    except ValueError as e:
        param = "chat_template_kwargs" if str(e).startswith("chat_template_kwargs") else "messages"
        raise ApiError(400, str(e), param=param) from None


def completion_prompts(tokenizer: Any, request: CompletionRequest) -> list[list[int]]:
    """The token ids of each prompt: one string or token-id list, or a list of them (a batch,
    answered as ``n`` choices per prompt, prompt by prompt)."""
    batch = _prompt_batch(request)
    if len(batch) * request.n > MAX_CHOICES:
        raise ApiError(
            400,
            f"{len(batch)} prompts x n={request.n} make {len(batch) * request.n} choices: at "
            f"most {MAX_CHOICES} per request; send several requests instead",
            param="prompt",
        )
    return [_prompt_ids(tokenizer, p, "prompt") for p in batch]


def _prompt_ids(tokenizer: Any, prompt: Any, param: str) -> list[int]:
    try:
        return prompt_token_ids(tokenizer, prompt)
    except ValueError as e:
        raise ApiError(400, str(e), param=param) from None


def _template_message(i: int, message: dict[str, Any]) -> dict[str, Any]:
    """A message as chat templates take it: content parts joined into text, and an assistant's
    tool calls with their arguments as objects (their content may be null). An assistant's
    thinking sent back as ``reasoning`` (vLLM's name) or ``reasoning_content`` (SGLang's, and
    what Qwen3's and DeepSeek-R1's templates read) is given to the template under both."""
    message = _flatten(i, message)
    if message.get("role") != "assistant":
        return message
    thought = message.get("reasoning_content", message.get("reasoning"))
    if thought is not None:
        message = {**message, "reasoning": thought, "reasoning_content": thought}
    calls = message.get("tool_calls")
    if calls is None:
        return message
    if not isinstance(calls, list):
        raise ApiError(400, f"messages[{i}].tool_calls must be a list",
                       param=f"messages[{i}].tool_calls")  # fmt: skip
    content = message.get("content")
    return {**message, "content": "" if content is None else content,
            "tool_calls": [_template_call(i, j, c) for j, c in enumerate(calls)]}  # fmt: skip


def _template_call(i: int, j: int, call: Any) -> dict[str, Any]:
    """OpenAI's ``{"id", "type", "function": {"name", "arguments": JSON text}}`` with the
    arguments parsed: Qwen's templates write them with ``tojson`` (vLLM parses them too)."""
    where = f"messages[{i}].tool_calls[{j}]"
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ApiError(400, f'{where} needs a "function" with a "name" string',
                       param=f"messages[{i}].tool_calls")  # fmt: skip
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError) as e:
            raise ApiError(
                400, f"{where}.function.arguments is not valid JSON: {e}",
                param=f"messages[{i}].tool_calls",
            ) from None  # fmt: skip
    return {**call, "function": {**function, "arguments": arguments}}


def _flatten(i: int, message: dict[str, Any]) -> dict[str, Any]:
    """A message whose content is a list of parts becomes one with text content: text parts
    are joined with newlines (as vLLM does); any other part (images, audio) is refused."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ApiError(
                400,
                f"messages[{i}].content[{j}] is of type {kind!r}: this server "
                "takes text parts only",
                param=f"messages[{i}].content",
            )
        if not isinstance(part.get("text"), str):
            raise ApiError(
                400,
                f"messages[{i}].content[{j}] needs a 'text' string",
                param=f"messages[{i}].content",
            )
        texts.append(part["text"])
    return {**message, "content": "\n".join(texts)}


def sampling_params(request: _Request, prompt_len: int, max_model_len: int) -> SamplingParams:
    max_tokens = request.max_tokens
    if isinstance(request, ChatRequest) and request.max_completion_tokens is not None:
        max_tokens = request.max_completion_tokens
    if max_tokens is None:
        max_tokens = (
            COMPLETION_DEFAULT_MAX_TOKENS
            if isinstance(request, CompletionRequest)
            else max(1, max_model_len - prompt_len)
        )
    given = {
        "max_tokens": max_tokens,
        "min_tokens": request.min_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": request.top_k,
        "min_p": request.min_p,
        "seed": request.seed,
        "stop": request.stop,
        "stop_token_ids": request.stop_token_ids,
        "ignore_eos": request.ignore_eos,
        "include_stop_str_in_output": request.include_stop_str_in_output,
        "presence_penalty": request.presence_penalty,
        "frequency_penalty": request.frequency_penalty,
        "repetition_penalty": request.repetition_penalty,
        "logit_bias": _logit_bias(request),
        "logprobs": _logprobs(request),
        "prompt_logprobs": _prompt_logprobs(request),
        "truncate_prompt_tokens": request.truncate_prompt_tokens,
        "allowed_token_ids": request.allowed_token_ids,
        "bad_words": request.bad_words,
        "structured_outputs": structured_outputs(request),
        "n": request.n,
    }
    try:
        return SamplingParams(**{k: v for k, v in given.items() if v is not None})
    except ValueError as e:
        message = str(e)
        param = message.split(" ", 1)[0].split("[", 1)[0].split(".", 1)[0]
        if param == "structured_outputs":
            param = structured_source(request)
        elif param not in given:
            param = None
        elif param == "max_tokens" and getattr(request, "max_completion_tokens", None) is not None:
            param = "max_completion_tokens"
        raise ApiError(400, message, param=param) from None


def _logprobs(request: _Request) -> int | None:
    """The alternatives per token the request asks for, or None for no logprobs."""
    if isinstance(request, ChatRequest):
        return (request.top_logprobs or 0) if request.logprobs else None
    return request.logprobs  # completions: the count itself


def _prompt_logprobs(request: _Request) -> int | None:
    """The alternatives per prompt token the engine scores: vLLM's ``prompt_logprobs``, and
    completions' ``echo`` with ``logprobs`` (the echoed prompt's)."""
    asked = request.prompt_logprobs
    if getattr(request, "echo", False) and request.logprobs is not None:
        return max(asked or 0, request.logprobs)
    return asked


def _logit_bias(request: _Request) -> dict[int, float] | None:
    """OpenAI's ``{"<token id>": bias}`` with the ids as integers."""
    if request.logit_bias is None:
        return None
    bias = {}
    for key, value in request.logit_bias.items():
        try:
            bias[int(key)] = value
        except ValueError:
            raise ApiError(
                400, f"logit_bias keys must be token ids, got {key!r}", param="logit_bias"
            ) from None
    return bias
