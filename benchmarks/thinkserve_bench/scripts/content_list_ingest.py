"""Content-list ingest against a plain chunk-and-embed loop over the same pages, with the same embedder, in one run.

    thinkserve-bench content_list_ingest [--dataset ../shared/benchmarks/mmlongbench-dev] [--documents N]
        [--concurrency 2] [--rounds 2] [--origin] [--triton-url HOST:PORT] [--config FILE] [--output DIR] [--name NAME]

The dataset's PDFs are parsed once with MinerU (the settings' tier, in a subprocess, one document at a time, as the
service runs it) and each parse output is zipped as a MinerU output folder: `content_list.json` and `images/`, the
form in which the service accepts a content list made elsewhere (orchestrator/knowledge/parsing/sources.py; packed as
`thinkserve ingest --ray` packs it). The zips are cached in .thinkserve/content_lists/<dataset>/<tier>/ with each
parse's seconds, so a re-run skips the parse. Without --origin the zips carry no original PDF, so the service
renders no page images and runs no page-image encoder: text ingest. With --origin they carry it as
`document_origin.pdf` (as --ray sends them), and the service takes the page count and page images from it.

Then, against one real Triton (default settings of the profile), rounds in ABBA order (round 1: A, B, B'; round 2:
B', B, A; ...), so a machine warming or throttling during the run favours no pass:
  A   full ingest: the real Ingestor over the zips into a fresh data folder per round, `concurrency` documents in
      flight (as `thinkserve ingest`), default settings: passages, units, chunks, extraction, every embedding,
      commit and publish (BM25 and graph built before the ingest answers, as a server does).
  B   the plain loop, one document at a time: each zip unpacked and read by the service's own reader
      (sources.unpack_content_list + content_list.read_content_list: the same blocks A reads), each page's text
      cut into windows of ingest.embed_window_tokens of the embedder's tokens (page_baselines.windows), embedded
      through the same Triton model in requests of 32, one at a time, vectors added to one faiss IndexFlatIP.
  B'  B with `concurrency` documents in flight (skipped at --concurrency 1).
Pages of a pass are the page counts the reader gives (DocumentRecord.pages for A). Reports pages/s of every pass
(each round and the median), A against B as a ratio, the issue's goal lines, wall time per ingest stage, the batch
sizes Triton executed per text model and their compute seconds, and the collection's memory (RSS of a fresh process
loading it, warmed as a server warms it) and disk per 1,000 pages.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from thinkserve_bench.machine import machine_facts
from thinkserve_bench.catalogue import UsageError
from thinkserve_bench.result_files import RESULTS, uncommitted_changes, write_and_show
from orchestrator.config import Settings
from orchestrator.knowledge.parsing import sources
from orchestrator.knowledge.parsing.content_list import read_content_list
from orchestrator.knowledge.parsing.documents import ParsedDocument
from orchestrator.knowledge.storage.indexes import index_spec
from orchestrator.knowledge.ingest import Ingestor, IngestResult, mineru_options
from orchestrator.knowledge.parsing.mineru import CONTENT_LIST_NAME, MineruParser
from orchestrator.knowledge.parsing.pdf import inspect_pdf
from orchestrator.knowledge.storage.registry import KnowledgeBase
from orchestrator.knowledge.parsing.local_documents import zip_files
from orchestrator.client.ray_ingest import ORIGIN_STEM
from orchestrator.models.tokens import PlainTokenizer
from orchestrator.triton.client import TritonClient
from orchestrator.models.contracts import all_contracts
from orchestrator.triton.launcher import TritonServer
from orchestrator.triton.models import TritonModels

from .document_qa import DEFAULT_DATASET
from .ingest import _LOAD_PROBE, BATCHED_MODELS, batch_histogram, compute_seconds
from .page_baselines import page_texts, windows

NAME = "content_list_ingest"
CACHE = Path(__file__).resolve().parents[3] / ".thinkserve" / "content_lists"
PARSE_RECORD = "parse.json"
COLLECTION = "bench"
PLAIN_BATCH = 32  # texts per request of the plain loop: text_embedder's max_batch_size in the tiny repository
# the text models plus the page-image encoders, which must stay idle without --origin
MODELS = ("text_embedder_tokenize",) + BATCHED_MODELS
GOAL_PAGES_PER_S = 3.5
GOAL_RATIO = 2.0
FULL, PLAIN, PLAIN_CONCURRENT = "full", "plain", "plain_concurrent"
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Upload:
    """One document as the service receives it: the zip's name and bytes."""

    name: str
    data: bytes


# -- the content lists, parsed once ------------------------------------------------------------------------------


def cached_content_lists(settings: Settings, pdfs: list[Path], folder: Path, progress: Progress) -> dict[str, dict]:
    """Each PDF's content-list zip in `folder`, parsed now only when the cache holds none from this MinerU version
    and tier; returns the parse record of each PDF (pages, seconds, when)."""
    folder.mkdir(parents=True, exist_ok=True)
    record_path = folder / PARSE_RECORD
    records: dict[str, dict] = json.loads(record_path.read_text()) if record_path.exists() else {}
    parser = MineruParser(mineru_options(settings.ingest))
    stamp = {"mineru": parser.version, "tier": settings.ingest.parser_tier, "mode": settings.ingest.parser_mode}
    for pdf in pdfs:
        entry, target = records.get(pdf.name, {}), folder / f"{pdf.stem}.zip"
        if target.is_file() and entry.get("pdf_bytes") == pdf.stat().st_size and all(
            entry.get(key) == value for key, value in stamp.items()
        ):
            continue
        with tempfile.TemporaryDirectory(prefix="thinkserve-cl-parse-") as scratch:
            work = Path(scratch) / "mineru"
            started = time.monotonic()
            parsed = parser.parse(pdf, work)
            seconds = time.monotonic() - started
            members = {CONTENT_LIST_NAME: work / CONTENT_LIST_NAME}
            members.update((p.relative_to(work).as_posix(), p) for p in (work / "images").rglob("*") if p.is_file())
            _write_atomically(target, zip_files(members))
        records[pdf.name] = {**stamp, "pdf_bytes": pdf.stat().st_size, "pdf_pages": parsed.page_count,
                             "seconds": seconds, "parsed_at": time.strftime("%Y-%m-%d %H:%M:%S")}
        _write_atomically(record_path, (json.dumps(records, indent=1, sort_keys=True) + "\n").encode())
        progress(f"parsed {pdf.name}: {parsed.page_count} pages in {seconds:.1f} s")
    return {pdf.name: records[pdf.name] for pdf in pdfs}


def _write_atomically(path: Path, data: bytes) -> None:
    """An interrupted run leaves the previous file or none, never half of one (the cache trusts what it finds)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    partial.replace(path)


def upload_of(pdf: Path, cached_zip: Path, origin: bool, scratch: Path) -> Upload:
    """The document the benchmark sends: the cached zip, or with `origin` the same members plus the PDF."""
    name = f"{pdf.stem}.zip"
    if not origin:
        return Upload(name, cached_zip.read_bytes())
    with tempfile.TemporaryDirectory(dir=scratch) as unpacked:
        folder = Path(unpacked)
        content_list = sources.unpack_content_list(cached_zip, folder, name)
        members = {p.relative_to(folder).as_posix(): p for p in content_list.parent.rglob("*") if p.is_file()}
        members[f"{ORIGIN_STEM}.pdf"] = pdf
        return Upload(name, zip_files(members))


def read_upload(upload: Upload, work: Path) -> ParsedDocument:
    """The blocks the service reads from this upload, read by its own functions (the parse stage of ingest.py)."""
    archive = work / "upload.zip"
    archive.write_bytes(upload.data)
    content_list = sources.unpack_content_list(archive, work / "unpacked", upload.name)
    origin = sources.find_origin(content_list)
    pages = inspect_pdf(origin) if origin is not None and origin.suffix.lower() == ".pdf" else None
    return read_content_list(content_list, page_count=pages)


def corpus_facts(uploads: list[Upload], scratch: Path) -> dict[str, Any]:
    """Pages, pages with text and blocks of each document, as the reader gives them (outside any timing)."""
    facts: dict[str, Any] = {}
    for upload in uploads:
        with tempfile.TemporaryDirectory(dir=scratch) as folder:
            document = read_upload(upload, Path(folder))
        with_text = {b.page for b in document.blocks if b.content.strip() or b.caption.strip()}
        facts[upload.name] = {
            "pages": document.page_count, "pages_with_text": len(with_text & set(range(document.page_count))),
            "blocks": len(document.blocks), "visual_blocks": sum(b.is_visual for b in document.blocks),
            "zip_bytes": len(upload.data), "parser": document.parser,
        }
    return facts


# -- the passes ---------------------------------------------------------------------------------------------------


async def full_pass(models: TritonModels, settings: Settings, uploads: list[Upload], concurrency: int,
                    data_dir: Path) -> tuple[float, list[IngestResult]]:
    """A: the service's ingest, configured as a server configures it, into a fresh data folder."""
    storage = settings.storage
    knowledge = KnowledgeBase(data_dir, index_spec(settings.index), warm=storage.warm_snapshots,
                              retain_dropped_s=storage.retain_dropped_s)
    try:
        ingestor = Ingestor(knowledge, models, settings.ingest, settings.tokenizer_file,
                            settings.retrieval.relation_seeds)
        limit = asyncio.Semaphore(concurrency)

        async def one(upload: Upload) -> IngestResult:
            async with limit:
                return await ingestor.ingest(COLLECTION, upload.name, upload.data)

        started = time.monotonic()
        results = await asyncio.gather(*(one(upload) for upload in uploads))
        return time.monotonic() - started, list(results)
    finally:
        knowledge.close()


async def plain_pass(models: TritonModels, tokenizer: PlainTokenizer, window: int, uploads: list[Upload],
                     concurrency: int, dimension: int, scratch: Path) -> tuple[float, int, int]:
    """B: read, cut into windows, embed 32 at a time, add to a flat index; nothing else. (seconds, pages, vectors)"""
    index = faiss.IndexFlatIP(dimension)
    limit = asyncio.Semaphore(concurrency)

    async def one(upload: Upload) -> int:
        async with limit:
            with tempfile.TemporaryDirectory(dir=scratch) as folder:
                document = await asyncio.to_thread(read_upload, upload, Path(folder))
            passages = [piece for text in page_texts(document) for piece in windows(text, tokenizer, window)]
            for start in range(0, len(passages), PLAIN_BATCH):
                index.add(np.ascontiguousarray(await models.embed(passages[start : start + PLAIN_BATCH]), np.float32))
            return document.page_count

    started = time.monotonic()
    pages = await asyncio.gather(*(one(upload) for upload in uploads))
    return time.monotonic() - started, sum(pages), index.ntotal


async def statistics_of(client: TritonClient) -> dict[str, dict]:
    return {model: await client.model_statistics(model) for model in MODELS}


def pass_order(rounds: int, concurrency: int) -> list[tuple[int, str]]:
    """ABBA: every other round runs its passes in reverse, so a linear drift of the machine cancels out."""
    kinds = [FULL, PLAIN] + ([PLAIN_CONCURRENT] if concurrency > 1 else [])
    return [(number, kind) for number in range(rounds) for kind in (kinds if number % 2 == 0 else kinds[::-1])]


async def measure(url: str, settings: Settings, uploads: list[Upload], concurrency: int, rounds: int, work: Path,
                  progress: Progress) -> dict[str, Any]:
    tokenizer = PlainTokenizer(settings.tokenizer_file, "ingest.tokenizer")
    window = settings.ingest.embed_window_tokens
    passes: list[dict[str, Any]] = []
    last_full: Path | None = None
    async with TritonClient(url, default_timeout_s=600) as client:
        models = TritonModels(client)
        # warm every model path both passes use before anything is timed
        dimension = int((await models.embed(["One sentence warms the embedder."])).shape[1])
        warm = KnowledgeBase(work / "warmup", index_spec(settings.index))
        try:
            await Ingestor(warm, models, settings.ingest, settings.tokenizer_file).ingest(
                "warmup", "warmup.md", b"# Warm-up\n\nOne sentence warms every model path.")
        finally:
            warm.close()
        for number, kind in pass_order(rounds, concurrency):
            load = os.getloadavg()[0]
            before = await statistics_of(client)
            record: dict[str, Any] = {"round": number + 1, "pass": kind, "load_average_1m_before": load}
            if kind == FULL:
                data_dir = work / f"full-{number}"
                seconds, results = await full_pass(models, settings, uploads, concurrency, data_dir)
                if last_full is not None:
                    shutil.rmtree(last_full, ignore_errors=True)
                last_full = data_dir
                record.update(full_record(results), documents_in_flight=concurrency)
            else:
                in_flight = 1 if kind == PLAIN else concurrency
                seconds, pages, vectors = await plain_pass(models, tokenizer, window, uploads, in_flight, dimension,
                                                           work)
                record.update(pages=pages, vectors=vectors, documents_in_flight=in_flight)
            after = await statistics_of(client)
            record.update(
                seconds=seconds, pages_per_s=record["pages"] / seconds,
                triton_batch_sizes={m: batch_histogram(before[m], after[m]) for m in MODELS},
                triton_compute_seconds={m: compute_seconds(before[m], after[m]) for m in MODELS},
            )
            passes.append(record)
            progress(f"round {number + 1} {kind}: {record['pages']} pages in {seconds:.1f} s "
                     f"({record['pages_per_s']:.2f} pages/s)")
    assert last_full is not None
    return {"passes": passes, "last_full_data_dir": str(last_full)}


def full_record(results: list[IngestResult]) -> dict[str, Any]:
    """What one full pass stored, and its wall time per stage summed over documents."""
    documents = [result.document for result in results]
    stages: dict[str, float] = {}
    for result in results:
        for stage, seconds in result.stage_seconds.items():
            stages[stage] = stages.get(stage, 0.0) + seconds
    return {
        "pages": sum(d.pages for d in documents),
        "passages": sum(d.passages for d in documents),
        "units": sum(d.units for d in documents),
        "chunks": sum(d.chunks for d in documents),
        "entities": sum(d.entities for d in documents),
        "relations": sum(d.relations for d in documents),
        "already_present": sum(result.already_present for result in results),
        "stage_seconds_summed_over_documents": stages,
        "pages_per_document": {d.name: d.pages for d in documents},
        "warnings": {d.name: list(d.warnings) for d in documents if d.warnings},
    }


def collection_cost(data_dir: Path, pages: int) -> dict[str, Any]:
    """RSS of a fresh process loading the last full pass's collection (warmed as a server warms it) and its disk size,
    per 1,000 of the pass's pages (the probe's `pages` are page images, none without --origin)."""
    probe = subprocess.run([sys.executable, "-c", _LOAD_PROBE, str(data_dir), COLLECTION],
                           capture_output=True, text=True, check=True)
    loaded = json.loads(probe.stdout)
    folder = data_dir / "collections" / COLLECTION
    disk_bytes = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    return {
        "loaded": loaded, "disk_bytes": disk_bytes,
        "memory_mib_per_1000_pages": loaded["rss_delta_mib"] * 1000 / max(pages, 1),
        "disk_mib_per_1000_pages": disk_bytes / 2**20 * 1000 / max(pages, 1),
    }


# -- the report ---------------------------------------------------------------------------------------------------


def summarize_passes(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per pass kind, A against B, the goals, and Triton's work per kind (summed over its rounds)."""
    kinds: dict[str, list[dict]] = {}
    for record in passes:
        kinds.setdefault(record["pass"], []).append(record)
    median = {kind: statistics.median(r["pages_per_s"] for r in records) for kind, records in kinds.items()}
    ratio = median[FULL] / median[PLAIN]
    by_round = {r["round"]: r for r in kinds[FULL]}
    histograms: dict[str, dict[str, dict[str, int]]] = {}
    compute: dict[str, dict[str, float]] = {}
    for kind, records in kinds.items():
        histograms[kind] = {m: _merged([r["triton_batch_sizes"][m] for r in records]) for m in MODELS}
        compute[kind] = {m: sum(r["triton_compute_seconds"][m] for r in records) / len(records) for m in MODELS}
    stages: dict[str, float] = {}
    for record in kinds[FULL]:
        for stage, seconds in record["stage_seconds_summed_over_documents"].items():
            stages[stage] = stages.get(stage, 0.0) + seconds / len(kinds[FULL])
    return {
        "median_pages_per_s": median,
        "full_vs_plain": ratio,
        "full_vs_plain_per_round": {n: by_round[n]["pages_per_s"] / r["pages_per_s"]
                                    for n, r in ((r["round"], r) for r in kinds[PLAIN]) if n in by_round},
        "full_vs_plain_concurrent": median[FULL] / median[PLAIN_CONCURRENT] if PLAIN_CONCURRENT in median else None,
        "goal_pages_per_s_met": median[FULL] >= GOAL_PAGES_PER_S,
        "goal_ratio_met": ratio >= GOAL_RATIO,
        "triton_batch_sizes_summed_over_rounds": histograms,
        "triton_compute_seconds_per_round": compute,
        "texts_embedded_per_round": {
            kind: sum(int(size) * n for size, n in histograms[kind]["text_embedder_encode"].items()) / len(records)
            for kind, records in kinds.items()
        },
        "full_stage_seconds_per_round": stages,
    }


def _merged(histograms: list[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for histogram in histograms:
        for size, count in histogram.items():
            total[size] = total.get(size, 0) + count
    return {size: total[size] for size in sorted(total, key=int)}


LABELS = {
    FULL: "A: full ingest ({c} documents in flight)",
    PLAIN: "B: plain chunk-and-embed loop (one document at a time)",
    PLAIN_CONCURRENT: "B': plain loop, {c} documents in flight",
}


def report(stats: dict[str, Any], settings: Settings, dataset: Path, command: str, machine: dict, concurrency: int,
           rounds: int, origin: bool) -> tuple[dict, str]:
    s, corpus, summary, cost = stats, stats["corpus"], stats["summary"], stats["collection"]
    median, parse = summary["median_pages_per_s"], stats["parse"]
    pages = sum(f["pages"] for f in corpus.values())
    pdf_pages = sum(record["pdf_pages"] for record in parse.values())
    with_text = sum(f["pages_with_text"] for f in corpus.values())
    parse_seconds = sum(record["seconds"] for record in parse.values())
    parse_rate = pdf_pages / parse_seconds
    ingest = settings.ingest

    def label(kind: str) -> str:
        return LABELS[kind].format(c=concurrency)

    def met(flag: bool) -> str:
        return "**met**" if flag else "**not met**"

    lines = [
        "# Content-list ingest against a plain chunk-and-embed loop",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine['cpu']}, {machine['logical_cores']} logical cores, {machine['memory_gib']} GiB, GPU: "
        f"{machine['gpu']}, Python {machine['python']}, load average at start {machine['load_average'][0]:.2f}  ",
        f"Corpus: `{dataset.name}`, {len(corpus)} real PDFs parsed once with MinerU {_first(parse, 'mineru')} "
        f"(tier `{_first(parse, 'tier')}`) and ingested as zipped content lists "
        + ("with the original PDF (page images rendered and encoded)" if origin else
           "(content_list.json + images/, no original PDF: no page images, text ingest)")
        + f": {pages} pages as the content-list reader counts them ({pdf_pages} pages in the PDFs), {with_text} "
        f"pages with text, {sum(f['blocks'] for f in corpus.values())} blocks "
        f"({sum(f['visual_blocks'] for f in corpus.values())} tables/figures/equations).  ",
        f"Profile `{settings.profile}`, default settings: extractor `{ingest.extractor}`, describer "
        f"`{ingest.describer}`, passages of {ingest.passage_tokens} tokens, chunks {ingest.chunk_tokens}/"
        f"{ingest.chunk_overlap_tokens}, embed batches of {ingest.embed_batch} with {ingest.max_concurrent_calls} "
        f"in flight. {rounds} round{'s' if rounds > 1 else ''}, ABBA order.  ",
        f"MinerU parse only (when the cache was made, one document at a time): {parse_seconds:.0f} s, "
        f"{parse_rate:.2f} pages/s; not part of any pass below.",
        "",
        "| round | pass | seconds | pages | pages/s | load (1 min) before |",
        "|---:|---|---:|---:|---:|---:|",
        *[f"| {r['round']} | {label(r['pass'])} | {r['seconds']:.1f} | {r['pages']} | {r['pages_per_s']:.2f} | "
          f"{r['load_average_1m_before']:.2f} |" for r in s["passes"]],
        *[f"| median | {label(kind)} | | | **{rate:.2f}** | |" for kind, rate in median.items()],
        "",
        f"A / B = **{summary['full_vs_plain']:.2f}x** (per round: "
        + ", ".join(f"{ratio:.2f}" for ratio in summary["full_vs_plain_per_round"].values()) + ")"
        + (f"; A / B' = {summary['full_vs_plain_concurrent']:.2f}x." if summary["full_vs_plain_concurrent"] else "."),
        "",
        f"- Goal: text ingest >= {GOAL_PAGES_PER_S} pages/s: {median[FULL]:.2f} pages/s, "
        f"{met(summary['goal_pages_per_s_met'])}.",
        f"- Goal: at least {GOAL_RATIO:g}x the plain loop: {summary['full_vs_plain']:.2f}x, "
        f"{met(summary['goal_ratio_met'])}.",
        "",
        f"Texts embedded per round: A {summary['texts_embedded_per_round'][FULL]:.0f} (passages, units and entity "
        f"descriptions; each distinct text once), B {summary['texts_embedded_per_round'][PLAIN]:.0f} "
        f"({ingest.embed_window_tokens}-token windows of each page's text).",
        "",
        "Wall time per stage of A, summed over documents, mean of its rounds (stages of concurrent documents overlap):",
        "",
        "| stage | seconds |",
        "|---|---:|",
        *[f"| {stage} | {seconds:.2f} |"
          for stage, seconds in sorted(summary["full_stage_seconds_per_round"].items(), key=lambda kv: -kv[1])],
        "",
        "Batch sizes Triton executed, summed over the rounds of each pass (batch size: executions); model compute "
        "seconds per round:",
        "",
        "| model | pass | batch sizes | compute s |",
        "|---|---|---|---:|",
        *[f"| `{model}` | {kind} | {summary['triton_batch_sizes_summed_over_rounds'][kind][model] or 'none'} | "
          f"{summary['triton_compute_seconds_per_round'][kind][model]:.1f} |"
          for model in MODELS for kind in median],
        "",
        f"Collection cost (the last A round): {cost['memory_mib_per_1000_pages']:.0f} MiB of RSS per 1,000 pages once "
        f"loaded (warmed as a server warms it; {cost['loaded']['evidence']} evidence records, "
        f"{cost['loaded']['entities']} entities), {cost['disk_mib_per_1000_pages']:.0f} MiB on disk per 1,000 pages.",
        "",
    ]
    payload = {
        "benchmark": NAME, "command": command, "machine": machine, "uncommitted_changes": uncommitted_changes(),
        "settings": {"profile": settings.profile, "ingest": settings.ingest.model_dump(mode="json")},
        "origin": origin, "concurrency": concurrency, "rounds": rounds, "stats": stats,
    }
    return payload, "\n".join(lines)


def _first(records: dict[str, dict], key: str) -> str:
    return ", ".join(sorted({str(record[key]) for record in records.values()}))


def declare_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", type=Path, default=DEFAULT_DATASET, help="folder with documents/*.pdf")
    parser.add_argument("--documents", type=int, default=0, help="only the first N documents (by name)")
    parser.add_argument("--concurrency", type=int, default=2, help="documents in flight (as `thinkserve ingest`)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every pass, in ABBA order")
    parser.add_argument("--origin", action="store_true",
                        help="ship the original PDF in each zip (page count and page images from it, as --ray does)")
    parser.add_argument("--triton-url", help="a running Triton serving the repository (default: start one)")
    parser.add_argument("--config", type=Path, help="settings file (TOML); default: the built-in tiny profile")
    parser.add_argument("--cache", type=Path, help="content-list zips (default: .thinkserve/content_lists/<dataset>)")
    parser.add_argument("--output", type=Path, default=None,
                        help="results folder (default: benchmarks/results/<the dataset folder's name>)")
    parser.add_argument("--name", default=NAME, help="result file name")


def run_benchmark(args: argparse.Namespace, command: str) -> int:
    if args.rounds < 1 or args.concurrency < 1:
        raise UsageError("--rounds and --concurrency must be at least 1")
    machine = machine_facts()  # before the run: its load average is the other work on the machine
    settings = Settings.load(args.config)

    def progress(message: str) -> None:
        print(f"* {message}", file=sys.stderr, flush=True)

    pdfs = sorted((args.dataset / "documents").glob("*.pdf"))
    if args.documents:
        pdfs = pdfs[: args.documents]
    if not pdfs:
        raise UsageError(f"{args.dataset / 'documents'} holds no PDF")
    cache = args.cache or CACHE / args.dataset.resolve().name / settings.ingest.parser_tier
    parse = cached_content_lists(settings, pdfs, cache, progress)
    server = None
    url = args.triton_url
    with tempfile.TemporaryDirectory(prefix="thinkserve-cl-bench-") as scratch:
        work = Path(scratch)
        uploads = [upload_of(pdf, cache / f"{pdf.stem}.zip", args.origin, work) for pdf in pdfs]
        corpus = corpus_facts(uploads, work)
        try:
            if not url:
                progress("starting Triton ...")
                server = TritonServer(settings.triton, all_contracts())
                url = server.start().grpc
            stats = asyncio.run(measure(url, settings, uploads, args.concurrency, args.rounds, work, progress))
        finally:
            if server:
                server.stop()
        full_pages = next(r["pages"] for r in reversed(stats["passes"]) if r["pass"] == FULL)
        stats["collection"] = collection_cost(Path(stats.pop("last_full_data_dir")), full_pages)
    stats.update(corpus=corpus, parse=parse, summary=summarize_passes(stats["passes"]))
    payload, markdown = report(stats, settings, args.dataset, command, machine, args.concurrency, args.rounds,
                               args.origin)
    write_and_show(args.name, payload, markdown, args.output or RESULTS / args.dataset.resolve().name)
    return 0
