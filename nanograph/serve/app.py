"""The FastAPI app: OpenAI's chat and completions endpoints (streamed as server-sent events and
not), models, vLLM's tokenize and detokenize, health and metrics, over the engine's front.

Invariants:
- Handlers only check input, enqueue through the front and await their request's updates;
  they never touch the engine. A bad request gets its 4xx (OpenAI's error body) before anything
  is enqueued, or, for what only the engine can judge (context length, vocabulary, pool size),
  as soon as the engine refuses it, before any byte of a stream is sent.
- A request whose client goes away (a closed stream, a disconnect while a non-streamed answer
  is computed) is aborted at once: its KV pages go back to the pool.
- An exception while serving one request fails that request (500, or an error event inside a
  stream that already started) and nothing else.
- A chat request that offers tools reads each choice's text through its own
  ``ToolCallParser``, streamed or whole alike: a whole message's content and tool calls are
  what its stream's deltas add up to.
- With a ``--reasoning-parser``, each chat choice's text first goes through its own
  ``ReasoningParser`` (``reasoning.py``): the reasoning is ``message.reasoning`` and
  ``message.reasoning_content`` (vLLM's name and SGLang's; null when none; streamed as
  ``delta.reasoning`` and ``delta.reasoning_content``) and only the content goes on to
  the tool-call parser, so a ``<tool_call>`` written while thinking is no call. Streamed
  reasoning and content deltas add up to the whole message's. Without the flag no message or
  chunk has the key; completions are never parsed; usage and logprobs count every token.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from nanograph.engine.front import (
    Front,
    QueueFull,
    RequestRejected,
    RequestStream,
    ShuttingDown,
    Update,
)
from nanograph.engine.prompts import truncate
from nanograph.serve import protocol
from nanograph.serve.logprobs import LogprobFormat, merge
from nanograph.serve.metrics import ServerMetrics
from nanograph.serve.protocol import ApiError, ChatRequest, CompletionRequest
from nanograph.serve.reasoning import REASONING_PARSERS, ReasoningParser, thinking_on
from nanograph.serve.text import TextStream
from nanograph.serve.tool_calls import (
    TOOL_CALL_PARSERS,
    ForcedCalls,
    ToolCall,
    ToolCallParser,
    openai_tool_call,
)

logger = logging.getLogger("nanograph")
RETRY_AFTER_S = 1  # what a 503 (queue full) tells the client to wait
ENGINE_WATCH_S = 0.5  # how often the lifespan looks whether the engine's loop has failed


def build_app(
    front: Front, model_name: str, api_key: str | None = None, shutdown_timeout: float = 10,
    tool_call_parser: str | None = None, reasoning_parser: str | None = None,
    on_engine_failure: Callable[[], None] | None = None,
) -> FastAPI:  # fmt: skip
    """``tool_call_parser``: the format tool calls are read in (``TOOL_CALL_PARSERS``); None
    refuses requests that offer the model tools. ``reasoning_parser``: how chat answers'
    reasoning is split from their content (``REASONING_PARSERS``); None leaves it in the
    content. ``on_engine_failure``: called once if the engine's loop ends by itself (the
    server's shutdown; until then /health answers 503 and requests get 503)."""
    for kind, name, known in (("tool-call", tool_call_parser, TOOL_CALL_PARSERS),
                              ("reasoning", reasoning_parser, REASONING_PARSERS)):  # fmt: skip
        if name is not None and name not in known:
            raise ValueError(f"unknown {kind} parser {name!r}: one of {', '.join(known)}")
    metrics = ServerMetrics(front)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        front.start()
        watch = None if on_engine_failure is None else asyncio.create_task(watch_engine())
        yield
        if watch is not None:
            watch.cancel()
        await asyncio.to_thread(front.stop, shutdown_timeout)

    async def watch_engine() -> None:
        while not front.failed:
            await asyncio.sleep(ENGINE_WATCH_S)
        logger.error("the engine stopped serving: shutting the server down")
        on_engine_failure()

    app = FastAPI(title="nanograph", lifespan=lifespan)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> JSONResponse:
        metrics.rejected.labels(str(e.status)).inc()
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception) -> JSONResponse:
        logger.exception("request failed")
        return await api_error(
            request, ApiError(500, f"internal error: {e!r}", "server_error", code="internal_error")
        )

    @app.get("/health")
    async def health() -> JSONResponse:
        s = front.stats
        body = {
            "status": "ok" if front.running else "stopped",
            "running": s.running,
            "waiting": s.waiting,
            "kv_pages_free": s.kv_pages_free,
            "kv_pages_available": s.kv_pages_available,  # free + evictable prefix-cached
            "kv_pages_total": s.kv_pages_total,
        }
        return JSONResponse(body, status_code=200 if front.running else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        _authorize(request, api_key)
        card = {
            "id": model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "nanograph",
            "max_model_len": front.max_model_len,
        }
        return JSONResponse({"object": "list", "data": [card]})

    @app.post("/tokenize")
    async def tokenize(http: Request) -> JSONResponse:
        """vLLM's: the token ids a prompt (or a conversation) runs as."""
        request = protocol.parse(protocol.TokenizeRequest, await _json_body(http))
        _check_model(request.model, model_name)
        ids = protocol.tokenize(front.tokenizer, request)
        return JSONResponse(
            {"count": len(ids), "max_model_len": front.max_model_len, "tokens": ids}
        )

    @app.post("/detokenize")
    async def detokenize(http: Request) -> JSONResponse:
        request = protocol.parse(protocol.DetokenizeRequest, await _json_body(http))
        _check_model(request.model, model_name)
        return JSONResponse({"prompt": protocol.detokenize(front.tokenizer, request)})

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await _complete(request, ChatRequest)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _complete(request, CompletionRequest)

    async def _json_body(http: Request) -> Any:
        _authorize(http, api_key)
        try:
            return json.loads(await http.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the request body is not valid JSON: {e}") from None

    async def _complete(http: Request, kind: type) -> Response:
        request = protocol.parse(kind, await _json_body(http))
        _check_model(request.model, model_name)
        protocol.refuse_unsupported(request, tool_call_parser)
        chat = kind is ChatRequest
        prompts = (
            [protocol.chat_prompt_ids(front.tokenizer, request)] if chat
            else protocol.completion_prompts(front.tokenizer, request)
        )  # fmt: skip
        # cut first: the default max_tokens is what the context leaves
        prompts = [
            truncate(p, request.truncate_prompt_tokens, front.max_model_len) for p in prompts
        ]
        choices = []  # (prompt, parameters): n per prompt, prompt by prompt
        for prompt in prompts:
            params = protocol.sampling_params(request, len(prompt), front.max_model_len)
            choices += [(prompt, choice) for choice in params.choices()]
        streams: list[RequestStream] = []  # one per choice: n per prompt, prompt by prompt
        admitted = False
        try:
            for prompt, params in choices:
                streams.append(front.submit(prompt, params))
            for stream in streams:
                await stream.admitted()
            admitted = True
        except QueueFull as e:
            raise ApiError(
                503,
                f"{e}: retry later",
                "server_error",
                code="queue_full",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            ) from None
        except ShuttingDown as e:
            raise ApiError(503, str(e), "server_error", code="shutting_down") from None
        except RequestRejected as e:  # the prompt, or a token id only the engine can judge
            param = next((p for p in ("logit_bias", "allowed_token_ids", "bad_words")
                          if str(e).startswith(p)), None)  # fmt: skip
            if str(e).startswith("structured_outputs"):
                param = protocol.structured_source(request)
            raise ApiError(400, str(e), param=param or ("messages" if chat else "prompt")) from None
        finally:  # whatever went wrong, no choice of this request stays in the engine
            if not admitted:
                for stream in streams:
                    front.abort(stream)
        echoed = None
        if not chat and request.echo:
            echoed = protocol.echoed_prompts(front.tokenizer, request, prompts)
        reasoning = reasoning_parser if chat else None  # completions are not parsed (vLLM's)
        answer = _Answer(front, streams, request, chat, model_name, metrics, echoed, reasoning)
        if request.stream:
            return StreamingResponse(answer.events(), media_type="text/event-stream")
        return await _until_disconnect(http, answer.whole(), answer.abandon)

    return app


def _check_model(asked: str | None, served: str) -> None:
    if asked is not None and asked != served:
        raise ApiError(
            404,
            f"model {asked!r} does not exist: this server serves {served!r}",
            param="model",
            code="model_not_found",
        )


def _authorize(request: Request, api_key: str | None) -> None:
    if api_key is None:
        return
    given = request.headers.get("authorization", "").encode()
    if not hmac.compare_digest(given, f"Bearer {api_key}".encode()):  # constant time
        raise ApiError(
            401, "invalid API key: send 'Authorization: Bearer <key>'", code="invalid_api_key"
        )


async def _until_disconnect(http: Request, work, abandon) -> Response:
    """Awaits ``work``; if the client disconnects first (or this handler is cancelled), the work
    is cancelled and ``abandon`` runs."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await http.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait([task, watcher], return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            abandon()
    if task.cancelled():
        return Response(status_code=499)  # nobody reads it
    return task.result()


@dataclass(frozen=True)
class _Delta:
    """What a choice may send after an update: reasoning, content, tool calls opened (whole,
    or the start of one whose arguments stream) and arguments continuing the last one."""

    reasoning: str
    content: str
    calls: tuple[ToolCall, ...] = ()
    arguments: str = ""

    def __bool__(self) -> bool:  # anything to send
        return bool(self.reasoning or self.content or self.calls or self.arguments)


class _Choice:
    """One choice of an answer: its request's stream, text, reasoning, tool calls and logprobs
    so far."""

    def __init__(
        self, index: int, front: Front, stream: RequestStream, chat: bool,
        calls: Callable[[], ToolCallParser | ForcedCalls] | None,
        reasoning_parser: str | None = None, thinking: bool = True,
    ) -> None:  # fmt: skip
        self.index, self.stream = index, stream
        self.text = TextStream(front.tokenizer, stream.params.stop)
        self.reasoning = (None if reasoning_parser is None
                          else ReasoningParser(reasoning_parser, thinking))  # fmt: skip
        self.tool_calls = None if calls is None else calls()
        count = stream.params.logprobs
        self.logprobs = None if count is None else LogprobFormat(front.tokenizer, chat, count)
        self.prompt_scores = None  # the engine's scores of the prompt, when it sends them
        self.prompt_due = True  # its prompt chunk (stream) is not sent yet
        self.unsent: tuple[list[int], list] = ([], [])  # tokens no chunk carried yet
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.calls_sent = 0  # tool calls streamed: the next one's index
        self.finished = False
        self.last = stream.arrival  # when its last tokens came (inter-token latency)

    def advance(self, update: Update) -> _Delta:
        """What may be sent now that ``update`` came: the text's reasoning split off first,
        then the content read for tool calls."""
        if update.finished:
            text = self.text.final(update.token_ids, update.text)
        else:
            text = self.text.feed(update.token_ids)
        reasoning = ""
        if self.reasoning is not None:
            split = self.reasoning.feed(text)
            if update.finished:
                split += self.reasoning.finish()
            reasoning, text = split.reasoning, split.content
        if self.tool_calls is None:
            return _Delta(reasoning, text)
        parsed = self.tool_calls.feed(text)
        if update.finished:
            parsed += self.tool_calls.finish()
        calls, arguments = parsed.calls, parsed.arguments
        if calls and arguments:  # one delta: the last call opened takes its continuation
            last = calls[-1]
            calls = (*calls[:-1], ToolCall(last.name, last.arguments + arguments))
            arguments = ""
        return _Delta(reasoning, parsed.content, calls, arguments)

    def finish_reason(self, update: Update) -> str:
        """The engine's, or "tool_calls" when the model stopped after calling tools."""
        called = self.tool_calls is not None and self.tool_calls.calls
        return "tool_calls" if called and update.finish_reason == "stop" else update.finish_reason

    def take_unsent(self) -> dict | None:
        """The logprobs object of the tokens no chunk carried yet (None without logprobs)."""
        ids, logprobs = self.unsent
        if self.logprobs is None or not ids:
            return None
        self.unsent = ([], [])
        return self.logprobs(ids, logprobs)


class _Answer:
    """One admitted request's answer (``n`` choices per prompt, one engine request each), as
    a whole or as OpenAI stream chunks."""

    def __init__(
        self, front: Front, streams: list[RequestStream], request: Any, chat: bool, model: str,
        metrics: ServerMetrics, echoed: list[str] | None = None,
        reasoning_parser: str | None = None,
    ) -> None:  # fmt: skip
        self.front, self.request, self.chat = front, request, chat
        self.reasoning_parser = reasoning_parser
        calls = None  # how each choice's answer is read for tool calls
        if chat and protocol.uses_tools(request):
            calls = ToolCallParser
            if protocol.forces_tool_call(request):
                calls = functools.partial(ForcedCalls, protocol.forced_tool_name(request))
        # a structured output holds the answer from its first token: it opens no think block
        thinking = (chat and thinking_on(request.chat_template_kwargs)
                    and protocol.structured_source(request) is None)  # fmt: skip
        self.choices = [_Choice(i, front, s, chat, calls, reasoning_parser, thinking)
                        for i, s in enumerate(streams)]  # fmt: skip
        # completions' echo: each prompt's text in front of its choices' text
        self.echoed = [echoed[i // request.n] for i in range(len(streams))] if echoed else None
        self.firsts = self.choices[:: request.n]  # the first choice of each prompt
        self.metrics = metrics
        prefix = "chatcmpl" if chat else "cmpl"
        self.id, self.created, self.model = f"{prefix}-{uuid.uuid4().hex}", int(time.time()), model
        self.object = "chat.completion" if chat else "text_completion"
        options = request.stream_options
        self.include_usage = options is not None and bool(options.include_usage)
        # vLLM's: with include_usage, every chunk's usage is the answer's so far (not null)
        self.continuous_usage = self.include_usage and bool(options.continuous_usage_stats)
        # a stream chunk's constant part, encoded once (``_event``)
        head = {"id": self.id, "object": self.object + ".chunk" if chat else self.object,
                "created": self.created, "model": self.model}  # fmt: skip
        self._event_head = f'data: {json.dumps(head, ensure_ascii=False)[:-1]}, "choices": '

    def _observe(self, choice: _Choice, update: Update) -> None:
        now = time.perf_counter()
        n = len(update.token_ids)
        if n:
            if choice.completion_tokens == 0:
                self.metrics.ttft.observe(now - choice.stream.arrival)
            else:
                for _ in range(n):
                    self.metrics.itl.observe((now - choice.last) / n)
            choice.last = now
        choice.completion_tokens += n
        if update.prompt_logprobs is not None:
            choice.prompt_scores = update.prompt_logprobs
        if choice.logprobs is not None:  # only logprobs objects need the tokens kept
            choice.unsent[0].extend(update.token_ids)
            choice.unsent[1].extend(update.logprobs or [])
        if update.finished:
            choice.finished = True
            choice.cached_tokens = update.cached_tokens
            self.metrics.finished.labels(update.finish_reason or "error").inc()
            self.metrics.e2e.observe(now - choice.stream.arrival)

    @staticmethod
    def _failure(update: Update) -> ApiError:
        if update.finish_reason == "abort":  # only the shutdown aborts a request it serves
            return ApiError(503, update.error or "aborted", "server_error", code="shutting_down")
        return ApiError(
            500, update.error or "internal error", "server_error", code="internal_error"
        )

    def usage(self) -> dict:
        """Each prompt counted once (its n choices share it), every choice's tokens."""
        prompt = sum(len(c.stream.prompt_ids) for c in self.firsts)
        completion = sum(c.completion_tokens for c in self.choices)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            # a prompt's cached part as its first choice saw it
            "prompt_tokens_details": {"cached_tokens": sum(c.cached_tokens for c in self.firsts)},
        }

    async def whole(self) -> Response:
        try:
            choices = await asyncio.gather(*(self._whole_choice(c) for c in self.choices))
        except BaseException:  # one choice failed (or the client left): the others stop too
            self.abandon()
            raise
        return JSONResponse(
            {
                "id": self.id,
                "object": self.object,
                "created": self.created,
                "model": self.model,
                "choices": list(choices),
                "usage": self.usage(),
            }
        )

    async def _whole_choice(self, choice: _Choice) -> dict:
        reasoning, text, calls, tokens, last = [], [], [], [], None
        async for update in choice.stream.updates():
            self._observe(choice, update)
            tokens += update.token_ids
            delta = choice.advance(update)
            reasoning.append(delta.reasoning)
            text.append(delta.content)
            calls += delta.calls
            if delta.arguments:  # the last call's arguments go on
                calls[-1] = ToolCall(calls[-1].name, calls[-1].arguments + delta.arguments)
            if update.finished:
                last = update
        if last.finish_reason not in ("stop", "length"):
            raise self._failure(last)
        content = "".join(text)
        if self.echoed is not None:
            content = self.echoed[choice.index] + content
        prompt = self._prompt_parts(choice)  # before the answer's logprobs: its offsets first
        body = {
            "index": choice.index, "finish_reason": choice.finish_reason(last),
            "stop_reason": last.stop_reason,
            "logprobs": merge(prompt.pop("logprobs", None), choice.take_unsent()),
            **prompt,
        }  # fmt: skip
        if self.request.return_token_ids:
            body["token_ids"] = tokens
        if not self.chat:
            body["text"] = content
            return body
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if self.reasoning_parser is not None:
            thought = "".join(reasoning) or None
            message["reasoning"] = message["reasoning_content"] = thought
            if thought is not None:  # all reasoning: no content (vLLM's null)
                message["content"] = content or None
        if calls:  # the calls alone: no content (vLLM's null)
            message["content"] = content or None
            message["tool_calls"] = [openai_tool_call(c) for c in calls]
        body["message"] = message
        return body

    def _prompt_parts(self, choice: _Choice) -> dict:
        """What a choice says of its prompt: with completions' echo and logprobs, the echoed
        prompt's logprobs object (``logprobs``); with vLLM's ``prompt_logprobs``, its list."""
        scores, parts = choice.prompt_scores, {}
        if scores is None:
            return parts
        ids = choice.stream.prompt_ids
        if self.echoed is not None and choice.logprobs is not None:
            parts["logprobs"] = choice.logprobs.echoed(ids, scores)
        count = self.request.prompt_logprobs
        if count is not None:
            listed = LogprobFormat(self.front.tokenizer, self.chat, count)
            parts["prompt_logprobs"] = listed.prompt_list(ids, scores)
        return parts

    def _prompt_chunk(self, choice: _Choice) -> str | None:
        """A streamed choice's first chunk after its first update: the echoed prompt, its
        logprobs and vLLM's ``prompt_logprobs``, where asked (None: nothing to send)."""
        choice.prompt_due = False
        echo = None if self.echoed is None else self.echoed[choice.index]
        parts = self._prompt_parts(choice)
        if echo is None and not parts:
            return None
        body: dict[str, Any] = {"index": choice.index, "finish_reason": None,
                                "logprobs": parts.pop("logprobs", None), **parts}  # fmt: skip
        if self.chat:
            body["delta"] = {}
        else:
            body["text"] = echo or ""
        return self._event([body])

    def _chunk(
        self,
        choice: _Choice,
        delta: str | None,
        finish_reason: str | None = None,
        stop_reason: int | str | None = None,
        role: bool = False,
        token_ids: list[int] | None = None,
        calls: tuple[ToolCall, ...] = (),
        reasoning: str = "",
        arguments: str = "",
    ) -> str:
        body: dict[str, Any] = {
            "index": choice.index, "finish_reason": finish_reason,
            "logprobs": choice.take_unsent(),  # every token this chunk brings
        }  # fmt: skip
        if finish_reason is not None:  # vLLM's extension, on the chunk that ends the choice
            body["stop_reason"] = stop_reason
        if self.request.return_token_ids and token_ids is not None:
            body["token_ids"] = token_ids
        if self.chat:
            no_content = delta is None or ((calls or arguments or reasoning) and not delta)
            body["delta"] = {} if no_content else {"content": delta}
            if reasoning:
                body["delta"]["reasoning"] = body["delta"]["reasoning_content"] = reasoning
            if role:
                body["delta"]["role"] = "assistant"
            if calls:
                first = choice.calls_sent
                choice.calls_sent += len(calls)
                body["delta"]["tool_calls"] = [
                    openai_tool_call(c, first + i) for i, c in enumerate(calls)
                ]
            if arguments:  # OpenAI's delta of a streamed call: its index and arguments only
                body["delta"]["tool_calls"] = [
                    {"index": choice.calls_sent - 1, "function": {"arguments": arguments}}
                ]
        else:
            body["text"] = delta or ""
        return self._event([body])

    def _delta_chunk(self, choice: _Choice, delta: _Delta, token_ids: list[int]) -> str:
        return self._chunk(choice, delta.content, token_ids=token_ids, calls=delta.calls,
                           reasoning=delta.reasoning, arguments=delta.arguments)  # fmt: skip

    def _event(self, choices: list, usage: dict | None = None) -> str:
        """One server-sent event: the chunk object, its constant head encoded once per answer
        (a whole ``json.dumps`` a chunk took ~18 us of the ~80 us of server CPU a streamed
        token costs; the choices alone ~8), byte for byte what encoding it whole gives."""
        if usage is None and self.continuous_usage:
            usage = self.usage()
        tail = f', "usage": {json.dumps(usage, ensure_ascii=False)}' if self.include_usage else ""
        return f"{self._event_head}{json.dumps(choices, ensure_ascii=False)}{tail}}}\n\n"

    def abandon(self) -> None:
        """The client went away before the end: every unfinished choice's request is aborted,
        its pages freed."""
        for choice in self.choices:
            if not choice.finished:
                self.front.abort(choice.stream)
                self.metrics.finished.labels("abort").inc()

    async def _merged(self) -> AsyncIterator[tuple[_Choice, Update]]:
        """The choices' updates as they come (one stream: its own order)."""
        if len(self.choices) == 1:
            async for update in self.choices[0].stream.updates():
                yield self.choices[0], update
            return
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(choice: _Choice) -> None:
            async for update in choice.stream.updates():
                queue.put_nowait((choice, update))

        tasks = [asyncio.ensure_future(pump(c)) for c in self.choices]
        try:
            for _ in range(len(self.choices)):
                while True:
                    choice, update = await queue.get()
                    yield choice, update
                    if update.finished:
                        break
        finally:
            for task in tasks:
                task.cancel()

    async def events(self) -> AsyncIterator[str]:
        front = self.front
        try:
            for choice in self.choices:
                if self.chat:
                    yield self._chunk(choice, "", role=True)
            async with contextlib.aclosing(self._merged()) as updates:
                async for choice, update in updates:
                    self._observe(choice, update)
                    # the echo waits for the prompt's scores, which come with the first update
                    if choice.prompt_due and (chunk := self._prompt_chunk(choice)) is not None:
                        yield chunk
                    if not update.finished:
                        delta = choice.advance(update)
                        # one chunk per token step when there is no text to wait for
                        every_step = front.tokenizer is None or self.request.return_token_ids
                        if delta or every_step:
                            yield self._delta_chunk(choice, delta, update.token_ids)
                        continue
                    if update.finish_reason not in ("stop", "length"):
                        yield f"data: {json.dumps(self._failure(update).body())}\n\n"
                        break
                    delta = choice.advance(update)
                    if delta or update.token_ids:
                        yield self._delta_chunk(choice, delta, update.token_ids)
                    yield self._chunk(
                        choice, None, choice.finish_reason(update), update.stop_reason
                    )
                else:
                    if self.include_usage:
                        yield self._event([], self.usage())
            yield "data: [DONE]\n\n"
        finally:  # the client went away, the task was cancelled, or one choice failed
            self.abandon()
