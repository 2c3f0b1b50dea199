"""Python client library for the ThinkServe API, synchronous and asyncio, over the generated stubs."""

from __future__ import annotations

from pathlib import Path
from typing import AsyncIterator, Iterator, Optional

import grpc

from .api.protos import pb, pb_grpc
from .local_documents import read_source

CHUNK_BYTES = 1 << 20
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


def upload(collection: str, data: bytes, filename: str, media_type: str = "") -> Iterator["pb.IngestRequest"]:
    yield pb.IngestRequest(header=pb.DocumentHeader(collection=collection, filename=filename, media_type=media_type))
    for start in range(0, len(data), CHUNK_BYTES):
        yield pb.IngestRequest(chunk=data[start : start + CHUNK_BYTES])


class ThinkServeClient:
    """Blocking client: `with ThinkServeClient("127.0.0.1:50051") as client: ...`."""

    def __init__(self, address: str, timeout_s: Optional[float] = 300.0):
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
        self._stub = pb_grpc.ThinkServeStub(self._channel)

    def __enter__(self) -> "ThinkServeClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def health(self, timeout_s: float = 10.0) -> "pb.HealthResponse":
        return self._stub.Health(pb.HealthRequest(), timeout=timeout_s)

    def ingest(self, collection: str, data: bytes, filename: str, media_type: str = "") -> "pb.IngestReport":
        return self._stub.Ingest(upload(collection, data, filename, media_type), timeout=self.timeout_s)

    def ingest_file(self, collection: str, path: Path, name: str = "") -> "pb.IngestReport":
        """A file, or a MinerU output folder (sent zipped with its images); `name` defaults to the base name."""
        source = read_source(Path(path), name)
        return self.ingest(collection, source.data, source.name, source.media_type)

    def list_documents(self, collection: str, timeout_s: float = 30.0) -> list["pb.DocumentInfo"]:
        return list(self._stub.ListDocuments(list_documents_request(collection), timeout=timeout_s).documents)

    def delete_document(self, collection: str, name: str, timeout_s: float = 60.0) -> "pb.DocumentInfo":
        return self._stub.DeleteDocument(pb.DeleteDocumentRequest(collection=collection, name=name), timeout=timeout_s)

    def query(self, collection: str, question: str, **options) -> Iterator["pb.QueryEvent"]:
        """Events as they arrive; breaking out of the loop cancels the query on the server."""
        call = self._stub.Query(query_request(collection, question, **options), timeout=self.timeout_s)
        try:
            yield from call
        finally:
            call.cancel()


class AsyncThinkServeClient:
    """asyncio client: `async with AsyncThinkServeClient(address) as client: ...`."""

    def __init__(self, address: str, timeout_s: Optional[float] = 300.0):
        self.timeout_s = timeout_s
        self._channel = grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS)
        self._stub = pb_grpc.ThinkServeStub(self._channel)

    async def __aenter__(self) -> "AsyncThinkServeClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def health(self, timeout_s: float = 10.0) -> "pb.HealthResponse":
        return await self._stub.Health(pb.HealthRequest(), timeout=timeout_s)

    async def ingest(self, collection: str, data: bytes, filename: str, media_type: str = "") -> "pb.IngestReport":
        return await self._stub.Ingest(upload(collection, data, filename, media_type), timeout=self.timeout_s)

    async def ingest_file(self, collection: str, path: Path, name: str = "") -> "pb.IngestReport":
        source = read_source(Path(path), name)
        return await self.ingest(collection, source.data, source.name, source.media_type)

    async def list_documents(self, collection: str, timeout_s: float = 30.0) -> list["pb.DocumentInfo"]:
        return list((await self._stub.ListDocuments(list_documents_request(collection), timeout=timeout_s)).documents)

    async def delete_document(self, collection: str, name: str, timeout_s: float = 60.0) -> "pb.DocumentInfo":
        return await self._stub.DeleteDocument(pb.DeleteDocumentRequest(collection=collection, name=name), timeout=timeout_s)

    async def query(self, collection: str, question: str, **options) -> AsyncIterator["pb.QueryEvent"]:
        call = self._stub.Query(query_request(collection, question, **options), timeout=self.timeout_s)
        try:
            async for event in call:
                yield event
        finally:
            call.cancel()
