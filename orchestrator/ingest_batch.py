"""Ingest many documents from the command line: a few in flight at once, a progress bar, a report per document.

A bad document fails alone with the server's message; the rest of the batch goes on. Progress counts pages
(PDF page counts are read up front, other documents count as one page), so the ETA reflects the work.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, TextIO

import grpc
from tqdm import tqdm

from .client import AsyncThinkServeClient
from .local_documents import find_documents, read_source


@dataclass
class BatchTotals:
    documents: int = 0
    pages: int = 0
    blocks: int = 0
    chunks: int = 0
    entities: int = 0
    failed: int = 0


def estimated_pages(path: Path) -> int:
    """Page count of a PDF (cheap: pdfium reads the page tree only); 1 for everything else."""
    if path.suffix.lower() != ".pdf":
        return 1
    try:
        import pypdfium2

        document = pypdfium2.PdfDocument(str(path))
        try:
            return max(1, len(document))
        finally:
            document.close()
    except Exception:  # the server reports what is wrong with it
        return 1


async def ingest_paths(
    address: str, collection: str, paths: list[Path], concurrency: int = 2, token: str = "", out: Optional[TextIO] = None,
) -> int:
    """Ingest every document found under `paths`; returns the number that failed."""
    out = out or sys.stdout
    documents = find_documents(paths)
    if not documents:
        print("no documents found (PDF, PNG, JPEG, Markdown, text, or folders with a *_content_list.json)", file=out)
        return 0
    weights = {path: estimated_pages(path) for path, _ in documents}
    totals = BatchTotals()
    limit = asyncio.Semaphore(max(1, concurrency))
    bar = tqdm(total=sum(weights.values()), unit="page", file=sys.stderr, dynamic_ncols=True)

    async def one(client: AsyncThinkServeClient, path: Path, name: str) -> None:
        async with limit:
            line = await _ingest_one(client, collection, path, name, totals)
        bar.update(weights[path])
        bar.set_postfix(docs=totals.documents, blocks=totals.blocks, entities=totals.entities, failed=totals.failed)
        bar.write(line, file=out)

    try:
        async with AsyncThinkServeClient(address, timeout_s=None, token=token) as client:
            await asyncio.gather(*(one(client, path, name) for path, name in documents))
    finally:
        bar.close()
    print(
        f"{totals.documents} documents ingested into {collection}: {totals.pages} pages, {totals.blocks} blocks, "
        f"{totals.chunks} chunks, {totals.entities} entities; {totals.failed} failed",
        file=out,
    )
    return totals.failed


async def _ingest_one(client: AsyncThinkServeClient, collection: str, path: Path, name: str, totals: BatchTotals) -> str:
    try:
        source = read_source(path, name)
        report = await client.ingest(collection, source.data, source.name, source.media_type)
    except grpc.aio.AioRpcError as error:
        totals.failed += 1
        return f"FAILED {name}: {error.code().name}: {error.details()}"
    except (OSError, ValueError) as error:
        totals.failed += 1
        return f"FAILED {name}: {error}"
    document = report.document
    totals.documents += 1
    if report.already_present:
        return f"{name}: already present as {document.name} (nothing changed)"
    totals.pages += document.pages
    totals.blocks += document.blocks
    totals.chunks += document.chunks
    totals.entities += document.entities
    state = "replaced" if report.replaced else "added"
    warnings = f"; {len(document.warnings)} warnings: {'; '.join(document.warnings[:3])}" if document.warnings else ""
    return (
        f"{name}: {state}, {document.pages} pages, {document.chunks} chunks, {document.units} units, "
        f"{document.entities} entities, {document.relations} relations in {report.seconds:.1f} s{warnings}"
    )

