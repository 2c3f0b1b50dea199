"""The ThinkServe gRPC servicer: reads metadata, hands each call to the gateway, maps errors to status codes."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from typing import Callable, Optional

import grpc

from .. import __version__
from ..config import Settings
from ..errors import InvalidRequestError, NotFoundError, ThinkServeError
from ..knowledge.graph.graph import RELATED
from ..knowledge.ingest import Ingestor
from ..knowledge.storage.snapshot import Snapshot
from ..models.contracts import ModelContract
from ..models.protocol import ModelServer
from . import convert
from .decoding import checked
from .gateway import REQUEST_ID_HEADER, Call, Gateway, request_id_from
from .protos import pb, pb_grpc
from .read_ahead import read_ahead

SupervisionState = Callable[[], "pb.TritonState"]


def _open(gateway: Gateway, context, method: str):
    """(request id, its send to the client, the gateway's call context). The id goes back before anything can
    fail: its send starts now and is awaited before the first response or error, so the call's work does not
    wait for it (0.2 ms a call on the 2-vCPU VM)."""
    metadata = dict(context.invocation_metadata() or ())
    request_id = request_id_from(metadata.get(REQUEST_ID_HEADER, ""))
    sent = asyncio.ensure_future(context.send_initial_metadata(((REQUEST_ID_HEADER, request_id),)))
    sent.add_done_callback(_retrieved)  # a call cancelled meanwhile: its failure is the call's, not to be logged
    return request_id, sent, gateway.call(method, metadata.get("authorization", ""), request_id, context.time_remaining(), metadata)


def _retrieved(sent: asyncio.Future) -> None:
    if not sent.cancelled():
        sent.exception()


def _status(error: Exception, request_id: str) -> tuple[grpc.StatusCode, str]:
    """Our errors keep their status and message; anything else is INTERNAL with the request id to find the log."""
    if isinstance(error, ThinkServeError):
        return error.status, str(error)
    return grpc.StatusCode.INTERNAL, f"internal error (request id {request_id})"


# A failed call is aborted after its `except` block, never inside it. grpc keeps the AbortError on the call's
# state, which the frames of the AbortError's own traceback reference: a reference cycle. Raised inside the block,
# the AbortError chains the error (__context__), and with it every frame the failed method had, with what they held
# (a GetDocument's snapshot, its segments' mapped files): kept until a collection walks them, and for good when the
# next published snapshot freezes what the collector tracks (collector.py) first. Measured on a read replica
# polled with GetDocument while its writer replaced and deleted documents: a superseded document's files stayed
# open (4-7 descriptors each) after it was gone.


def unary(method):
    @functools.wraps(method)
    async def handler(self, request, context):
        request_id, sent, opened = _open(self.gateway, context, method.__name__)
        try:
            async with opened as call:
                response = await method(self, checked(request), context, call)
        except Exception as error:  # a cancelled call raises CancelledError, which is not an Exception
            failure = _status(error, request_id)
        else:
            await sent
            return response
        await sent
        await context.abort(*failure)

    return handler


def streaming(method):
    @functools.wraps(method)
    async def handler(self, request, context):
        request_id, sent, opened = _open(self.gateway, context, method.__name__)
        try:
            async with opened as call, contextlib.aclosing(method(self, checked(request), context, call)) as messages:
                async for message in messages:
                    await sent
                    yield message
        except Exception as error:
            failure = _status(error, request_id)
        else:
            await sent
            return
        await sent
        await context.abort(*failure)

    return handler


class ThinkServeService(pb_grpc.ThinkServeServicer):
    def __init__(
        self,
        settings: Settings,
        model_server: ModelServer,
        ingestor: Ingestor,
        gateway: Gateway,
        required_models: tuple[ModelContract, ...],
        triton_state: Optional[SupervisionState] = None,
    ):
        self.settings = settings
        self.model_server = model_server
        self.ingestor = ingestor
        self.knowledge = ingestor.knowledge
        self.gateway = gateway
        self.required_models = required_models
        self.triton_state = triton_state

    # ------------------------------------------------------------------ health and stats

    @unary
    async def Health(self, request, context, call: Call):
        return await self.health()

    async def health(self) -> "pb.HealthResponse":
        """Serving: every required model ready in Triton with its circuit breaker closed, and not draining.
        The Health RPC's answer, and the standard grpc.health.v1 status's (api/standard_health.py)."""
        ready = await asyncio.gather(*(self.model_server.model_ready(c.name) for c in self.required_models))
        breakers = self.model_server.breakers()
        models = []
        for contract, ok in zip(self.required_models, ready):
            breaker = breakers.get(contract.name)
            detail = "" if ok else "not ready in Triton"
            if ok and breaker is not None and breaker.state == "open":  # READY in Triton, yet its calls fail
                ok, detail = False, f"circuit breaker open after {breaker.consecutive_failures} failures: {breaker.last_failure}"
            models.append(pb.ModelHealth(name=contract.name, ready=ok, detail=detail))
        ready = [m.ready for m in models]
        return pb.HealthResponse(
            serving=all(ready) and not self.gateway.draining, models=models, version=__version__,
            profile=self.settings.profile, draining=self.gateway.draining,
        )

    @unary
    async def Stats(self, request, context, call: Call):
        pools = []
        for pool in (self.gateway.admission.queries, self.gateway.admission.ingests):
            state = pool.state()
            pools.append(pb.AdmissionPool(
                pool=pool.kind, running=state.running, waiting=state.waiting, capacity=state.capacity,
                queue_depth=state.queue_depth, rejected=dict(pool.rejected),
            ))
        names = call.principal.visible(self.knowledge.names())
        collections = await asyncio.gather(*(self._collection_info(name) for name in names))
        try:
            statistics = await self.model_server.statistics(timeout_s=min(5.0, max(0.1, call.remaining())))
            models = [convert.model_stats(entry) for entry in statistics]
        except ThinkServeError:
            models = []  # Triton down: the rest of the stats still answer
        triton = self.triton_state() if self.triton_state else pb.TritonState(url=self.model_server.url)
        triton.ready = await self.model_server.server_ready()
        return pb.StatsResponse(
            version=__version__, profile=self.settings.profile, uptime_s=time.time() - self.gateway.started_at,
            pools=pools, collections=[c for c in collections if c is not None], models=models, triton=triton,
        )

    # ------------------------------------------------------------------ documents

    @unary
    async def Ingest(self, request_iterator, context, call: Call):
        limit = self.settings.server.max_upload_bytes
        header, chunks, size = None, [], 0
        async for message in request_iterator:
            part = checked(message).WhichOneof("part")
            if part == "header":
                if header is not None:
                    raise InvalidRequestError("the header was sent twice; send it once, first")
                header = message.header
                self.gateway.authority.authorize(call.principal, header.collection, write=True)
            elif part == "chunk":
                if header is None:
                    raise InvalidRequestError("the first message of an upload must carry the header")
                if header.server_path:
                    raise InvalidRequestError("an ingest naming server_path carries no content chunks")
                size += len(message.chunk)
                if size > limit:
                    raise InvalidRequestError(f"upload exceeds {limit} bytes (server.max_upload_bytes)")
                chunks.append(message.chunk)
        if header is None:
            raise InvalidRequestError("empty upload: no header and no content")
        name, data, media_type = header.filename, b"".join(chunks), header.media_type
        if header.server_path:
            source = await asyncio.to_thread(self.gateway.server_source, header.server_path, header.filename)
            name, data, media_type = source.name, source.data, header.media_type or source.media_type
        async with self.gateway.ingest_slot(call, header.collection):
            result = await self.ingestor.ingest(
                header.collection, name or "document", data, media_type, timeout_s=call.remaining(),
                wait_visible=not header.return_when_durable,
            )
        convert.log_ingest(call.request_id, header.collection, result)
        return convert.ingest_report(result)

    @unary
    async def GetIngestProgress(self, request, context, call: Call):
        self.gateway.authority.authorize(call.principal, request.collection)
        documents = self.ingestor.progress.documents(request.collection)
        return pb.IngestProgressResponse(documents=[convert.ingesting_document(d) for d in documents])

    @unary
    async def ListDocuments(self, request, context, call: Call):
        snapshot = self._readable(call, request.collection).snapshot
        return pb.ListDocumentsResponse(documents=[convert.document_info(d) for d in snapshot.documents.values()])

    @unary
    async def GetDocument(self, request, context, call: Call):
        snapshot = self._readable(call, request.collection).snapshot
        document = snapshot.documents.get(request.name)
        if document is None:
            raise NotFoundError(f"collection {request.collection} has no document named {request.name!r}")
        return convert.document_info(document)

    @unary
    async def DeleteDocument(self, request, context, call: Call):
        self.gateway.authority.authorize(call.principal, request.collection, write=True)
        collection = self.knowledge.collection(request.collection)
        async with collection.write_lock:
            removed = await asyncio.to_thread(collection.delete, request.name)
            generation = collection.head().generation
        await collection.visible(generation)  # no query after this answer finds the document
        return convert.document_info(removed)

    # ------------------------------------------------------------------ collections

    @unary
    async def CreateCollection(self, request, context, call: Call):
        self.gateway.authority.authorize(call.principal, request.name, write=True)
        collection = await asyncio.to_thread(self.knowledge.create, request.name)
        return _collection_info(collection.name, collection.snapshot)

    @unary
    async def ListCollections(self, request, context, call: Call):
        names = call.principal.visible(self.knowledge.names())
        collections = await asyncio.gather(*(self._collection_info(name) for name in names))
        return pb.ListCollectionsResponse(collections=[c for c in collections if c is not None])

    @unary
    async def DeleteCollection(self, request, context, call: Call):
        self.gateway.authority.authorize(call.principal, request.name, write=True)
        collection = self.knowledge.collection(request.name)
        async with collection.write_lock:
            last = await asyncio.to_thread(self.knowledge.delete, request.name)
        return _collection_info(request.name, last)

    # ------------------------------------------------------------------ queries

    @streaming
    async def Query(self, request, context, call: Call):
        events = self.gateway.query(call, convert.query_input(request))
        if context is not None:  # over gRPC: the query goes on while each message is written, and ends with the call
            events = read_ahead(events, ended=context.add_done_callback)
        async with contextlib.aclosing(events):  # closed, not left to the collector (QueryPipeline.run says why)
            async for event in events:
                yield convert.query_event(event, call.request_id)

    @unary
    async def Retrieve(self, request, context, call: Call):
        events = [event async for event in self.gateway.query(call, convert.query_input(request), answer=False)]
        return convert.retrieve_response(events, call.request_id)

    # ------------------------------------------------------------------ without the gRPC transport

    def transcoded(self, method: str) -> Callable:
        """RPC `method`'s body without its gRPC transport: (request message, call) -> its response (an async
        iterator of messages for Query; Ingest takes an async iterator of IngestRequest). The JSON API behind the
        console (rest_http.py) runs the same operations, checks and limits through it."""
        body = getattr(type(self), method).__wrapped__
        return lambda request, call: body(self, request, None, call)

    async def page_image(self, call: Call, collection: str, document_id: str, page: int) -> tuple[bytes, str]:
        """(the render of a document's page, its media type), under the collection's read check; NOT_FOUND when
        the collection holds no such document or page, or the document has no page images (a text ingest)."""
        snapshot = self._readable(call, collection).snapshot
        if document_id not in {d.document_id for d in snapshot.documents.values()}:
            raise NotFoundError(f"collection {collection} has no document with id {document_id!r}")
        record = next((p for p in snapshot.segment(document_id).pages if p.page == page), None)
        if record is None:
            raise NotFoundError(f"document {document_id} has no image of page {page} (pages are numbered from 0; "
                                "documents ingested from text have none)")
        try:
            data = await asyncio.to_thread(snapshot.page_image, record)
        except FileNotFoundError:  # its document was replaced or deleted meanwhile
            raise NotFoundError(f"document {document_id} is no longer in collection {collection}") from None
        return data, _image_type(record.image)

    async def evidence_image(self, call: Call, collection: str, passage_id: str) -> tuple[bytes, str]:
        """(the image of a multimodal unit: the figure, table or equation MinerU cropped, its media type), by the
        evidence id an EvidenceItem carries, under the collection's read check; NOT_FOUND otherwise."""
        snapshot = self._readable(call, collection).snapshot
        row = snapshot.evidence_rows.get(passage_id)
        path = snapshot.asset_file(snapshot.evidence[row].asset) if row is not None and snapshot.evidence[row].asset else None
        if path is None:
            raise NotFoundError(f"collection {collection} has no image for evidence {passage_id!r}")
        try:
            return await asyncio.to_thread(path.read_bytes), _image_type(path.name)
        except FileNotFoundError:
            raise NotFoundError(f"evidence {passage_id!r} is no longer in collection {collection}") from None

    # ------------------------------------------------------------------ helpers

    def _readable(self, call: Call, collection: str):
        self.gateway.authority.authorize(call.principal, collection)
        return self.knowledge.collection(collection)

    async def _collection_info(self, name: str) -> Optional["pb.CollectionInfo"]:
        try:
            snapshot = self.knowledge.collection(name).snapshot
        except NotFoundError:  # deleted meanwhile
            return None
        return await asyncio.to_thread(_collection_info, name, snapshot)


def _image_type(name: str) -> str:
    return "image/png" if name.lower().endswith(".png") else "image/jpeg"


def _collection_info(name: str, snapshot: Snapshot) -> "pb.CollectionInfo":
    documents = snapshot.documents.values()
    relations = sum(1 for kind in snapshot.graph.edges.kind if kind == RELATED) if snapshot.segments else 0
    return pb.CollectionInfo(
        name=name,
        documents=len(documents),
        pages=sum(d.pages for d in documents),
        chunks=sum(d.chunks for d in documents),
        units=sum(d.units for d in documents),
        entities=len(snapshot.entity_key_set),
        relations=relations,
        bytes=sum(d.bytes for d in documents),
        passages=sum(convert.indexed_text(d) for d in documents),
    )
