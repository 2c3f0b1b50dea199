"""The HTTP side: an OpenAI-compatible chat endpoint so existing chat front ends can ask a collection, plus
/metrics (Prometheus) and /healthz.

Mapping (stateless, one question per request):
- `model` is the collection (GET /v1/models lists the collections the token may read); an explicit
  `collection` field wins over it.
- The question is the text of the last `user` message; earlier turns are not used for retrieval.
- `max_tokens` / `max_completion_tokens`, `temperature`, `top_p` and `seed` map to the query options; every
  other QueryOptions field (route, rerank, graph, page_images, answerer, ...) goes in a `thinkserve` object.
- The answer's citations, route, degradation and request id come back in a `thinkserve` object, in the
  response (or the last stream chunk). `stream: true` sends Server-Sent Events, ending with `data: [DONE]`.
Errors are OpenAI-shaped (`{"error": {"message", "type", "code"}}`) with the HTTP status of the gRPC code.
"""

from __future__ import annotations

import json
import time
from dataclasses import fields as dataclass_fields
from typing import Any, AsyncIterator, Optional

import grpc
import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..errors import InvalidRequestError, ThinkServeError
from ..observability.metrics import CONTENT_TYPE
from ..pipeline.events import AnswerDeltaEvent, FinalAnswerEvent, RouteEvent
from ..pipeline.plan import QueryOptions
from ..pipeline.query import QueryInput
from .gateway import REQUEST_ID_HEADER, Call, Gateway, request_id_from

HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
_OPTION_FIELDS = {f.name for f in dataclass_fields(QueryOptions)}
FINISH_REASONS = {"length": "length"}  # everything else ends as "stop"
MAX_BODY_BYTES = 1 << 20


def openai_app(gateway: Gateway, collections, triton_metrics_url: str = "") -> Starlette:
    """`collections`: () -> the names of every collection (the gateway scopes them to the token);
    `triton_metrics_url`: Triton's own Prometheus endpoint (loopback only), relayed at /metrics/triton."""

    async def chat_completions(request: Request) -> Response:
        request_id = request_id_from(request.headers.get(REQUEST_ID_HEADER, ""))
        try:
            body = await _json_body(request)
            timeout = _timeout(request)
            opened = gateway.call("ChatCompletions", request.headers.get("authorization", ""), request_id, timeout, request.headers)
            call = await opened.__aenter__()
        except ThinkServeError as error:
            return _error(error, request_id)
        try:
            query, stream, model = _query(body)
            events = gateway.query(call, query)
            if stream:
                first = await _first_event(events)  # errors before any output are still proper HTTP errors
                return StreamingResponse(
                    _sse(call, opened, first, events, model), media_type="text/event-stream",
                    headers={REQUEST_ID_HEADER: request_id, "cache-control": "no-cache"},
                )
            response = await _completion(call, events, model)
        except BaseException as error:
            await opened.__aexit__(type(error), error, error.__traceback__)
            if isinstance(error, ThinkServeError):
                return _error(error, request_id)
            if isinstance(error, Exception):
                return _error(None, request_id)
            raise
        await opened.__aexit__(None, None, None)
        return JSONResponse(response, headers={REQUEST_ID_HEADER: request_id})

    async def models(request: Request) -> Response:
        request_id = request_id_from(request.headers.get(REQUEST_ID_HEADER, ""))
        try:
            async with gateway.call("ListModels", request.headers.get("authorization", ""), request_id, None) as call:
                names = call.principal.visible(collections())
        except ThinkServeError as error:
            return _error(error, request_id)
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "thinkserve"} for name in names]
        return JSONResponse({"object": "list", "data": data}, headers={REQUEST_ID_HEADER: request_id})

    async def metrics(request: Request) -> Response:
        return Response(gateway.metrics.exposition(), media_type=CONTENT_TYPE)

    async def triton_metrics(request: Request) -> Response:
        """Triton's metrics (queue and compute time, batch executions per model) through our port, since
        Triton itself never listens beyond loopback."""
        if not triton_metrics_url:
            return Response("Triton's metrics endpoint is not known (an external triton.url)\n", status_code=404)
        try:
            async with httpx.AsyncClient(timeout=5.0) as client:
                upstream = await client.get(triton_metrics_url)
        except httpx.HTTPError as error:
            return Response(f"Triton's metrics are unavailable: {error}\n", status_code=503)
        return Response(upstream.content, status_code=upstream.status_code, media_type=CONTENT_TYPE)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"draining": gateway.draining}, status_code=503 if gateway.draining else 200)

    return Starlette(routes=[
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/metrics/triton", triton_metrics, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
    ])


# ---------------------------------------------------------------------- request


async def _json_body(request: Request) -> dict:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise InvalidRequestError(f"request body over {MAX_BODY_BYTES} bytes")
    raw = b""
    async for part in request.stream():
        raw += part
        if len(raw) > MAX_BODY_BYTES:
            raise InvalidRequestError(f"request body over {MAX_BODY_BYTES} bytes")
    try:
        body = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequestError("the request body is not JSON") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    return body


def _timeout(request: Request) -> Optional[float]:
    """The client's deadline in seconds, from an `x-request-timeout` header (the HTTP stand-in for gRPC's)."""
    value = request.headers.get("x-request-timeout", "")
    try:
        return float(value) if value else None
    except ValueError:
        raise InvalidRequestError(f"x-request-timeout must be seconds, got {value!r}") from None


def _query(body: dict) -> tuple[QueryInput, bool, str]:
    collection = body.get("collection") or body.get("model")
    if not isinstance(collection, str) or not collection:
        raise InvalidRequestError("name the collection in `model` (or `collection`); GET /v1/models lists them")
    question = _last_user_text(body.get("messages"))
    options: dict[str, Any] = {}
    extra = body.get("thinkserve") or {}
    if not isinstance(extra, dict):
        raise InvalidRequestError("`thinkserve` must be an object of query options")
    unknown = sorted(set(extra) - _OPTION_FIELDS)
    if unknown:
        raise InvalidRequestError(f"unknown thinkserve options {unknown}; known: {sorted(_OPTION_FIELDS)}")
    options.update(extra)
    for source, target in (("max_completion_tokens", "max_tokens"), ("max_tokens", "max_tokens"),
                           ("temperature", "temperature"), ("top_p", "top_p"), ("seed", "seed")):
        if body.get(source) is not None:
            options[target] = body[source]
    for name, value in options.items():
        _check_option(name, value)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequestError("`stream` must be true or false")
    return QueryInput(collection, question, QueryOptions(**options)), stream, collection


def _check_option(name: str, value: Any) -> None:
    """JSON types against the option's proto type: a string where a number belongs is a 400, not a 500."""
    kind = QueryOptions.__dataclass_fields__[name].type
    if value is None:
        return
    if "bool" in str(kind) and not isinstance(value, bool):
        raise InvalidRequestError(f"option {name} must be true or false")
    if "int" in str(kind) and (isinstance(value, bool) or not isinstance(value, int)):
        raise InvalidRequestError(f"option {name} must be an integer")
    if "float" in str(kind) and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise InvalidRequestError(f"option {name} must be a number")
    if "str" in str(kind) and not isinstance(value, str):
        raise InvalidRequestError(f"option {name} must be a string")


def _last_user_text(messages: Any) -> str:
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("`messages` must be a non-empty list")
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):  # content parts: the text ones, in order
                texts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
                if all(isinstance(t, str) for t in texts) and texts:
                    return "\n".join(texts)
            raise InvalidRequestError("the last user message has no text content")
    raise InvalidRequestError("`messages` has no user message")


# ---------------------------------------------------------------------- response


async def _first_event(events: AsyncIterator):
    try:
        return await events.__anext__()
    except StopAsyncIteration:
        return None


async def _completion(call: Call, events: AsyncIterator, model: str) -> dict:
    route, final = "", None
    async for event in events:
        if isinstance(event, RouteEvent):
            route = event.decision.label
        elif isinstance(event, FinalAnswerEvent):
            final = event
    message = {"role": "assistant", "content": final.text}
    return {
        "id": f"chatcmpl-{call.request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": FINISH_REASONS.get(final.finish_reason, "stop")}],
        "usage": _usage(final),
        "thinkserve": _extension(call, route, final),
    }


async def _sse(call: Call, opened, first, events: AsyncIterator, model: str) -> AsyncIterator[bytes]:
    """Chunks as the answer streams. The final answer of record can differ from the streamed text (an LLM
    replaced by the extractive fallback mid-stream): the last chunk's `thinkserve.text` then holds it."""
    base = {"id": f"chatcmpl-{call.request_id}", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}

    def chunk(delta: dict, finish: Optional[str] = None, **extra) -> bytes:
        body = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n".encode()

    route, failure = "", None
    try:
        yield chunk({"role": "assistant", "content": ""})
        event = first
        while event is not None:
            if isinstance(event, RouteEvent):
                route = event.decision.label
            elif isinstance(event, AnswerDeltaEvent) and event.text:
                yield chunk({"content": event.text})
            elif isinstance(event, FinalAnswerEvent):
                finish = FINISH_REASONS.get(event.finish_reason, "stop")
                yield chunk({}, finish, usage=_usage(event), thinkserve=_extension(call, route, event))
            event = await _first_event(events)
    except ThinkServeError as error:
        failure = error
        yield f"data: {json.dumps(_error_body(error, call.request_id))}\n\n".encode()
    except BaseException as error:
        await opened.__aexit__(type(error), error, error.__traceback__)
        raise
    yield b"data: [DONE]\n\n"
    if failure is not None:
        await opened.__aexit__(type(failure), failure, failure.__traceback__)
    else:
        await opened.__aexit__(None, None, None)


def _usage(final: FinalAnswerEvent) -> dict:
    prompt, completion = final.usage.prompt_tokens, final.usage.completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _extension(call: Call, route: str, final: FinalAnswerEvent) -> dict:
    return {
        "request_id": call.request_id,
        "text": final.text,
        "route": route,
        "answer_source": final.answer_source,
        "degraded": final.degraded,
        "degraded_reason": final.degraded_reason,
        "citations": [
            {
                "evidence_rank": c.evidence_rank, "passage_id": c.passage_id, "document_name": c.document_name, "page": c.page,
                "regions": [{"page": s.page, "bbox": list(s.bbox)} for s in c.regions if s.page >= 0 and any(s.bbox)],
                "quote": c.quote,
            }
            for c in final.citations
        ],
        "timings_ms": final.timings_ms,
    }


def _error_body(error: Optional[ThinkServeError], request_id: str) -> dict:
    if error is None:
        return {"error": {"message": f"internal error (request id {request_id})", "type": "internal", "code": "INTERNAL"}}
    return {"error": {"message": str(error), "type": error.status.name.lower(), "code": error.status.name}}


def _error(error: Optional[ThinkServeError], request_id: str) -> JSONResponse:
    status = 500 if error is None else HTTP_STATUS.get(error.status, 500)
    return JSONResponse(_error_body(error, request_id), status_code=status, headers={REQUEST_ID_HEADER: request_id})
