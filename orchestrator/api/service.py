"""The ThinkServe gRPC servicer: validates, delegates to ingest / query, maps errors to status codes."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid

import grpc

from .. import __version__
from ..config import Settings
from ..errors import InvalidRequestError, ThinkServeError
from ..knowledge.ingest import Ingestor
from ..pipeline.query import QueryPipeline
from ..triton.contracts import ModelContract
from ..triton.models import TritonModels
from . import convert
from .protos import pb, pb_grpc

log = logging.getLogger("thinkserve.api")
REQUEST_ID_HEADER = "x-request-id"


async def _begin(context) -> str:
    """The call's request id (the client's x-request-id, or a new one), sent back in the initial metadata."""
    supplied = dict(context.invocation_metadata() or ()).get(REQUEST_ID_HEADER, "")
    request_id = supplied[:64] if supplied else uuid.uuid4().hex[:16]
    await context.send_initial_metadata(((REQUEST_ID_HEADER, request_id),))
    return request_id


async def _abort(context, error: Exception, request_id: str, method: str):
    """Our errors keep their status and message; anything else is INTERNAL with the request id to find the log."""
    if isinstance(error, ThinkServeError):
        log.info("%s %s failed: %s: %s", method, request_id, error.status.name, error)
        await context.abort(error.status, str(error))
    else:
        log.exception("%s %s: internal error", method, request_id)
        await context.abort(grpc.StatusCode.INTERNAL, f"internal error (request id {request_id})")


def unary(method):
    @functools.wraps(method)
    async def handler(self, request, context):
        request_id = await _begin(context)
        try:
            return await method(self, request, context, request_id)
        except Exception as error:  # a cancelled call raises CancelledError, which is not an Exception
            await _abort(context, error, request_id, method.__name__)

    return handler


def streaming(method):
    @functools.wraps(method)
    async def handler(self, request, context):
        request_id = await _begin(context)
        try:
            async for message in method(self, request, context, request_id):
                yield message
        except Exception as error:
            await _abort(context, error, request_id, method.__name__)

    return handler


class ThinkServeService(pb_grpc.ThinkServeServicer):
    def __init__(
        self,
        settings: Settings,
        models: TritonModels,
        ingestor: Ingestor,
        pipeline: QueryPipeline,
        required_models: tuple[ModelContract, ...],
    ):
        self.settings = settings
        self.models = models
        self.ingestor = ingestor
        self.pipeline = pipeline
        self.required_models = required_models

    def _deadline(self, context) -> float:
        remaining = context.time_remaining()
        budget = self.settings.server.default_deadline_s if remaining is None else remaining
        return time.monotonic() + budget

    @unary
    async def Health(self, request, context, request_id):
        ready = await asyncio.gather(*(self.models.client.model_ready(c.name) for c in self.required_models))
        models = [
            pb.ModelHealth(name=c.name, ready=ok, detail="" if ok else "not ready in Triton")
            for c, ok in zip(self.required_models, ready)
        ]
        return pb.HealthResponse(serving=all(ready), models=models, version=__version__, profile=self.settings.profile)

    @unary
    async def Ingest(self, request_iterator, context, request_id):
        limit = self.settings.server.max_upload_bytes
        header, chunks, size = None, [], 0
        async for message in request_iterator:
            part = message.WhichOneof("part")
            if part == "header":
                if header is not None:
                    raise InvalidRequestError("the header was sent twice; send it once, first")
                header = message.header
            elif part == "chunk":
                if header is None:
                    raise InvalidRequestError("the first message of an upload must carry the header")
                size += len(message.chunk)
                if size > limit:
                    raise InvalidRequestError(f"upload exceeds {limit} bytes (server.max_upload_bytes)")
                chunks.append(message.chunk)
        if header is None:
            raise InvalidRequestError("empty upload: no header and no content")
        result = await self.ingestor.ingest(
            header.collection, header.filename or "document", b"".join(chunks), header.media_type,
            timeout_s=self._deadline(context) - time.monotonic(),
        )
        document = result.document
        log.info(
            "ingest %s: %s into %s: %s, %d pages, %d chunks, %d units, %d entities in %.2f s",
            request_id, document.name, header.collection,
            "already present" if result.already_present else ("replaced" if result.replaced else "added"),
            document.pages, document.chunks, document.units, document.entities, result.seconds,
        )
        return convert.ingest_report(result)

    @unary
    async def ListDocuments(self, request, context, request_id):
        snapshot = self.ingestor.knowledge.collection(request.collection).snapshot
        return pb.ListDocumentsResponse(documents=[convert.document_info(d) for d in snapshot.documents.values()])

    @unary
    async def DeleteDocument(self, request, context, request_id):
        collection = self.ingestor.knowledge.collection(request.collection)
        async with collection.write_lock:
            removed = await asyncio.to_thread(collection.delete, request.name)
        log.info("delete %s: %s from %s", request_id, removed.name, request.collection)
        return convert.document_info(removed)

    @streaming
    async def Query(self, request, context, request_id):
        query = convert.query_input(request)
        async for event in self.pipeline.run(query, self._deadline(context), request_id):
            yield convert.query_event(event, request_id)
