"""The HTTP APIs: a Starlette app around a ``GenerationWorker``, served by uvicorn.

OpenAI's chat completions (openai.py), Anthropic's Messages (anthropic.py), OpenAI's Responses
(responses.py) and llama-server's /infill for editors (infill.py) each translate their body into the one
``GenerationRequest`` and the job's events back into their own format; nothing below knows which API asked.
Handlers run on the event loop and never touch a model: they check the request, queue a ``Job`` and relay
its events, as one JSON body or as server-sent events. A client that goes away cancels its job, whether it
is still queued or already generating.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import hmac
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from localspec.server import anthropic, infill, openai, responses
from localspec.server.reasoning import ReasoningDelta
from localspec.server.request import APIError, GenerationRequest
from localspec.server.results import now
from localspec.server.worker import Event, Failed, GenerationWorker, Job, Prefilling
from localspec.tool_calls import CallDelta, TextDelta

# What a job emits while it answers (the rest are Finished or Failed).
ANSWER_EVENTS = (TextDelta, CallDelta, ReasoningDelta)

# Whole files and long histories fit easily; a runaway or hostile client cannot fill memory.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
# On Ctrl-C, streams still open after this many seconds are cut (their jobs are cancelled).
GRACEFUL_SHUTDOWN_S = 3

log = logging.getLogger("localspec.server")


def make_app(
    worker: GenerationWorker,
    *,
    model_name: str,
    api_key: str | None = None,
    cors_origin: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> Starlette:
    """The ASGI app; starting it starts the worker thread, shutting it down stops the worker.

    Args:
        model_name: the id listed by /v1/models and echoed in responses (any requested name is accepted).
        api_key: when set, every /v1 and /infill request needs ``Authorization: Bearer <api_key>`` (or, as
            Anthropic's clients send it, ``x-api-key: <api_key>``).
        cors_origin: the one browser origin allowed to call the API; no CORS headers without it.
    """
    expected_key = api_key.encode() if api_key else None

    def authorize(request: Request) -> None:
        if expected_key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            given = request.headers.get("x-api-key", "")
        # Constant-time comparison, so response timing does not reveal how much of a guess was right.
        if not hmac.compare_digest(given.strip().encode(), expected_key):
            raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>') "
                                "with the key the server was started with", code="invalid_api_key")

    async def health(request: Request) -> Response:
        if worker.missing_server is not None:  # answers again once that server is back (the next request reloads)
            return JSONResponse({"status": "error", "busy": worker.busy, "queued": worker.queued,
                                 "error": f"RPC server {worker.missing_server} is missing; restart it",
                                 "missing_rpc_server": worker.missing_server}, status_code=503)
        return JSONResponse({"status": "ok", "busy": worker.busy, "queued": worker.queued})

    async def models(request: Request) -> Response:
        authorize(request)
        return JSONResponse({"object": "list", "data": [
            {"id": model_name, "object": "model", "created": now(), "owned_by": "localspec"}
        ]})

    async def chat_completions(request: Request) -> Response:
        authorize(request)
        generation = openai.parse_chat_request(await _read_json(request, max_body_bytes))
        return await _answer(request, worker, generation,
                             openai.ChatFormat(model_name, include_usage=generation.include_usage))

    async def completions(request: Request) -> Response:
        authorize(request)
        generation = openai.parse_completion_request(await _read_json(request, max_body_bytes))
        return await _answer(request, worker, generation,
                             openai.CompletionFormat(model_name, include_usage=generation.include_usage))

    async def messages(request: Request) -> Response:
        authorize(request)
        generation = anthropic.parse_messages_request(await _read_json(request, max_body_bytes))
        return await _answer(request, worker, generation, anthropic.MessagesFormat(model_name))

    async def count_tokens(request: Request) -> Response:
        authorize(request)
        generation = anthropic.parse_messages_request(await _read_json(request, max_body_bytes), count_only=True)
        tokens = await asyncio.to_thread(worker.count_tokens, generation)
        return JSONResponse(anthropic.count_tokens_body(tokens))

    async def responses_api(request: Request) -> Response:
        authorize(request)
        generation = responses.parse_responses_request(await _read_json(request, max_body_bytes))
        return await _answer(request, worker, generation, responses.ResponsesFormat(model_name, generation))

    async def infill_api(request: Request) -> Response:
        authorize(request)
        body = await _read_json(request, max_body_bytes)
        fmt = infill.InfillFormat(model_name, infill.response_fields(body))
        generation = infill.parse_infill_request(body)
        n = infill.completions(body, stream=generation.stream)
        if n == 1:
            return await _answer(request, worker, generation, fmt)
        answers = []
        for index in range(n):  # one slot: one after the other; each seeded apart from the others
            seed = None if generation.seed is None else generation.seed + index
            response = await _answer(request, worker, dataclasses.replace(generation, seed=seed), fmt)
            if response.status_code != 200:  # the client has gone
                return response
            answer = json.loads(response.body)
            answers.append(answer | {"index": index} if "index" in answer else answer)
        return JSONResponse(answers)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        worker.start()
        try:
            yield
        finally:
            await asyncio.to_thread(worker.stop)

    middleware = []
    if cors_origin:
        middleware.append(Middleware(
            CORSMiddleware, allow_origins=[cors_origin], allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "x-api-key", "anthropic-version"],
        ))
    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/messages", messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
            Route("/v1/responses", responses_api, methods=["POST"]),
            Route("/infill", infill_api, methods=["POST"]),
        ],
        middleware=middleware,
        exception_handlers={APIError: _api_error, HTTPException: _http_error, Exception: _internal_error},
        lifespan=lifespan,
    )


# -- errors ----------------------------------------------------------------------------------------
def _error_response(request: Request, error: APIError) -> Response:
    """``error`` in the shape of the API that was asked: Anthropic's under /v1/messages, else OpenAI's."""
    anthropic_api = request.url.path.startswith("/v1/messages")
    return JSONResponse(error.anthropic_body() if anthropic_api else error.body(), status_code=error.status)


async def _api_error(request: Request, exc: APIError) -> Response:
    return _error_response(request, exc)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    # Starlette's own 404 / 405, in the API's shape.
    message = f"{request.method} {request.url.path}: {exc.detail}"
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return _error_response(request, APIError(exc.status_code, message, code=code))


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.error("request failed: %s: %s", type(exc).__name__, exc)
    error = APIError(500, f"internal error ({type(exc).__name__}); see the server log", type="server_error")
    return _error_response(request, error)


async def _read_json(request: Request, limit: int) -> object:
    """The body parsed as JSON, read no further than ``limit`` bytes."""
    too_large = APIError(413, f"the request body is larger than {limit} bytes; send a smaller request",
                         code="body_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, RecursionError) as exc:
        raise APIError(400, f"the request body is not valid JSON ({exc}); send a JSON object",
                       code="invalid_json") from None


# -- answering -------------------------------------------------------------------------------------
async def _answer(request: Request, worker: GenerationWorker, generation: GenerationRequest, fmt) -> Response:
    """Queue ``generation`` and answer it in ``fmt``, the API's format (``response`` for a whole answer;
    ``stream_start``, ``stream_event``, ``stream_keepalive``, ``stream_end`` and ``stream_error`` give
    (event name, payload) pairs)."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[Event] = asyncio.Queue()

    def emit(event: Event) -> None:
        try:
            loop.call_soon_threadsafe(events.put_nowait, event)
        except RuntimeError:  # the event loop has closed: nobody is listening any more
            job.cancel()

    job = Job(generation, emit)
    worker.submit(job)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        # Errors found before the prefill (context too long, a template refusing the chat, a schema the
        # grammar cannot take) are still proper HTTP errors, so wait for the first event before choosing
        # the response; a stream then starts at once, so a long prefill never looks like a dead server.
        first = await _next(events, gone, job)
        if isinstance(first, Failed):
            raise first.error
        if not generation.stream:
            answer, event = [], first
            while isinstance(event, (*ANSWER_EVENTS, Prefilling)):
                if not isinstance(event, Prefilling):
                    answer.append(event)
                event = await _next(events, gone, job)
            if isinstance(event, Failed):
                raise event.error
            if event is not None:
                return JSONResponse(fmt.response(answer, event))
        if first is None or not generation.stream:
            return Response(status_code=204)  # the client has gone; nothing is sent
    finally:
        gone.cancel()
    # From here on the StreamingResponse watches for the disconnect and cancels the stream.
    return StreamingResponse(_sse(fmt, first, events, job), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _next(events: asyncio.Queue, gone: asyncio.Future, job: Job) -> Event | None:
    """The job's next event, or None (and the job cancelled) if the client disconnects first."""
    getting = asyncio.ensure_future(events.get())
    try:
        await asyncio.wait({getting, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        answered = getting.done()
        if not answered:  # the client left, or the server is shutting down
            getting.cancel()
            job.cancel()
    return getting.result() if answered else None


async def _sse(fmt, first: Event, events: asyncio.Queue, job: Job):
    def sse(messages: list) -> str:
        # Anthropic and the Responses API name each event; OpenAI's chat streams do not.
        return "".join((f"event: {name}\n" if name else "") + f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
                       for name, payload in messages)

    try:
        yield sse(fmt.stream_start())
        event = first
        while isinstance(event, (*ANSWER_EVENTS, Prefilling)):
            if isinstance(event, Prefilling):
                # An SSE comment (every client skips it) and the API's own keepalive event if it has one, so
                # an idle timeout never cuts a long prefill.
                yield f": prefill {event.done}/{event.total}\n\n" + sse(fmt.stream_keepalive())
            else:
                yield sse(fmt.stream_event(event))
            event = await events.get()
        if isinstance(event, Failed):
            yield sse([fmt.stream_error(event.error)])
            return
        yield sse(fmt.stream_end(event))
        if fmt.done_marker:
            yield "data: [DONE]\n\n"
    finally:
        job.cancel()  # a no-op once finished; stops the generation when the client has gone


# -- running ---------------------------------------------------------------------------------------
class LocalServer(uvicorn.Server):
    """uvicorn's server, reporting its base URL (with the real port when asked for port 0) once it listens.

    On shutdown the worker answers its open requests with a 503 at once, so streams end cleanly instead
    of waiting for uvicorn's graceful-shutdown timeout to cancel them.
    """

    def __init__(self, app: Starlette, worker: GenerationWorker, *, host: str, port: int,
                 on_ready: Callable[[str], None] | None = None, log_level: str = "info") -> None:
        # uvicorn writes its access log to stdout; here stdout carries only the base URL (results), so
        # every log line goes to stderr with the other status output.
        log_config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
        log_config["handlers"]["access"]["stream"] = "ext://sys.stderr"
        # Each answer's figures (the worker's log) appear among uvicorn's lines, in the same format.
        log_config["loggers"][log.name] = {"handlers": ["default"], "level": "INFO", "propagate": False}
        super().__init__(uvicorn.Config(app, host=host, port=port, log_level=log_level, log_config=log_config,
                                        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S))
        self.worker = worker
        self.on_ready = on_ready
        self.base_url: str | None = None

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        if not self.started:
            return
        host, port = self.servers[0].sockets[0].getsockname()[:2]
        host = f"[{host}]" if ":" in host else host
        self.base_url = f"http://{host}:{port}/v1"
        if self.on_ready is not None:
            self.on_ready(self.base_url)

    async def shutdown(self, sockets=None) -> None:
        self.worker.shut_down()
        await super().shutdown(sockets=sockets)
