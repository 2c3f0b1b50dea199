"""Page-level retrieval quality of the query pipeline: hybrid retrieval against each single signal, in one run.

    thinkserve-bench retrieval_quality [--documents 6] [--pages 6] [--seed 7] [--ablations] [--config FILE]

The project's claim is that hybrid retrieval (dense + BM25 over passages and pages + graph, fused) beats the
best single signal. This measures it end to end: a full deployment (the real tritonserver with every model,
the orchestrator's gRPC server) on a throw-away data folder ingests the generated corpus of
benchmarks/thinkserve_bench/corpora/quality_corpus.py (generated PDFs, one subject per page; a regression check: the real-document
benchmark is benchmarks/thinkserve_bench/scripts/document_qa.py), then every question is asked over gRPC, like any client, once per
configuration:
  hybrid   the server's defaults: dense + BM25 over passages and pages + graph, fused
  dense    dense only (sparse=False, page_lexical=False, graph=False)
  bm25     BM25 only, over passages and pages (dense=False, graph=False)
and, with --ablations, the pairs that show which signal a hybrid loss comes from:
  dense+bm25   graph=False
  dense+graph  sparse=False, page_lexical=False
all with top_k=5, the reranker, page images and perception off (the tiny profile's cross-encoder and VLM have
random weights; the text embedder is the real all-MiniLM-L6-v2) and the extractive answerer, so the runs
differ only in the retrieval signals fused. The route is chosen by the question's features, the same for
every configuration.

A question is a hit at k when its gold (document, page) is among the pages of the first k evidence items (an
item's pages: the pages of its regions, else its page). Reports Recall@1 and Recall@5 per configuration,
overall and per question type, hybrid over the best single signal, and the questions a single signal finds
that hybrid misses; the JSON keeps every query's ranked pages with their signals (semantic, lexical,
structural, modality, fused).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from thinkserve_bench.corpora.quality_corpus import QUESTION_TYPES, Corpus, Question, write_quality_corpus
from thinkserve_bench.machine import machine_facts
from thinkserve_bench.result_files import uncommitted_changes, write_results
from orchestrator.client import AsyncThinkServeClient
from orchestrator.config import Settings
from orchestrator.server.deployment import running

NAME = "retrieval_quality"
COLLECTION = "quality"
CHUNK_TOKENS, CHUNK_OVERLAP_TOKENS = 200, 20
TOP_K = 5
KS = (1, 5)
# Options every configuration sends: only the retrieval signals differ between them.
COMMON_OPTIONS: dict[str, Any] = {"rerank": False, "page_images": False, "perception": "off", "answerer": "extractive"}
CONFIGURATIONS: dict[str, dict[str, bool]] = {
    "hybrid": {},
    "dense": {"sparse": False, "page_lexical": False, "graph": False},
    "bm25": {"dense": False, "graph": False},
}
SINGLE_SIGNALS = ("dense", "bm25")
ABLATIONS: dict[str, dict[str, bool]] = {"dense+bm25": {"graph": False}, "dense+graph": {"sparse": False, "page_lexical": False}}


def configurations(ablations: bool) -> dict[str, dict[str, bool]]:
    """Configuration name -> its retrieval switches: hybrid and the single signals, then the ablations if asked."""
    return {**CONFIGURATIONS, **(ABLATIONS if ablations else {})}


async def ask(client: AsyncThinkServeClient, collection: str, question: str, options: dict[str, Any]) -> dict:
    """The route and the ranked evidence (document, pages, kind, signals) of one query; the stream is read to its end."""
    route, ranked = "", []
    async for event in client.query(collection, question, **options):
        kind = event.WhichOneof("event")
        if kind == "route":
            route = event.route.label
        elif kind == "evidence":
            ranked = [
                {
                    "document": item.document_name,
                    "pages": sorted({region.page for region in item.regions} or {item.page}),
                    "kind": item.kind,
                    "found_by": list(item.signals.found_by),
                    "signals": {
                        name: round(getattr(item.signals, name), 4)
                        for name in ("semantic", "lexical", "page_lexical", "structural", "modality", "fused")
                    },
                }
                for item in sorted(event.evidence.items, key=lambda item: item.rank)
            ]
    return {"route": route, "ranked": ranked}


def is_hit(ranked: list[dict], question: Question, k: int) -> bool:
    return any(item["document"] == question.document and question.page in item["pages"] for item in ranked[:k])


async def evaluate(address: str, collection: str, corpus: Corpus, ablations: bool = False) -> dict:
    """Ingest the corpus into `collection`, ask every question under every configuration, and score the rankings."""
    options_of = {name: {**COMMON_OPTIONS, **switches, "top_k": TOP_K} for name, switches in configurations(ablations).items()}
    async with AsyncThinkServeClient(address, timeout_s=600) as client:
        started = time.monotonic()
        reports = [await client.ingest_file(collection, path) for path in corpus.files]
        ingest_seconds = time.monotonic() - started
        started = time.monotonic()
        results = []
        for question in corpus.questions:
            runs = {}
            for name, options in options_of.items():
                run = await ask(client, collection, question.text, options)
                runs[name] = {**run, **{f"hit@{k}": is_hit(run["ranked"], question, k) for k in KS}}
            results.append(
                {
                    "id": question.id, "type": question.type, "question": question.text,
                    "gold": {"document": question.document, "page": question.page, "subject": question.subject},
                    "configurations": runs,
                }
            )
        query_seconds = time.monotonic() - started
    documents = [
        {"name": r.document.name, "pages": r.document.pages, "chunks": r.document.chunks, "units": r.document.units,
         "entities": r.document.entities, "relations": r.document.relations, "seconds": r.seconds}
        for r in reports
    ]
    return {
        "configurations": options_of,  # name -> the query options it sent
        "documents": documents,
        "questions": results,
        "recall": recall_table(results, list(options_of)),
        "hybrid_versus_single": hybrid_versus_single(results),
        "ingest_seconds": ingest_seconds,
        "query_seconds": query_seconds,
        "queries": len(results) * len(options_of),
    }


def _groups(results: list[dict]) -> dict[str, list[dict]]:
    groups = {"all": results, **{kind: [r for r in results if r["type"] == kind] for kind in QUESTION_TYPES}}
    return {name: members for name, members in groups.items() if members}


def recall_table(results: list[dict], names: list[str]) -> dict[str, dict]:
    """Per question group: its size, Recall@k of every configuration, and hybrid over the best single signal."""
    table = {}
    for group, members in _groups(results).items():
        row: dict[str, Any] = {"questions": len(members)}
        for name in names:
            row[name] = {f"recall@{k}": sum(r["configurations"][name][f"hit@{k}"] for r in members) / len(members) for k in KS}
        ratios = {}
        for k in KS:
            best = max(row[name][f"recall@{k}"] for name in SINGLE_SIGNALS)
            ratios[f"recall@{k}"] = row["hybrid"][f"recall@{k}"] / best if best > 0 else None
        row["hybrid_over_best_single"] = ratios
        table[group] = row
    return table


def hybrid_versus_single(results: list[dict]) -> dict[str, dict]:
    """Per single signal and k: ids of the questions only hybrid hits and of those only the single signal hits."""
    comparison = {}
    for name in SINGLE_SIGNALS:
        for k in KS:
            runs = [(r["id"], r["configurations"]["hybrid"][f"hit@{k}"], r["configurations"][name][f"hit@{k}"]) for r in results]
            comparison[f"{name}@{k}"] = {
                "hybrid_only": [id_ for id_, hybrid, single in runs if hybrid and not single],
                "single_only": [id_ for id_, hybrid, single in runs if single and not hybrid],
            }
    return comparison


async def measure(settings: Settings, corpus: Corpus, ablations: bool, progress: Callable[[str], None]) -> dict:
    started = time.monotonic()
    async with running(settings, progress) as deployment:
        startup_seconds = time.monotonic() - started
        progress(
            f"ingesting {len(corpus.files)} documents, then {len(corpus.questions)} questions x "
            f"{len(configurations(ablations))} configurations"
        )
        stats = await evaluate(deployment.address, COLLECTION, corpus, ablations)
    return {**stats, "startup_seconds": startup_seconds}


def _progress(message: str) -> None:
    print(f"* {message}", file=sys.stderr, flush=True)


def _percent(value: float) -> str:
    return f"{value:.0%}"


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def report(stats: dict, corpus: Corpus, command: str, machine: dict, settings: Settings, wall_seconds: float) -> tuple[dict, str]:
    recall = stats["recall"]
    retrieval = settings.retrieval
    routes: dict[str, int] = {}
    for result in stats["questions"]:
        route = result["configurations"]["hybrid"]["route"]
        routes[route] = routes.get(route, 0) + 1
    lines = [
        "# Retrieval quality: hybrid against single signals",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine['cpu']}, {machine['logical_cores']} logical cores, {machine['memory_gib']} GiB, GPU: {machine['gpu']}, "
        f"Python {machine['python']}  ",
        f"Corpus (benchmarks/thinkserve_bench/corpora/quality_corpus.py, seed {corpus.seed}): {len(corpus.files)} generated PDFs, {corpus.pages} pages, "
        f"{sum(d['chunks'] for d in stats['documents'])} chunks, {sum(d['units'] for d in stats['documents'])} tables; "
        f"{recall['all']['questions']} questions ("
        + ", ".join(f"{recall[t]['questions']} {t}" for t in QUESTION_TYPES if t in recall)
        + ").  ",
        f"Settings: profile `{settings.profile}`, passages of {settings.ingest.passage_tokens} tokens, extractor chunks "
        f"{settings.ingest.chunk_tokens}/{settings.ingest.chunk_overlap_tokens} tokens, "
        f"extractor `{settings.ingest.extractor}`; every query top_k={TOP_K}, "
        + ", ".join(f"{key}={value}" for key, value in COMMON_OPTIONS.items())
        + f"; fusion `{retrieval.fusion}`, weights semantic {retrieval.semantic_weight}, lexical {retrieval.lexical_weight}, "
        f"page lexical {retrieval.page_lexical_weight}, structural {retrieval.structural_weight}, modality "
        f"{retrieval.modality_weight}; routes by question features: "
        + ", ".join(f"{count} {route}" for route, count in sorted(routes.items()))
        + ".  ",
        f"Wall time: {wall_seconds:.0f} s (deployment start {stats['startup_seconds']:.0f} s, ingest {stats['ingest_seconds']:.0f} s, "
        f"{stats['queries']} queries {stats['query_seconds']:.0f} s).",
        "",
        "Page-level Recall@1 / Recall@5 (gold page among the pages of the first 1 / 5 evidence items); hybrid / best "
        "single divides hybrid's recall by the better of dense only and BM25 only, per row and k:",
        "",
        f"| questions | n | {' | '.join(stats['configurations'])} | hybrid / best single |",
        "|---|---:|" + "---:|" * (len(stats["configurations"]) + 1),
    ]
    for group, row in recall.items():
        cells = [" / ".join(_percent(row[name][f"recall@{k}"]) for k in KS) for name in stats["configurations"]]
        ratio = " / ".join(_ratio(row["hybrid_over_best_single"][f"recall@{k}"]) for k in KS)
        lines.append(f"| {group} | {row['questions']} | {' | '.join(cells)} | {ratio} |")
    lines += ["", "Questions one side hits and the other misses:", ""]
    for key, sides in stats["hybrid_versus_single"].items():
        name, k = key.split("@")
        lines.append(
            f"- at {k}, hybrid but not {name}: {len(sides['hybrid_only'])}; {name} but not hybrid: {len(sides['single_only'])}"
            + (f" ({', '.join(sides['single_only'])})" if sides["single_only"] else "")
        )
    lines.append("")
    payload = {
        "benchmark": NAME,
        "command": command,
        "machine": machine,
        "uncommitted_changes": uncommitted_changes(),
        "wall_seconds": wall_seconds,
        "corpus": {"seed": corpus.seed, "documents": len(corpus.files), "pages": corpus.pages, "questions": len(corpus.questions)},
        "settings": {
            "profile": settings.profile,
            "collection": COLLECTION,
            "ingest": settings.ingest.model_dump(mode="json"),
            "retrieval": retrieval.model_dump(mode="json"),
            "routes": settings.routes.model_dump(mode="json"),
            "router": settings.router.model_dump(mode="json"),
        },
        "stats": stats,
    }
    return payload, "\n".join(lines)


def declare_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="settings file (TOML); default: the built-in tiny profile")
    parser.add_argument("--documents", type=int, default=6)
    parser.add_argument("--pages", type=int, default=6, help="pages per generated document (one subject each)")
    parser.add_argument("--seed", type=int, default=7, help="the corpus generator's seed")
    parser.add_argument("--ablations", action="store_true", help="also run dense+bm25 and dense+graph")
    parser.add_argument("--output", type=Path, default=None, help="results folder (default: benchmarks/results)")


def run_benchmark(args: argparse.Namespace, command: str) -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="thinkserve-quality-") as scratch:
        work = Path(scratch)
        settings = Settings.load(
            args.config,
            {
                "server.port": 0,
                "http.port": 0,
                "storage.data_dir": str(work / "data"),
                "ingest.chunk_tokens": CHUNK_TOKENS,
                "ingest.chunk_overlap_tokens": CHUNK_OVERLAP_TOKENS,
            },
        )
        corpus = write_quality_corpus(work / "corpus", args.documents, args.pages, args.seed)
        stats = asyncio.run(measure(settings, corpus, args.ablations, _progress))
    payload, markdown = report(stats, corpus, command, machine_facts(), settings, time.monotonic() - started)
    paths = write_results(NAME, payload, markdown, *([args.output] if args.output else []))
    print(markdown)
    print(f"written: {', '.join(map(str, paths))}", file=sys.stderr)
    return 0
