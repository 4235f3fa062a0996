"""The FastAPI app: OpenAI's chat and completions endpoints (streamed as server-sent events and
not), models, health and metrics, over the engine's front.

Invariants:
- Handlers only check input, enqueue through the front and await their request's updates;
  they never touch the engine. A bad request gets its 4xx (OpenAI's error body) before anything
  is enqueued, or, for what only the engine can judge (context length, vocabulary, pool size),
  as soon as the engine refuses it, before any byte of a stream is sent.
- A request whose client goes away (a closed stream, a disconnect while a non-streamed answer
  is computed) is aborted at once: its KV pages go back to the pool.
- An exception while serving one request fails that request (500, or an error event inside a
  stream that already started) and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
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
from nanograph.serve import protocol
from nanograph.serve.logprobs import LogprobFormat
from nanograph.serve.metrics import ServerMetrics
from nanograph.serve.protocol import ApiError, ChatRequest, CompletionRequest
from nanograph.serve.text import TextStream

logger = logging.getLogger("nanograph")
RETRY_AFTER_S = 1  # what a 503 (queue full) tells the client to wait


def build_app(
    front: Front, model_name: str, api_key: str | None = None, shutdown_timeout: float = 10
) -> FastAPI:
    metrics = ServerMetrics(front)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        front.start()
        yield
        await asyncio.to_thread(front.stop, shutdown_timeout)

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

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await _complete(request, ChatRequest)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _complete(request, CompletionRequest)

    async def _complete(http: Request, kind: type) -> Response:
        _authorize(http, api_key)
        try:
            body = json.loads(await http.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the request body is not valid JSON: {e}") from None
        request = protocol.parse(kind, body)
        if request.model is not None and request.model != model_name:
            raise ApiError(
                404,
                f"model {request.model!r} does not exist: this server serves {model_name!r}",
                param="model",
                code="model_not_found",
            )
        protocol.refuse_unsupported(request)
        chat = kind is ChatRequest
        prompt = (protocol.chat_prompt_ids if chat else protocol.completion_prompt_ids)(
            front.tokenizer, request
        )
        params = protocol.sampling_params(request, len(prompt), front.max_model_len)
        try:
            stream = front.submit(prompt, params)
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
        try:
            await stream.admitted()
        except RequestRejected as e:  # the prompt, or a token id only the engine can judge
            param = "logit_bias" if str(e).startswith("logit_bias") else None
            raise ApiError(400, str(e), param=param or ("messages" if chat else "prompt")) from None
        except BaseException:
            front.abort(stream)
            raise
        answer = _Answer(front, stream, request, chat, model_name, metrics)
        if request.stream:
            return StreamingResponse(answer.events(), media_type="text/event-stream")
        return await _until_disconnect(http, answer.whole(), answer.abandon)

    return app


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


class _Answer:
    """One admitted request's answer, as a whole or as OpenAI stream chunks."""

    def __init__(
        self, front: Front, stream: RequestStream, request: Any, chat: bool, model: str,
        metrics: ServerMetrics,
    ) -> None:  # fmt: skip
        self.front, self.stream, self.request, self.chat = front, stream, request, chat
        self.text = TextStream(front.tokenizer, stream.params.stop)
        self.metrics = metrics
        prefix = "chatcmpl" if chat else "cmpl"
        self.id, self.created, self.model = f"{prefix}-{uuid.uuid4().hex}", int(time.time()), model
        self.object = "chat.completion" if chat else "text_completion"
        self.completion_tokens = 0
        self.cached_tokens = 0
        self._last = stream.arrival
        count = stream.params.logprobs
        self.logprobs = None if count is None else LogprobFormat(front.tokenizer, chat, count)
        self._unsent: tuple[list[int], list] = ([], [])  # tokens no chunk carried yet

    def _observe(self, update: Update) -> None:
        now = time.perf_counter()
        n = len(update.token_ids)
        if n:
            if self.completion_tokens == 0:
                self.metrics.ttft.observe(now - self.stream.arrival)
            else:
                for _ in range(n):
                    self.metrics.itl.observe((now - self._last) / n)
            self._last = now
        self.completion_tokens += n
        if update.finished:
            self.cached_tokens = update.cached_tokens
            self.metrics.finished.labels(update.finish_reason or "error").inc()
            self.metrics.e2e.observe(now - self.stream.arrival)

    @staticmethod
    def _failure(update: Update) -> ApiError:
        if update.finish_reason == "abort":  # only the shutdown aborts a request it serves
            return ApiError(503, update.error or "aborted", "server_error", code="shutting_down")
        return ApiError(
            500, update.error or "internal error", "server_error", code="internal_error"
        )

    def usage(self) -> dict:
        prompt = len(self.stream.prompt_ids)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": self.completion_tokens,
            "total_tokens": prompt + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    async def whole(self) -> Response:
        text, tokens, logprobs, last = [], [], [], None
        async for update in self.stream.updates():
            self._observe(update)
            tokens += update.token_ids
            logprobs += update.logprobs or []
            if update.finished:
                last = update
                text.append(self.text.final(update.token_ids, update.text))
            else:
                text.append(self.text.feed(update.token_ids))
        if last.finish_reason not in ("stop", "length"):
            raise self._failure(last)
        content = "".join(text)
        choice = {
            "index": 0, "finish_reason": last.finish_reason,
            "logprobs": None if self.logprobs is None else self.logprobs(tokens, logprobs),
        }  # fmt: skip
        if self.request.return_token_ids:
            choice["token_ids"] = tokens
        choice.update(
            {"message": {"role": "assistant", "content": content}}
            if self.chat
            else {"text": content}
        )
        return JSONResponse(
            {
                "id": self.id,
                "object": self.object,
                "created": self.created,
                "model": self.model,
                "choices": [choice],
                "usage": self.usage(),
            }
        )

    def _chunk(
        self,
        delta: str | None,
        finish_reason: str | None = None,
        role: bool = False,
        token_ids: list[int] | None = None,
    ) -> str:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
        unsent_ids, unsent_logprobs = self._unsent
        if self.logprobs is not None and unsent_ids:  # every token this chunk brings
            choice["logprobs"] = self.logprobs(unsent_ids, unsent_logprobs)
            self._unsent = ([], [])
        if self.request.return_token_ids and token_ids is not None:
            choice["token_ids"] = token_ids
        if self.chat:
            choice["delta"] = {} if delta is None else {"content": delta}
            if role:
                choice["delta"]["role"] = "assistant"
        else:
            choice["text"] = delta or ""
        return self._event([choice])

    def _event(self, choices: list, usage: dict | None = None) -> str:
        body = {
            "id": self.id,
            "object": self.object + ".chunk" if self.chat else self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.request.stream_options is not None and self.request.stream_options.include_usage:
            body["usage"] = usage
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    def abandon(self) -> None:
        """The client went away before the end: the request is aborted, its pages freed."""
        self.front.abort(self.stream)
        self.metrics.finished.labels("abort").inc()

    async def events(self) -> AsyncIterator[str]:
        front = self.front
        finished = False
        try:
            if self.chat:
                yield self._chunk("", role=True)
            async for update in self.stream.updates():
                self._observe(update)
                self._unsent[0].extend(update.token_ids)
                self._unsent[1].extend(update.logprobs or [])
                if not update.finished:
                    delta = self.text.feed(update.token_ids)
                    # one chunk per token step when there is no text to wait for
                    if delta or front.tokenizer is None or self.request.return_token_ids:
                        yield self._chunk(delta, token_ids=update.token_ids)
                    continue
                finished = True
                if update.finish_reason not in ("stop", "length"):
                    yield f"data: {json.dumps(self._failure(update).body())}\n\n"
                    break
                delta = self.text.final(update.token_ids, update.text)
                if delta or update.token_ids:
                    yield self._chunk(delta, token_ids=update.token_ids)
                yield self._chunk(None, update.finish_reason)
                if self.request.stream_options and self.request.stream_options.include_usage:
                    yield self._event([], self.usage())
            yield "data: [DONE]\n\n"
        finally:
            if not finished:  # the client went away (or the task was cancelled): free it now
                self.abandon()
