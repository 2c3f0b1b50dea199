"""Ingest throughput against MinerU's own parse-only throughput on the same files, in one run.

    thinkserve-bench ingest [--documents 8] [--pages 16] [--concurrency 2] [--triton-url HOST:PORT]

Passes, in this order on the same generated corpus (benchmarks/thinkserve_bench/corpora/report_corpus.py):
  parse only (1)   MinerU (the configured tier, subprocess mode) on each PDF, `concurrency` documents at a time
  full ingest      the real ingest pipeline (parse, page renders, chunking, extraction, descriptions, every
                   embedding through Triton, atomic commits), `concurrency` documents at a time
  parse only (2)   as (1) again, so a warming or throttling machine does not favour either side
Reports pages/s, chunks/s and entities/s, full/parse-only throughput as a ratio, the batch sizes Triton
executed per model (from its statistics), wall time per ingest stage, and the collection's memory (RSS
of a fresh process loading it and warming it as a server does: records, BM25 indexes and graph) and disk size
per 1,000 pages.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from thinkserve_bench.corpora.report_corpus import write_corpus
from thinkserve_bench.machine import machine_facts
from thinkserve_bench.result_files import write_results
from orchestrator.config import Settings
from orchestrator.knowledge.storage.indexes import index_spec
from orchestrator.knowledge.ingest import Ingestor, mineru_options
from orchestrator.knowledge.parsing.mineru import MineruParser
from orchestrator.knowledge.storage.registry import KnowledgeBase
from orchestrator.triton.client import TritonClient
from orchestrator.models.contracts import PAGE_ENCODER_FAMILIES, all_contracts
from orchestrator.triton.launcher import TritonServer
from orchestrator.triton.models import TritonModels

NAME = "ingest"
BATCHED_MODELS = ("text_embedder_encode", *(f"page_image_{family}_encode" for family in PAGE_ENCODER_FAMILIES))

# Run in a fresh interpreter: the RSS a collection costs once loaded as a serving process holds it, warmed (its
# records read, BM25 indexes, graph and page tables built, vectors faulted in).
_LOAD_PROBE = """
import json, resource, sys
from pathlib import Path
from orchestrator.knowledge.storage.registry import KnowledgeBase
def rss_kib():
    return int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmRSS")))
before = rss_kib()
snapshot = KnowledgeBase(Path(sys.argv[1]), read_only=True).collection(sys.argv[2]).snapshot
snapshot.warm()
print(json.dumps({"rss_delta_mib": (rss_kib() - before) / 1024, "evidence": len(snapshot.evidence),
                  "entities": len(snapshot.entity_keys), "pages": len(snapshot.pages)}))
"""


async def parse_only(parser: MineruParser, files: list[Path], work: Path, concurrency: int) -> float:
    limit = asyncio.Semaphore(concurrency)

    async def one(path: Path) -> None:
        async with limit:
            target = work / path.stem
            await asyncio.to_thread(parser.parse, path, target)
            shutil.rmtree(target, ignore_errors=True)

    started = time.monotonic()
    await asyncio.gather(*(one(path) for path in files))
    return time.monotonic() - started


def batch_histogram(before: dict, after: dict) -> dict[str, int]:
    """Executions per batch size between two statistics snapshots of one model."""
    def counts(stats: dict) -> dict[str, int]:
        model = stats["model_stats"][0] if stats.get("model_stats") else {}
        return {
            str(entry["batch_size"]): int(entry.get("compute_infer", {}).get("count", 0))
            for entry in model.get("batch_stats", [])
        }

    old, new = counts(before), counts(after)
    return {size: new[size] - old.get(size, 0) for size in sorted(new, key=int) if new[size] - old.get(size, 0) > 0}


def compute_seconds(before: dict, after: dict) -> float:
    """Seconds the model spent computing (Triton's compute_infer total) between two statistics snapshots."""
    def total(stats: dict) -> int:
        model = stats["model_stats"][0] if stats.get("model_stats") else {}
        return int(model.get("inference_stats", {}).get("compute_infer", {}).get("ns", 0))

    return (total(after) - total(before)) / 1e9


async def full_ingest(ingestor: Ingestor, files: list[Path], concurrency: int) -> tuple[float, list]:
    limit = asyncio.Semaphore(concurrency)

    async def one(path: Path):
        async with limit:
            return await ingestor.ingest("bench", path.name, path.read_bytes())

    started = time.monotonic()
    results = await asyncio.gather(*(one(path) for path in files))
    return time.monotonic() - started, results


async def measure(url: str, settings: Settings, files: list[Path], work: Path, concurrency: int) -> dict:
    ingest_settings = settings.ingest
    parser = MineruParser(mineru_options(ingest_settings))
    parse_first = await parse_only(parser, files, work / "parse1", concurrency)

    async with TritonClient(url, default_timeout_s=600) as client:
        models = TritonModels(client)
        data_dir = work / "data"
        knowledge = KnowledgeBase(data_dir, index_spec(settings.index))
        ingestor = Ingestor(knowledge, models, ingest_settings, settings.tokenizer_file)
        await ingestor.ingest("warmup", "warmup.md", b"# Warm-up\n\nOne sentence warms every model path.")
        before = {m: await client.model_statistics(m) for m in BATCHED_MODELS}
        full_seconds, results = await full_ingest(ingestor, files, concurrency)
        after = {m: await client.model_statistics(m) for m in BATCHED_MODELS}

    parse_second = await parse_only(parser, files, work / "parse2", concurrency)
    documents = [r.document for r in results]
    pages = sum(d.pages for d in documents)
    stages: dict[str, float] = {}
    for result in results:
        for stage, seconds in result.stage_seconds.items():
            stages[stage] = stages.get(stage, 0.0) + seconds
    probe = subprocess.run(
        [sys.executable, "-c", _LOAD_PROBE, str(data_dir), "bench"], capture_output=True, text=True, check=True
    )
    loaded = json.loads(probe.stdout)
    disk_bytes = sum(p.stat().st_size for p in (data_dir / "collections" / "bench").rglob("*") if p.is_file())
    parse_seconds = (parse_first + parse_second) / 2
    return {
        "documents": len(documents),
        "pages": pages,
        "chunks": sum(d.chunks for d in documents),
        "units": sum(d.units for d in documents),
        "entities": sum(d.entities for d in documents),
        "concurrency": concurrency,
        "parse_only_seconds": [parse_first, parse_second],
        "full_ingest_seconds": full_seconds,
        "parse_only_pages_per_s": pages / parse_seconds,
        "full_pages_per_s": pages / full_seconds,
        "full_chunks_per_s": sum(d.chunks for d in documents) / full_seconds,
        "full_entities_per_s": sum(d.entities for d in documents) / full_seconds,
        "full_vs_parse_only": parse_seconds / full_seconds,
        "stage_seconds_summed_over_documents": stages,
        "relations": sum(d.relations for d in documents),
        "triton_batch_sizes": {m: batch_histogram(before[m], after[m]) for m in BATCHED_MODELS},
        "triton_compute_seconds": {m: compute_seconds(before[m], after[m]) for m in BATCHED_MODELS},
        "collection_memory_mib_per_1000_pages": loaded["rss_delta_mib"] * 1000 / pages,
        "collection_disk_mib_per_1000_pages": disk_bytes / 2**20 * 1000 / pages,
        "loaded_collection": loaded,
    }


def report(stats: dict, command: str, machine: dict, settings: Settings) -> tuple[dict, str]:
    s = stats
    ratio = s["full_vs_parse_only"]
    lines = [
        "# Ingest throughput",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine['cpu']}, {machine['logical_cores']} logical cores, {machine['memory_gib']} GiB, GPU: {machine['gpu']}  ",
        f"Corpus: {s['documents']} generated PDFs, {s['pages']} pages ({s['units']} tables/figures); "
        f"{s['concurrency']} documents in flight; MinerU tier `{settings.ingest.parser_tier}` ({settings.ingest.parser_mode}); "
        f"extractor `{settings.ingest.extractor}`, describer `{settings.ingest.describer}`, chunks {settings.ingest.chunk_tokens}/"
        f"{settings.ingest.chunk_overlap_tokens} tokens, page renders at {settings.ingest.page_render_dpi:g} dpi for "
        "both page-image encoders.",
        "",
        "| pass | seconds | pages/s | chunks/s | entities/s |",
        "|---|---:|---:|---:|---:|",
        f"| MinerU parse only (mean of the runs before and after) | {sum(s['parse_only_seconds']) / 2:.1f} | "
        f"{s['parse_only_pages_per_s']:.2f} | | |",
        f"| full ingest | {s['full_ingest_seconds']:.1f} | {s['full_pages_per_s']:.2f} | {s['full_chunks_per_s']:.2f} | "
        f"{s['full_entities_per_s']:.1f} |",
        "",
        f"Full ingest runs at **{ratio:.0%}** of parse-only throughput (goal: >= 80%).",
        "",
        "Wall time per stage, summed over documents (stages of concurrent documents overlap):",
        "",
        "| stage | seconds |",
        "|---|---:|",
        *[f"| {stage} | {seconds:.2f} |" for stage, seconds in sorted(s["stage_seconds_summed_over_documents"].items(), key=lambda kv: -kv[1])],
        "",
        "Batch sizes Triton executed during the full ingest (batch size: executions):",
        "",
        *[f"- `{model}`: {histogram or 'none'}" for model, histogram in s["triton_batch_sizes"].items()],
        "",
        "Model compute time inside Triton during the full ingest: "
        + ", ".join(f"`{m}` {seconds:.1f} s" for m, seconds in s["triton_compute_seconds"].items())
        + f" ({s['chunks']} chunks embedded in pieces of at most {settings.ingest.embed_window_tokens} tokens, "
        f"{s['entities']} entities, {s['relations']} relations, {s['pages']} pages x 2 encoders).",
        "",
        f"Collection cost: {s['collection_memory_mib_per_1000_pages']:.0f} MiB of RSS per 1,000 pages once loaded "
        f"(warmed as a server warms it: records read, graph and BM25 built; {s['loaded_collection']['evidence']} evidence records, {s['loaded_collection']['entities']} "
        f"entities), {s['collection_disk_mib_per_1000_pages']:.0f} MiB on disk per 1,000 pages.",
        "",
    ]
    payload = {"benchmark": NAME, "command": command, "machine": machine, "stats": stats}
    return payload, "\n".join(lines)


def declare_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--triton-url", help="a running Triton serving the repository (default: start one)")
    parser.add_argument("--config", type=Path, help="settings file (TOML); default: the built-in tiny profile")
    parser.add_argument("--documents", type=int, default=8)
    parser.add_argument("--pages", type=int, default=16, help="pages per generated document")
    parser.add_argument("--concurrency", type=int, default=2, help="documents in flight (as `thinkserve ingest`)")
    parser.add_argument("--output", type=Path, default=None, help="results folder (default: benchmarks/results)")


def run_benchmark(args: argparse.Namespace, command: str) -> int:
    settings = Settings.load(args.config)
    server = None
    url = args.triton_url
    with tempfile.TemporaryDirectory(prefix="thinkserve-bench-") as scratch:
        work = Path(scratch)
        files = write_corpus(work / "corpus", args.documents, args.pages)
        if not url:
            server = TritonServer(settings.triton, all_contracts())
            url = server.start().grpc
        try:
            stats = asyncio.run(measure(url, settings, files, work, args.concurrency))
        finally:
            if server:
                server.stop()
    payload, markdown = report(stats, command.strip(), machine_facts(), settings)
    paths = write_results(NAME, payload, markdown, *([args.output] if args.output else []))
    print(markdown)
    print(f"written: {', '.join(map(str, paths))}", file=sys.stderr)
    return 0
