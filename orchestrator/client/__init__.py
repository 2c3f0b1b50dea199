"""Python client library for the ThinkServe API, synchronous and asyncio, over the generated stubs.

The client side, run in the caller's process: this library, batch ingest from the command line (ingest_batch.py,
parsing on a Ray cluster first with --ray: ray_ingest.py) and a streamed answer printed for people
(presentation.py). Of the server it imports the protocol (orchestrator.api.protos) and the documents' formats
(orchestrator.knowledge.parsing) only, and the server imports none of it (import-linter contracts in pyproject.toml).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Iterator, Optional

import grpc
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..api.protos import pb, pb_grpc
from ..knowledge.parsing.local_documents import read_source

CHUNK_BYTES = 1 << 20
_TRACE_CONTEXT = TraceContextTextMapPropagator()
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 * 1024 * 1024), ("grpc.max_send_message_length", 64 * 1024 * 1024)]


def query_request(collection: str, question: str, **options) -> "pb.QueryRequest":
    """options: the fields of QueryOptions in the proto (top_k, route, rerank, answerer, ...); None = server default."""
    return pb.QueryRequest(
        collection=collection,
        question=question,
        options=pb.QueryOptions(**{k: v for k, v in options.items() if v is not None}),
    )


def list_documents_request(collection: str) -> "pb.ListDocumentsRequest":
    return pb.ListDocumentsRequest(collection=collection)


def server_upload(collection: str, server_path: str, name: str = "") -> Iterator["pb.IngestRequest"]:
    yield pb.IngestRequest(header=pb.DocumentHeader(collection=collection, filename=name, server_path=server_path))


def upload(
    collection: str, data: bytes, filename: str, media_type: str = "", return_when_durable: bool = False
) -> Iterator["pb.IngestRequest"]:
    yield pb.IngestRequest(header=pb.DocumentHeader(
        collection=collection, filename=filename, media_type=media_type, return_when_durable=return_when_durable,
    ))
    for start in range(0, len(data), CHUNK_BYTES):
        yield pb.IngestRequest(chunk=data[start : start + CHUNK_BYTES])


@dataclass(frozen=True)
class Connection:
    """How to reach a server: its bearer token and, for TLS, the CA to trust (and a client certificate for mTLS)."""

    token: str = ""
    tls: bool = False
    root_certificates: Optional[bytes] = None  # None with tls: the system's trust store
    client_certificate: Optional[bytes] = None
    client_key: Optional[bytes] = None

    def metadata(self, request_id: str = "") -> tuple[tuple[str, str], ...]:
        """The token, the request id, and the caller's current OpenTelemetry span as a W3C traceparent (when
        there is one), so the server's spans join the caller's trace."""
        pairs = [("authorization", f"Bearer {self.token}")] if self.token else []
        if request_id:
            pairs.append(("x-request-id", request_id))
        carrier: dict[str, str] = {}
        _TRACE_CONTEXT.inject(carrier)
        return tuple(pairs + sorted(carrier.items()))

    def credentials(self) -> Optional[grpc.ChannelCredentials]:
        if not (self.tls or self.root_certificates):
            return None
        return grpc.ssl_channel_credentials(self.root_certificates, self.client_key, self.client_certificate)


def _channel(module, address: str, connection: Connection):
    credentials = connection.credentials()
    if credentials is None:
        return module.insecure_channel(address, options=_CHANNEL_OPTIONS)
    return module.secure_channel(address, credentials, options=_CHANNEL_OPTIONS)


class ThinkServeClient:
    """Blocking client: `with ThinkServeClient("127.0.0.1:50051", token=...) as client: ...`."""

    def __init__(self, address: str, timeout_s: Optional[float] = 300.0, token: str = "", connection: Optional[Connection] = None):
        self.timeout_s = timeout_s
        self.connection = connection or Connection(token=token)
        self._channel = _channel(grpc, address, self.connection)
        self._stub = pb_grpc.ThinkServeStub(self._channel)

    def __enter__(self) -> "ThinkServeClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: str, request, timeout_s: Optional[float], request_id: str = ""):
        return getattr(self._stub, method)(request, timeout=timeout_s, metadata=self.connection.metadata(request_id))

    def health(self, timeout_s: float = 10.0) -> "pb.HealthResponse":
        return self._call("Health", pb.HealthRequest(), timeout_s)

    def stats(self, timeout_s: float = 30.0) -> "pb.StatsResponse":
        return self._call("Stats", pb.StatsRequest(), timeout_s)

    def ingest(
        self, collection: str, data: bytes, filename: str, media_type: str = "", return_when_durable: bool = False
    ) -> "pb.IngestReport":
        """`return_when_durable`: answer once committed, before queries see it (see the proto)."""
        return self._call("Ingest", upload(collection, data, filename, media_type, return_when_durable), self.timeout_s)

    def ingest_file(self, collection: str, path: Path, name: str = "") -> "pb.IngestReport":
        """A file, or a MinerU output folder (sent zipped with its images); `name` defaults to the base name."""
        source = read_source(Path(path), name)
        return self.ingest(collection, source.data, source.name, source.media_type)

    def ingest_server_path(self, collection: str, server_path: str, name: str = "") -> "pb.IngestReport":
        """A file already on the server, under one of its ingest roots."""
        return self._call("Ingest", server_upload(collection, server_path, name), self.timeout_s)

    def list_documents(self, collection: str, timeout_s: float = 30.0) -> list["pb.DocumentInfo"]:
        return list(self._call("ListDocuments", list_documents_request(collection), timeout_s).documents)

    def ingest_progress(self, collection: str, timeout_s: float = 10.0) -> list["pb.IngestingDocument"]:
        """The collection's documents being ingested now, each as far as it has got."""
        return list(self._call("GetIngestProgress", pb.IngestProgressRequest(collection=collection), timeout_s).documents)

    def get_document(self, collection: str, name: str, timeout_s: float = 30.0) -> "pb.DocumentInfo":
        return self._call("GetDocument", pb.GetDocumentRequest(collection=collection, name=name), timeout_s)

    def delete_document(self, collection: str, name: str, timeout_s: float = 60.0) -> "pb.DocumentInfo":
        return self._call("DeleteDocument", pb.DeleteDocumentRequest(collection=collection, name=name), timeout_s)

    def create_collection(self, name: str, timeout_s: float = 30.0) -> "pb.CollectionInfo":
        return self._call("CreateCollection", pb.CreateCollectionRequest(name=name), timeout_s)

    def list_collections(self, timeout_s: float = 30.0) -> list["pb.CollectionInfo"]:
        return list(self._call("ListCollections", pb.ListCollectionsRequest(), timeout_s).collections)

    def delete_collection(self, name: str, timeout_s: float = 60.0) -> "pb.CollectionInfo":
        return self._call("DeleteCollection", pb.DeleteCollectionRequest(name=name), timeout_s)

    def retrieve(self, collection: str, question: str, timeout_s: Optional[float] = None, **options) -> "pb.RetrieveResponse":
        return self._call("Retrieve", query_request(collection, question, **options), timeout_s or self.timeout_s)

    def query(self, collection: str, question: str, timeout_s: Optional[float] = None, request_id: str = "", **options) -> Iterator["pb.QueryEvent"]:
        """Events as they arrive; breaking out of the loop cancels the query on the server."""
        call = self._call("Query", query_request(collection, question, **options), timeout_s or self.timeout_s, request_id)
        try:
            yield from call
        finally:
            call.cancel()


class AsyncThinkServeClient:
    """asyncio client: `async with AsyncThinkServeClient(address, token=...) as client: ...`."""

    def __init__(self, address: str, timeout_s: Optional[float] = 300.0, token: str = "", connection: Optional[Connection] = None):
        self.timeout_s = timeout_s
        self.connection = connection or Connection(token=token)
        self._channel = _channel(grpc.aio, address, self.connection)
        self._stub = pb_grpc.ThinkServeStub(self._channel)

    async def __aenter__(self) -> "AsyncThinkServeClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    def _call(self, method: str, request, timeout_s: Optional[float], request_id: str = ""):
        return getattr(self._stub, method)(request, timeout=timeout_s, metadata=self.connection.metadata(request_id))

    async def health(self, timeout_s: float = 10.0) -> "pb.HealthResponse":
        return await self._call("Health", pb.HealthRequest(), timeout_s)

    async def stats(self, timeout_s: float = 30.0) -> "pb.StatsResponse":
        return await self._call("Stats", pb.StatsRequest(), timeout_s)

    async def ingest(
        self, collection: str, data: bytes, filename: str, media_type: str = "", return_when_durable: bool = False
    ) -> "pb.IngestReport":
        return await self._call("Ingest", upload(collection, data, filename, media_type, return_when_durable), self.timeout_s)

    async def ingest_file(self, collection: str, path: Path, name: str = "") -> "pb.IngestReport":
        source = read_source(Path(path), name)
        return await self.ingest(collection, source.data, source.name, source.media_type)

    async def ingest_server_path(self, collection: str, server_path: str, name: str = "") -> "pb.IngestReport":
        return await self._call("Ingest", server_upload(collection, server_path, name), self.timeout_s)

    async def list_documents(self, collection: str, timeout_s: float = 30.0) -> list["pb.DocumentInfo"]:
        return list((await self._call("ListDocuments", list_documents_request(collection), timeout_s)).documents)

    async def ingest_progress(self, collection: str, timeout_s: float = 10.0) -> list["pb.IngestingDocument"]:
        return list((await self._call("GetIngestProgress", pb.IngestProgressRequest(collection=collection), timeout_s)).documents)

    async def get_document(self, collection: str, name: str, timeout_s: float = 30.0) -> "pb.DocumentInfo":
        return await self._call("GetDocument", pb.GetDocumentRequest(collection=collection, name=name), timeout_s)

    async def delete_document(self, collection: str, name: str, timeout_s: float = 60.0) -> "pb.DocumentInfo":
        return await self._call("DeleteDocument", pb.DeleteDocumentRequest(collection=collection, name=name), timeout_s)

    async def create_collection(self, name: str, timeout_s: float = 30.0) -> "pb.CollectionInfo":
        return await self._call("CreateCollection", pb.CreateCollectionRequest(name=name), timeout_s)

    async def list_collections(self, timeout_s: float = 30.0) -> list["pb.CollectionInfo"]:
        return list((await self._call("ListCollections", pb.ListCollectionsRequest(), timeout_s)).collections)

    async def delete_collection(self, name: str, timeout_s: float = 60.0) -> "pb.CollectionInfo":
        return await self._call("DeleteCollection", pb.DeleteCollectionRequest(name=name), timeout_s)

    async def retrieve(self, collection: str, question: str, timeout_s: Optional[float] = None, **options) -> "pb.RetrieveResponse":
        return await self._call("Retrieve", query_request(collection, question, **options), timeout_s or self.timeout_s)

    async def query(self, collection: str, question: str, timeout_s: Optional[float] = None, request_id: str = "", **options) -> AsyncIterator["pb.QueryEvent"]:
        call = self._call("Query", query_request(collection, question, **options), timeout_s or self.timeout_s, request_id)
        try:
            async for event in call:
                yield event
        finally:
            call.cancel()
