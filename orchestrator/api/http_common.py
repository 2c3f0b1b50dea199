"""What the HTTP endpoints share (the OpenAI-compatible one and the JSON API behind the console): the HTTP
status of each gRPC code, OpenAI-shaped error bodies, request bodies read under a size limit, and the client's
deadline from a header."""

from __future__ import annotations

import contextlib
import json
from typing import AsyncIterator, Optional

import grpc
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import Send

from ..errors import InvalidRequestError, ThinkServeError
from .gateway import REQUEST_ID_HEADER

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
ERROR_TYPES = {  # HTTP status -> OpenAI's error type (what its SDKs and dashboards key on)
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    409: "invalid_request_error", 429: "rate_limit_error", 503: "server_error", 504: "timeout_error",
}
RETRY_AFTER_S = 1  # a full queue or a draining replica: worth retrying after a second (on another replica)
MAX_BODY_BYTES = 1 << 20  # a JSON request body


async def json_body(request: Request, limit: int = MAX_BODY_BYTES) -> dict:
    """The request's JSON object, read under `limit` bytes; INVALID_ARGUMENT otherwise."""
    raw = await body_bytes(request, limit, "request body")
    try:
        body = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequestError("the request body is not JSON") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    return body


async def body_bytes(request: Request, limit: int, what: str, setting: str = "") -> bytes:
    """The whole body, refused as soon as it is known to exceed `limit` bytes (a declared length first)."""
    too_big = f"{what} over {limit} bytes{f' ({setting})' if setting else ''}"
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise InvalidRequestError(too_big)
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise InvalidRequestError(too_big)
        parts.append(part)
    return b"".join(parts)


def client_timeout(request: Request) -> Optional[float]:
    """The client's deadline in seconds, from an `x-request-timeout` header (the HTTP stand-in for gRPC's)."""
    value = request.headers.get("x-request-timeout", "")
    try:
        return float(value) if value else None
    except ValueError:
        raise InvalidRequestError(f"x-request-timeout must be seconds, got {value!r}") from None


def error_body(error: Optional[ThinkServeError], request_id: str) -> dict:
    """OpenAI's error shape; None: an internal error, reported with the request id to find its log lines."""
    if error is None:
        return {"error": {"message": f"internal error (request id {request_id})", "type": "server_error", "param": None,
                          "code": "INTERNAL"}}
    status = HTTP_STATUS.get(error.status, 500)
    return {"error": {"message": str(error), "type": ERROR_TYPES.get(status, "server_error"),
                      "param": getattr(error, "param", None), "code": error.status.name}}


def error_response(error: Optional[ThinkServeError], request_id: str) -> JSONResponse:
    status = 500 if error is None else HTTP_STATUS.get(error.status, 500)
    headers = {REQUEST_ID_HEADER: request_id}
    if status in (429, 503):
        headers["retry-after"] = str(RETRY_AFTER_S)
    return JSONResponse(error_body(error, request_id), status_code=status, headers=headers)


async def failed_call(opened, error: BaseException, request_id: str) -> JSONResponse:
    """End the gateway call `opened` with `error` (logged and counted there) and answer with it: our errors keep
    their status, anything else is an internal error; a cancellation goes on up."""
    await opened.__aexit__(type(error), error, error.__traceback__)
    if isinstance(error, ThinkServeError):
        return error_response(error, request_id)
    if isinstance(error, Exception):
        return error_response(None, request_id)
    raise error


def sse_data(body: dict) -> bytes:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n".encode()


class EventStream(StreamingResponse):
    """Server-Sent Events (sse_stream's) whose body is closed however the response ends: Starlette leaves it
    suspended when the client goes away during a send, and the query under it, with its model streams, would
    wait for the garbage collector (QueryPipeline.run says why that is not enough)."""

    def __init__(self, body: AsyncIterator[bytes], request_id: str):
        super().__init__(body, media_type="text/event-stream", headers={REQUEST_ID_HEADER: request_id, "cache-control": "no-cache"})

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        finally:
            await self.body_iterator.aclose()


async def sse_stream(opened, request_id: str, bodies: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    """Server-Sent Events of `bodies` (JSON objects), then `data: [DONE]`. A failure once the stream has begun is
    one more event, OpenAI's error shape, before `[DONE]`. `opened`: the gateway call (an entered async context
    manager), ended with the stream, with the failure if any, so that it is logged and counted."""
    failure: Optional[BaseException] = None
    try:
        async with contextlib.aclosing(bodies):  # closed, not left to the collector (QueryPipeline.run says why)
            async for body in bodies:
                yield sse_data(body)
    except ThinkServeError as error:
        failure = error
        yield sse_data(error_body(error, request_id))
    except Exception as error:  # logged by the gateway call under the request id
        failure = error
        yield sse_data(error_body(None, request_id))
    except BaseException as error:  # the client went away
        await opened.__aexit__(type(error), error, error.__traceback__)
        raise
    yield b"data: [DONE]\n\n"
    if failure is not None:
        await opened.__aexit__(type(failure), failure, failure.__traceback__)
    else:
        await opened.__aexit__(None, None, None)
