"""Document bytes -> passages -> embeddings (Triton) -> one atomic commit into a collection."""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass
from pathlib import PurePath
from typing import Optional

from ..config import RetrievalSettings
from ..errors import InvalidRequestError
from ..triton.models import TritonModels
from .passages import split_passages
from .store import KnowledgeBase, PassageRecord, new_document

MEDIA_TYPES = {".txt": "text/plain", ".md": "text/markdown", ".markdown": "text/markdown"}


@dataclass(frozen=True)
class IngestResult:
    collection: str
    document_id: str
    passages: int
    already_present: bool
    seconds: float


class Ingestor:
    def __init__(self, knowledge: KnowledgeBase, models: TritonModels, settings: RetrievalSettings):
        self.knowledge = knowledge
        self.models = models
        self.settings = settings

    async def ingest(
        self, collection: str, filename: str, data: bytes, media_type: str = "", timeout_s: Optional[float] = None
    ) -> IngestResult:
        started = time.monotonic()
        media_type = media_type or MEDIA_TYPES.get(PurePath(filename).suffix.lower(), "")
        if media_type not in MEDIA_TYPES.values():
            raise InvalidRequestError(
                f"{filename!r}: unsupported media type {media_type or 'unknown'!r}; "
                f"this version ingests {', '.join(sorted(set(MEDIA_TYPES.values())))}"
            )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InvalidRequestError(f"{filename!r} is not UTF-8 text (invalid byte at offset {error.start})") from None
        document_id = hashlib.sha256(data).hexdigest()[:24]
        target = self.knowledge.collection(collection, create=True)
        async with target.write_lock:
            if document_id in target.snapshot.documents:
                return IngestResult(collection, document_id, target.snapshot.documents[document_id].passages, True, time.monotonic() - started)
            passages = split_passages(text, self.settings.passage_chars)
            if not passages:
                raise InvalidRequestError(f"{filename!r} contains no text")
            embeddings = await self.models.embed([p.text for p in passages], timeout_s)
            records = [
                PassageRecord(f"{document_id}:{p.ordinal}", document_id, filename, p.section, p.ordinal, p.text)
                for p in passages
            ]
            document = new_document(document_id, filename, media_type, len(records))
            await asyncio.to_thread(target.commit_document, document, records, embeddings)
        return IngestResult(collection, document_id, len(records), False, time.monotonic() - started)
