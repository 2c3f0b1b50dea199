"""What a benchmark runs against: a deployment at an address (optionally with its Triton URL for server-side
statistics), or one the command starts itself.

A deployment the command starts runs in a child process (Triton is a process of its own anyway), so the load
generator never shares an interpreter, GIL or event loop with the server it measures.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Callable, Optional, Sequence

from orchestrator.config import Settings
from orchestrator.errors import ConfigurationError

SAMPLE_DOCUMENT = Path("samples/northwind-2024-annual-report.md")


@dataclass(frozen=True)
class Target:
    address: str
    triton_url: str = ""  # empty: no server-side statistics (reports say so)
    own: bool = False  # started by this command (in a child process)
    in_process: bool = False  # the orchestrator runs in the generator's own process (tests): overhead shared
    profile: str = ""
    token: str = ""  # bearer token for a deployment that requires one (off loopback)
    http: str = ""  # its HTTP base URL, when started here with the HTTP endpoint on


def _serve(settings: Settings, connection) -> None:
    """Child process: start the deployment, send (address, triton_url), stop when the parent says so.

    Ctrl-C reaches the whole foreground process group, this child too: it ignores SIGINT and leaves the
    shutdown to the parent, which asks for it in order. Interrupted half-way through its own stop, it would
    die and orphan tritonserver (a session of its own, so no signal of the terminal reaches it)."""
    from orchestrator.server.deployment import running

    signal.signal(signal.SIGINT, signal.SIG_IGN)

    async def main() -> None:
        try:
            async with running(settings, progress=lambda _: None) as deployment:
                connection.send(("ready", deployment.address, deployment.triton_url, deployment.http_address or ""))
                await asyncio.to_thread(connection.recv)
        except BaseException as error:  # noqa: BLE001 - reported to the parent, which raises it
            connection.send(("failed", f"{type(error).__name__}: {error}", "", ""))

    asyncio.run(main())


@contextlib.asynccontextmanager
async def own_deployment(settings: Settings, progress: Callable[[str], None] = print) -> AsyncIterator[Target]:
    """Triton + orchestrator in a child process, on a free port, with the settings' data folder."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_serve, args=(settings, child), name="thinkserve-bench-deployment", daemon=True)
    progress("starting Triton and the orchestrator in a child process ...")
    process.start()
    try:
        ready = await asyncio.to_thread(parent.poll, settings.triton.startup_timeout_s + 60)
        if not ready:
            raise ConfigurationError("the deployment did not start in time")
        state, address, triton_url, http = parent.recv()
        if state != "ready":
            raise ConfigurationError(f"the deployment failed to start: {address}")
        progress(f"deployment ready: orchestrator {address}, Triton {triton_url}")
        yield Target(address, triton_url, own=True, profile=settings.profile, http=http)
    finally:
        if process.is_alive():
            with contextlib.suppress(BrokenPipeError, OSError):
                parent.send("stop")
            await asyncio.to_thread(process.join, settings.server.shutdown_grace_s + settings.triton.exit_timeout_s + 30)
        if process.is_alive():
            process.terminate()


def bench_settings_for(settings: Settings, data_dir: Path) -> Settings:
    """The deployment settings a self-started benchmark uses: any free ports (gRPC and HTTP: the ablations run
    several deployments at once) and a throw-away data folder."""
    return settings.scratch(data_dir)


def default_documents(folder: Path, quality_documents: int = 2, quality_pages: int = 4, seed: int = 7) -> list[Path]:
    """The sample report (Markdown), a three-page PDF with a table and a chart, and generated report PDFs
    (benchmarks/thinkserve_bench/corpora/quality_corpus.py, one subject per page)."""
    documents = [SAMPLE_DOCUMENT] if SAMPLE_DOCUMENT.is_file() else []
    folder.mkdir(parents=True, exist_ok=True)
    from .corpora import pdf_factory, quality_corpus  # reportlab: the bench extra

    documents.append(pdf_factory.write_sample_report(folder / "northwind-report.pdf").path)
    documents += quality_corpus.write_quality_corpus(folder / "quality", quality_documents, quality_pages, seed).files
    return documents


async def ingest(address: str, collection: str, documents: Sequence[Path], progress: Callable[[str], None] = print,
                 token: str = "") -> dict:
    """Ingest documents into the collection (already-present bytes are kept as they are)."""
    from orchestrator.client import AsyncThinkServeClient

    pages = chunks = 0
    async with AsyncThinkServeClient(address, timeout_s=1800, token=token) as client:
        for path in documents:
            report = await client.ingest_file(collection, path)
            pages, chunks = pages + report.document.pages, chunks + report.document.chunks
            progress(f"ingested {path.name}: {report.document.pages} pages, {report.document.chunks} chunks, {report.seconds:.1f} s")
    return {"documents": [p.name for p in documents], "pages": pages, "chunks": chunks}


@contextlib.asynccontextmanager
async def open_target(
    address: str,
    triton_url: str,
    settings: Settings,
    collection: str,
    documents: Optional[Sequence[Path]],
    progress: Callable[[str], None] = print,
    token: str = "",
) -> AsyncIterator[tuple[Target, dict]]:
    """The deployment at `address`, or one started here and loaded with `documents` (default: default_documents)."""
    if address:
        corpus = await ingest(address, collection, documents, progress, token) if documents else {"documents": [], "preloaded": True}
        yield Target(address, triton_url, own=False, profile=settings.profile, token=token), corpus
        return
    with tempfile.TemporaryDirectory(prefix="thinkserve-bench-") as folder:
        work = Path(folder)
        paths = list(documents) if documents else default_documents(work / "documents")
        async with own_deployment(bench_settings_for(settings, work / "data"), progress) as target:
            corpus = await ingest(target.address, collection, paths, progress)
            yield target, corpus
