"""The JSON API over HTTP that the web console uses, and the console's own files.

Each route runs the gRPC method of the same name through the same gateway (authentication, collection scoping,
admission, deadline, metrics), with the protobuf messages as JSON (field names as in the .proto, fields left at
their default included, 64-bit integers as strings, as protobuf's JSON mapping has them): the console and any
other HTTP client see exactly what a gRPC client sees. Errors have the OpenAI endpoint's shape and statuses.

    GET    /api/v1/health | /api/v1/stats
    GET    /api/v1/collections                               POST {"name"}          DELETE /api/v1/collections/{c}
    GET    /api/v1/collections/{c}/documents
    PUT    /api/v1/collections/{c}/documents/{name}          body: the file's bytes (ingest; the same name replaces)
    GET | DELETE /api/v1/collections/{c}/documents/{name}
    GET    /api/v1/collections/{c}/ingest                    the documents being ingested now, as far as each has got
    POST   /api/v1/collections/{c}/query                     {"question", "options"}: Server-Sent Events of QueryEvent
    POST   /api/v1/collections/{c}/retrieve                  {"question", "options"}: RetrieveResponse
    GET    /api/v1/collections/{c}/pages/{document id}/{page}  a page's render (0-based page), read access to {c}
    GET    /api/v1/collections/{c}/evidence/{passage id}/image  a multimodal unit's image (figure, table, equation)
    GET    /api/v1/openapi.json                              this API's OpenAPI description (api/openapi.py)
    GET    /console/                                         the console (http.console)

Images are named by collection and document id and page, or evidence id, only: no file path reaches a URL, and a
token that may not read the collection gets 403 whatever the document.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable, Optional

from google.protobuf import json_format
from google.protobuf.message import Message
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from .. import __version__
from ..errors import InvalidRequestError, ThinkServeError
from .gateway import REQUEST_ID_HEADER, Call, Gateway, request_id_from
from .http_common import EventStream, client_timeout, error_response, failed_call, json_body, sse_stream
from .openapi import OPENAPI_PATH, describe
from .protos import pb
from .service import ThinkServeService

CONSOLE_FILES = Path(__file__).parent / "console"
# The console runs no script but its own and loads nothing from elsewhere: a page that holds a token in its
# session storage should not be able to send it anywhere else.
CONSOLE_HEADERS = {
    "content-security-policy": "default-src 'self'; img-src 'self' blob: data:; style-src 'self'; script-src 'self'; "
                               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}
MessageBuilder = Callable[[Request], Awaitable[object]]  # the RPC's request: a message, or their stream (Ingest)


def to_json(message: Message) -> dict:
    return json_format.MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def from_json(values: dict, message: Message) -> Message:
    """`values` into `message`; INVALID_ARGUMENT naming the field for an unknown field or a wrong type."""
    try:
        return json_format.ParseDict(values, message)
    except json_format.ParseError as error:
        raise InvalidRequestError(f"invalid request: {error}") from None


def rest_routes(gateway: Gateway, service: ThinkServeService, console: bool) -> list[BaseRoute]:
    """The JSON API's routes, and the console's when `console` is on."""

    def unary(method: str, build: MessageBuilder):
        async def handle(request: Request) -> Response:
            request_id = request_id_from(request.headers.get(REQUEST_ID_HEADER, ""))
            try:
                async with _opened(gateway, request, method, request_id) as call:
                    response = await service.transcoded(method)(await build(request), call)
            except ThinkServeError as error:
                return error_response(error, request_id)
            except Exception:  # logged with the request id by gateway.call
                return error_response(None, request_id)
            return JSONResponse(to_json(response), headers={REQUEST_ID_HEADER: request_id})

        return handle

    async def upload(request: Request) -> AsyncIterator["pb.IngestRequest"]:
        return _upload(request, service.settings.server.max_upload_bytes)

    async def query(request: Request) -> Response:
        """The query's events as Server-Sent Events, one QueryEvent as JSON each, then `[DONE]`. An error before
        the first event is an HTTP error; one after it is an `{"error": ...}` event before `[DONE]`."""
        request_id = request_id_from(request.headers.get(REQUEST_ID_HEADER, ""))
        opened = _opened(gateway, request, "Query", request_id)
        try:
            call = await opened.__aenter__()
        except ThinkServeError as error:
            return error_response(error, request_id)
        try:
            events = service.transcoded("Query")(await _query_request(request), call)
            first = await anext(events, None)  # errors before any output are still proper HTTP errors
        except BaseException as error:
            return await failed_call(opened, error, request_id)
        return EventStream(sse_stream(opened, request_id, _events(first, events)), request_id)

    def image(method: str, read: Callable[[Call, dict], Awaitable[tuple[bytes, str]]]):
        async def handle(request: Request) -> Response:
            request_id = request_id_from(request.headers.get(REQUEST_ID_HEADER, ""))
            try:
                async with _opened(gateway, request, method, request_id) as call:
                    data, media_type = await read(call, request.path_params)
            except ThinkServeError as error:
                return error_response(error, request_id)
            except Exception:
                return error_response(None, request_id)
            # private: the same URL under another token is checked again, never answered from a shared cache
            return Response(data, media_type=media_type,
                            headers={REQUEST_ID_HEADER: request_id, "cache-control": "private, max-age=300"})

        return handle

    page_image = image("GetPageImage", lambda call, p: service.page_image(call, p["collection"], p["document_id"], p["page"]))
    evidence_image = image("GetEvidenceImage", lambda call, p: service.evidence_image(call, p["collection"], p["passage_id"]))

    description = describe(__version__)

    async def openapi(request: Request) -> Response:
        return JSONResponse(description)

    collection_path = "/api/v1/collections/{collection}"
    routes: list[BaseRoute] = [
        Route(OPENAPI_PATH, openapi, methods=["GET"]),
        Route("/api/v1/health", unary("Health", _empty(pb.HealthRequest)), methods=["GET"]),
        Route("/api/v1/stats", unary("Stats", _empty(pb.StatsRequest)), methods=["GET"]),
        Route("/api/v1/collections", unary("ListCollections", _empty(pb.ListCollectionsRequest)), methods=["GET"]),
        Route("/api/v1/collections", unary("CreateCollection", _from_body(pb.CreateCollectionRequest)), methods=["POST"]),
        Route(collection_path, unary("DeleteCollection", _from_path(pb.DeleteCollectionRequest, name="collection")),
              methods=["DELETE"]),
        Route(f"{collection_path}/documents", unary("ListDocuments", _from_path(pb.ListDocumentsRequest)), methods=["GET"]),
        Route(f"{collection_path}/documents/{{name:path}}", unary("Ingest", upload), methods=["PUT"]),
        Route(f"{collection_path}/documents/{{name:path}}", unary("GetDocument", _from_path(pb.GetDocumentRequest)), methods=["GET"]),
        Route(f"{collection_path}/documents/{{name:path}}", unary("DeleteDocument", _from_path(pb.DeleteDocumentRequest)),
              methods=["DELETE"]),
        Route(f"{collection_path}/ingest", unary("GetIngestProgress", _from_path(pb.IngestProgressRequest)), methods=["GET"]),
        Route(f"{collection_path}/query", query, methods=["POST"]),
        Route(f"{collection_path}/retrieve", unary("Retrieve", _query_request), methods=["POST"]),
        Route(f"{collection_path}/pages/{{document_id}}/{{page:int}}", page_image, methods=["GET"]),
        Route(f"{collection_path}/evidence/{{passage_id}}/image", evidence_image, methods=["GET"]),
    ]
    if console:
        routes += [
            Route("/", lambda request: RedirectResponse("/console/"), methods=["GET"]),
            Mount("/console", app=ConsoleFiles(directory=CONSOLE_FILES, html=True), name="console"),
        ]
    return routes


class ConsoleFiles(StaticFiles):
    """The console's static files, with headers that keep its page to its own origin."""

    def file_response(self, *args, **kwargs) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers.update(CONSOLE_HEADERS)
        return response


# ---------------------------------------------------------------------- requests


def _opened(gateway: Gateway, request: Request, method: str, request_id: str):
    return gateway.call(method, request.headers.get("authorization", ""), request_id, client_timeout(request), request.headers)


def _empty(message_type) -> MessageBuilder:
    async def build(request: Request) -> Message:
        return message_type()

    return build


def _from_body(message_type) -> MessageBuilder:
    async def build(request: Request) -> Message:
        return from_json(await json_body(request), message_type())

    return build


def _from_path(message_type, **renamed: str) -> MessageBuilder:
    """The message of the route's path parameters (`renamed`: message field -> path parameter)."""
    async def build(request: Request) -> Message:
        params = dict(request.path_params)
        for field, param in renamed.items():
            params[field] = params.pop(param)
        return message_type(**params)

    return build


async def _query_request(request: Request) -> "pb.QueryRequest":
    body = await json_body(request)
    unknown = set(body) - {"question", "options"}
    if unknown:
        raise InvalidRequestError(f"unknown field(s) {sorted(unknown)}: a query is {{\"question\", \"options\"}}")
    return from_json({**body, "collection": request.path_params["collection"]}, pb.QueryRequest())


async def _upload(request: Request, limit: int) -> AsyncIterator["pb.IngestRequest"]:
    """The upload as the Ingest RPC receives it: the header (the document's name from the path, its media type
    from Content-Type unless generic), then the bytes as they arrive. The RPC enforces the size limit as it
    counts them; a declared length over it is refused before anything is read."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise InvalidRequestError(f"upload exceeds {limit} bytes (server.max_upload_bytes)")
    media_type = request.headers.get("content-type", "").split(";")[0].strip()
    header = pb.DocumentHeader(
        collection=request.path_params["collection"], filename=request.path_params["name"],
        media_type="" if media_type in ("", "application/octet-stream") else media_type,
    )
    yield pb.IngestRequest(header=header)
    async for piece in request.stream():
        if piece:
            yield pb.IngestRequest(chunk=piece)


# ---------------------------------------------------------------------- responses


async def _events(first: Optional[Message], events: AsyncIterator[Message]) -> AsyncIterator[dict]:
    async with contextlib.aclosing(events):  # closed, not left to the collector (QueryPipeline.run says why)
        event = first
        while event is not None:
            yield to_json(event)
            event = await anext(events, None)
