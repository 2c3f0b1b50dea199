"""Ingest many documents from the command line: a few in flight at once, a progress bar, a report per document.

A bad document fails alone with the server's message; the rest of the batch goes on. Progress counts pages, what
ingest's time grows with: each document's pages are counted up front (a PDF's page tree, a MinerU output folder's
content list or the PDF beside it; an image or a text is one page). While documents ingest, the server's progress
(GetIngestProgress, polled every POLL_S) moves the bar by the pages read so far and shows the newest document's stage
and OCR's pages; each warning is printed as it arises. A document done moves the bar to its pages as the server
counted them. The last line gives the batch's figures. With --ray, PDFs and images are parsed on a Ray cluster
first (ray_ingest.py) and go up as MinerU output.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, TextIO

import grpc
from tqdm import tqdm

from . import AsyncThinkServeClient
from ..knowledge.parsing.local_documents import LocalSource, find_documents, read_source
from .ray_ingest import ParseFailure, RayOptions, RaySession, parsed_on_ray

if TYPE_CHECKING:
    from ..api.protos import pb

POLL_S = 0.5  # how often the server's ingest progress is read while documents are in flight


@dataclass
class BatchTotals:
    documents: int = 0
    pages: int = 0
    ocr_pages: int = 0
    blocks: int = 0
    chunks: int = 0
    entities: int = 0
    failed: int = 0
    pending: dict = field(default_factory=dict)  # name -> document id of commits queries may not see yet


def estimated_pages(path: Path) -> int:
    """Pages of a document before it is sent: a PDF's page count (pdfium reads the page tree only), a MinerU output
    folder's (the PDF beside its content list, else the content list's last page), 1 for anything else."""
    if path.is_dir():
        return _folder_pages(path)
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


def _folder_pages(folder: Path) -> int:
    from ..knowledge.parsing.content_list import read_content_list
    from ..knowledge.parsing.sources import CONTENT_LIST_PATTERNS, find_origin

    lists = sorted(p for pattern in CONTENT_LIST_PATTERNS for p in folder.rglob(pattern) if p.is_file())
    if not lists:
        return 1
    try:
        origin = find_origin(lists[0])
        if origin is not None and origin.suffix.lower() == ".pdf":
            return estimated_pages(origin)
        return max(1, read_content_list(lists[0]).page_count)
    except Exception:  # the server reports what is wrong with it
        return 1


async def ingest_paths(
    address: str,
    collection: str,
    paths: list[Path],
    concurrency: int = 2,
    token: str = "",
    out: Optional[TextIO] = None,
    ray: Optional[RayOptions] = None,
) -> int:
    """Ingest every document found under `paths`; returns the number that failed.

    With `ray`, PDFs and images are parsed by MinerU on a Ray cluster first and uploaded as MinerU output
    (ray_ingest.py); the report, progress bar and failure counting are the same either way.
    """
    out = out or sys.stdout
    documents = find_documents(paths)
    if not documents:
        print("no documents found (PDF, PNG, JPEG, Markdown, text, or folders with a *_content_list.json)", file=out)
        return 0
    on_ray = [i for i, (path, _) in enumerate(documents) if ray is not None and parsed_on_ray(path)]
    weights = {path: estimated_pages(path) for path, _ in documents}
    session = RaySession(ray).start(log=lambda line: print(line, file=sys.stderr)) if on_ray else None
    totals = BatchTotals()
    limit = asyncio.Semaphore(max(1, concurrency))  # uploads in flight, from either source
    bar = tqdm(total=sum(weights.values()), unit="page", file=sys.stderr, dynamic_ncols=True)
    in_flight: dict[str, None] = {}  # names, in the order they were sent
    live = LiveProgress()
    finished_pages = 0
    started = time.monotonic()

    def show() -> None:
        current = next(reversed(in_flight), "")
        target = min(bar.total, finished_pages + live.pages_read(in_flight))
        if target > bar.n:
            bar.update(target - bar.n)
        else:  # a failed document's pages left the total
            bar.n = target
            bar.refresh()
        bar.set_postfix_str(f"ocr={totals.ocr_pages + live.ocr_pages(in_flight)} docs={totals.documents}/{len(documents)} "
                            f"failed={totals.failed}" + (f" now: {current}" if current else "") + live.stage_of(current))

    def done(path: Path, name: str, line: str, pages: Optional[int] = None) -> None:
        """A document finished: the bar stands at its pages as the server counted them; a failed one's pages leave
        the total."""
        nonlocal finished_pages
        bar.total += (0 if pages is None else pages) - weights[path]
        finished_pages += pages or 0
        live.forget(name)
        show()
        bar.write(line, file=out)

    async def follow(client: AsyncThinkServeClient, finished: asyncio.Event) -> None:
        """The server's progress on the documents in flight, until the batch is done; a failed read is skipped."""
        while not finished.is_set():
            if in_flight:
                try:
                    ingesting = await client.ingest_progress(collection, timeout_s=POLL_S * 4)
                except grpc.aio.AioRpcError as error:
                    if error.code() == grpc.StatusCode.UNIMPLEMENTED:
                        return  # a server from before GetIngestProgress: the bar moves as documents finish
                    ingesting = None
                if ingesting is not None:
                    for name, warning in live.update(ingesting, in_flight):
                        bar.write(f"{name}: warning: {warning}", file=out)
                    show()
            try:
                await asyncio.wait_for(finished.wait(), POLL_S)
            except asyncio.TimeoutError:
                pass

    async def upload(client: AsyncThinkServeClient, path: Path, name: str, load: Callable[[], LocalSource]) -> None:
        """Runs holding one `limit` slot, which the caller acquired."""
        in_flight[name] = None
        show()
        try:
            line, pages = await _ingest_one(client, collection, name, load, totals)
        finally:
            limit.release()
            in_flight.pop(name, None)
        done(path, name, line, pages)

    async def direct(client: AsyncThinkServeClient, path: Path, name: str) -> None:
        await limit.acquire()
        await upload(client, path, name, lambda: read_source(path, name))

    async def parsed(client: AsyncThinkServeClient) -> None:
        """Uploads the zips as the Ray workers finish them; a slot is taken before the next result is pulled."""
        pending, uploads = set(on_ray), []
        try:
            async for index, outcome in session.parse([(i, documents[i][0]) for i in on_ray]):
                pending.discard(index)
                path, name = documents[index]
                await limit.acquire()
                uploads.append(asyncio.create_task(upload(client, path, name, _parsed_source(name, outcome))))
        except Exception as error:  # the cluster failed (not one document): what it had not parsed fails with it
            last = (str(error).strip().splitlines() or [""])[-1]  # Ray's errors end with the cause after a traceback
            cause = f"UNAVAILABLE: the Ray job failed: {type(error).__name__}: {last}"
            for index in sorted(pending):
                totals.failed += 1
                done(documents[index][0], documents[index][1], f"FAILED {documents[index][1]}: {cause}")
        finally:
            await asyncio.gather(*uploads)

    try:
        async with AsyncThinkServeClient(address, timeout_s=None, token=token) as client:
            ray_indices = set(on_ray)
            jobs = [direct(client, path, name) for i, (path, name) in enumerate(documents) if i not in ray_indices]
            finished = asyncio.Event()
            watcher = asyncio.create_task(follow(client, finished))
            try:
                await asyncio.gather(*jobs, *([parsed(client)] if on_ray else []))
            finally:
                finished.set()
                await watcher
            unseen = await wait_visible(client, collection, totals.pending)
            if unseen:
                print(f"not yet visible to queries after 600 s (changed by another writer?): {', '.join(unseen)}", file=out)
    finally:
        bar.close()
        if session is not None:
            session.close()
    seconds = time.monotonic() - started
    print(
        f"{totals.documents} documents ingested into {collection}: {totals.pages} pages ({totals.ocr_pages} read by OCR) "
        f"in {seconds:.1f} s, {totals.pages / seconds if seconds > 0 else 0.0:.2f} pages/s; {totals.blocks} blocks, "
        f"{totals.chunks} chunks, {totals.entities} entities; {totals.failed} failed",
        file=out,
    )
    return totals.failed


class LiveProgress:
    """What the server last said of this batch's documents in flight (by name): pages read, OCR's pages, stage;
    and which of their warnings were printed already."""

    def __init__(self):
        self.documents: dict[str, "pb.IngestingDocument"] = {}
        self.warned: dict[str, set[str]] = {}

    def update(self, ingesting: list, in_flight) -> list[tuple[str, str]]:
        """Takes the server's list; returns the (name, warning) pairs not told before, of this batch's documents."""
        new = []
        for document in ingesting:
            if document.name not in in_flight:
                continue  # another client's upload to the same collection
            self.documents[document.name] = document
            told = self.warned.setdefault(document.name, set())
            for warning in document.warnings:
                if warning not in told:
                    told.add(warning)
                    new.append((document.name, warning))
        return new

    def forget(self, name: str) -> None:
        self.documents.pop(name, None)

    def pages_read(self, in_flight) -> int:
        return sum(d.pages_read for name, d in self.documents.items() if name in in_flight)

    def ocr_pages(self, in_flight) -> int:
        return sum(d.ocr_pages for name, d in self.documents.items() if name in in_flight)

    def stage_of(self, name: str) -> str:
        document = self.documents.get(name)
        if document is None:
            return ""
        ocr = f", ocr {document.ocr_pages}/{document.ocr_pages_planned}" if document.ocr_pages_planned else ""
        return f" ({document.stage}: {document.pages_read}/{document.pages_total} pages read{ocr})"


async def wait_visible(
    client: AsyncThinkServeClient, collection: str, expected: dict[str, str], timeout_s: float = 600.0, poll_s: float = 0.1
) -> list[str]:
    """Wait until the collection lists every expected (name, document id), i.e. queries see the whole batch;
    returns the names still not seen after `timeout_s` (another writer may have changed them meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while True:
        listed = {d.name: d.document_id for d in await client.list_documents(collection)}
        missing = sorted(name for name, document_id in expected.items() if listed.get(name) != document_id)
        if not missing or time.monotonic() > deadline:
            return missing
        await asyncio.sleep(poll_s)


def _parsed_source(name: str, outcome: bytes | ParseFailure) -> Callable[[], LocalSource]:
    """What a Ray worker made of a document: its MinerU output as a zip, or its failure (raised on upload)."""

    def load() -> LocalSource:
        if isinstance(outcome, ParseFailure):
            raise outcome
        return LocalSource(name, outcome, "application/zip")

    return load


async def _ingest_one(
    client: AsyncThinkServeClient, collection: str, name: str, load: Callable[[], LocalSource], totals: BatchTotals
) -> tuple[str, Optional[int]]:
    """The document's report line, and its pages as the server counted them (None when it failed)."""
    try:
        source = load()
        # durable is enough per document: the server then publishes the batch's commits together, and the
        # batch waits once, at its end, until queries see them all
        report = await client.ingest(collection, source.data, source.name, source.media_type, return_when_durable=True)
    except grpc.aio.AioRpcError as error:
        totals.failed += 1
        return f"FAILED {name}: {error.code().name}: {error.details()}", None
    except ParseFailure as failure:
        totals.failed += 1
        return f"FAILED {name}: {failure} (MinerU on Ray node {failure.node})", None
    except (OSError, ValueError) as error:
        totals.failed += 1
        return f"FAILED {name}: {error}", None
    document = report.document
    totals.documents += 1
    if not report.visible:
        totals.pending[document.name] = document.document_id
    pages = max(1, document.pages)  # a text counts as one page, as it was estimated
    if report.already_present:
        return f"{name}: already present as {document.name} (nothing changed)", pages
    totals.pages += pages
    totals.ocr_pages += document.ocr_pages
    totals.blocks += document.blocks
    totals.chunks += document.chunks
    totals.entities += document.entities
    state = "replaced" if report.replaced else "added"
    warnings = f"; {len(document.warnings)} warnings: {'; '.join(document.warnings[:3])}" if document.warnings else ""
    ocr = f" ({document.ocr_pages} read by OCR)" if document.ocr_pages else ""
    return (
        f"{name}: {state}, {document.pages} pages{ocr}, {document.chunks} chunks, {document.units} units, "
        f"{document.entities} entities, {document.relations} relations in {report.seconds:.1f} s "
        f"({report.pages_per_s:.2f} pages/s){warnings}"
    ), pages

