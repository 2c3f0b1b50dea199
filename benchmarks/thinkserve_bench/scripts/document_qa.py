"""Retrieval, citations, answers and refusals on real PDFs, through the real service, against plain baselines.

    thinkserve-bench document_qa [--dataset ../shared/benchmarks/mmlongbench-dev] [--documents N]
                                     [--top-k 20] [--ablations] [--config FILE] [--data-dir DIR]
                                     [--set KEY=VALUE ...] [--output DIR] [--name NAME]
    thinkserve-bench document_qa --rescore benchmarks/results/mmlongbench-dev/document_qa.json   # score a run again

The dataset is a folder in MMLongBench-Doc's layout (benchmarks/thinkserve_bench/scripts/qa_dataset.py): real PDFs and questions with
1-based evidence pages. In one run, on this machine:
1. MinerU alone parses every PDF (the settings' tier, in a subprocess per document, as the service runs it):
   the parse-only pages/s, and the page text both baselines read.
2. A full deployment (the real tritonserver with every model, the orchestrator's gRPC server, default
   settings of the profile) ingests every PDF over gRPC into a collection of its own (the questions are about
   one document each, as in MMLongBench-Doc).
3. Every question is asked in its document's collection with `Retrieve` (top_k as given, everything else
   default) and with `Query` (all defaults), one at a time.
4. The baselines rank the same document's pages: BM25 over whole pages (`bm25s`) and dense all-MiniLM-L6-v2
   over 254-token passages with page = best passage, embedded by the deployment's own text embedder; each over
   MinerU's text, and again over the text the product stored (the text layer, and what OCR read where a page has
   none: the fair baseline of OCR'd documents, read from the collections' segments after ingest).

With --ablations, every question is also retrieved with one signal switched off per request (the graph, BM25
over pages, BM25 over passages, dense search) and in lexical mode (no model call: what answers while the
embedder is away), in the same deployment. With --data-dir the collections are
kept there, and a later run with the same folder finds its documents already ingested (its ingest figures then
say so; everything else is measured again).

Reported: page Recall@1/5/10 and MRR@10 (the distinct pages of the evidence items in rank order, the page each
item names; any evidence page counts) overall, by evidence source, and on the questions whose evidence pages all
lack a text layer (only OCR or the page images can find them); the share of pages without a text layer that got
OCR text, and OCR's pages, lines and seconds; the first citation of the answer on an
evidence page; extractive answer accuracy on short answers (normalised containment, see
qa_dataset.normalize_answer); refusal precision and recall on the unanswerable questions; the routes taken;
Retrieve and Query latency; ingest pages/s against MinerU's parse-only pages/s.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from thinkserve_bench.machine import machine_facts
from thinkserve_bench.catalogue import UsageError
from thinkserve_bench.result_files import RESULTS, read_json, uncommitted_changes, write_and_show
from thinkserve_bench.stats import percentile
from orchestrator.client import AsyncThinkServeClient
from orchestrator.config import Settings
from orchestrator.server.deployment import running
from orchestrator.knowledge.parsing.documents import ParsedDocument
from orchestrator.knowledge.ingest import mineru_options
from orchestrator.knowledge.parsing.mineru import MineruParser
from orchestrator.knowledge.storage.registry import KnowledgeBase
from orchestrator.pipeline.answer_types import expected_type
from orchestrator.models.tokens import PlainTokenizer
from orchestrator.triton.client import TritonClient
from orchestrator.triton.models import TritonModels

from . import answer_comparison
from .page_baselines import Bm25Pages, DensePassages, page_texts, pages_without_text_layer
from .qa_dataset import Question, contains_answer, load_questions, page_hits, refusal_scores, separation_auc

NAME = "document_qa"
# best-cosine thresholds the refusal figures are swept over (retrieval.min_similarity is the product's)
REFUSAL_THRESHOLDS = (0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5)
DEFAULT_DATASET = Path("../shared/benchmarks/mmlongbench-dev")
SYSTEMS = ("thinkserve", "bm25_pages", "dense_passages")
OCR_BASELINES = ("bm25_pages_ocr", "dense_passages_ocr")  # the same baselines over the stored text (text layer + OCR)
# Retrieve with one signal off per request (QueryOptions), against the same collections
ABLATIONS = {
    "graph off": {"graph": False},
    "BM25 over pages off": {"page_lexical": False},
    "BM25 over passages off": {"sparse": False},
    "dense off": {"dense": False},
    "lexical mode (no model call)": {"lexical": True},
}
SYSTEM_LABELS = {
    "thinkserve": "ThinkServe `Retrieve`",
    "thinkserve_spanned": "ThinkServe, every page an item spans",
    "bm25_pages": "BM25 over whole pages (bm25s)",
    "dense_passages": "dense MiniLM, 254-token passages, page = max",
    "bm25_pages_ocr": "BM25 over whole pages, text layer + OCR text",
    "dense_passages_ocr": "dense MiniLM, 254-token passages, text layer + OCR text",
}
_CITATION_MARK = re.compile(r"\[\d{1,3}\]")
Progress = Callable[[str], None]


def collection_name(number: int, document: str) -> str:
    """A valid collection name per document: its number and a slug of its file name."""
    slug = re.sub(r"[^a-z0-9]+", "-", Path(document).stem.casefold()).strip("-")
    return f"d{number:02d}-{slug}"[:64].rstrip("-_")


def parse_only(settings: Settings, paths: list[Path], work: Path, progress: Progress) -> dict[str, dict]:
    """MinerU alone on every PDF, one at a time, as the service runs it: page texts and seconds per document."""
    parser = MineruParser(mineru_options(settings.ingest))
    parsed = {}
    for path in paths:
        started = time.monotonic()
        document = parser.parse(path, work / path.stem)
        parsed[path.name] = {"texts": page_texts(document), "pages": document.page_count, "seconds": time.monotonic() - started}
        progress(f"parsed {path.name}: {document.page_count} pages in {parsed[path.name]['seconds']:.1f} s")
    return parsed


class LoadSampler:
    """The machine's 1-minute load average every `every_s` seconds while a phase runs: other work on a shared
    machine slows every figure of a run, so a run says how loaded its machine was."""

    def __init__(self, every_s: float = 15.0):
        import threading

        self.every_s = every_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import os

        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> "LoadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float]:
        return {"mean": float(np.mean(self.samples)), "max": float(np.max(self.samples)), "samples": len(self.samples)}


async def ingest_all(client: AsyncThinkServeClient, paths: list[Path], collections: dict[str, str], concurrency: int,
                     progress: Progress) -> tuple[dict[str, dict], float]:
    limit = asyncio.Semaphore(concurrency)
    reports: dict[str, dict] = {}

    async def one(path: Path) -> None:
        async with limit:
            report = await client.ingest_file(collections[path.name], path)
        document = report.document
        reports[path.name] = {
            "collection": collections[path.name], "pages": document.pages, "passages": report.passages,
            "chunks": document.chunks, "units": document.units, "entities": document.entities,
            "relations": document.relations, "seconds": report.seconds, "warnings": list(document.warnings),
            "stages": {stage.stage: stage.milliseconds / 1000 for stage in report.stages},
            "already_present": report.already_present,
            "ocr": {"pages": document.ocr_pages, "figures": document.ocr_figures, "lines": document.ocr_lines,
                    "low_confidence_lines": document.ocr_low_confidence_lines},
            "pages_per_s": report.pages_per_s,
        }
        progress(f"ingested {path.name}: {document.pages} pages, {report.passages} passages in {report.seconds:.1f} s")

    started = time.monotonic()
    await asyncio.gather(*(one(path) for path in paths))
    return reports, time.monotonic() - started


def _pages_of(items, spanned: bool) -> list[int]:
    pages: list[int] = []
    for item in sorted(items, key=lambda item: item.rank):
        if spanned and item.regions:
            pages.extend(region.page for region in item.regions)
        else:
            pages.append(item.page)
    return [page for page in dict.fromkeys(pages) if page >= 0]


async def ask(client: AsyncThinkServeClient, question: Question, collection: str, top_k: int,
              ablations: dict[str, dict[str, bool]]) -> dict[str, Any]:
    """Retrieve, then Query; the evidence, the answer and their wall times; then Retrieve once per ablation."""
    started = time.monotonic()
    retrieved = await client.retrieve(collection, question.text, top_k=top_k)
    retrieve_ms = (time.monotonic() - started) * 1000
    items = list(retrieved.evidence.items)
    started = time.monotonic()
    final = None
    async for event in client.query(collection, question.text):
        if event.WhichOneof("event") == "final":
            final = event.final
    query_ms = (time.monotonic() - started) * 1000
    citations = list(final.citations) if final is not None else []
    ablated = {}
    for name, switches in ablations.items():
        response = await client.retrieve(collection, question.text, top_k=top_k, **switches)
        ablated[name] = _pages_of(response.evidence.items, spanned=False)
    return {
        "ablations": ablated,
        "route": retrieved.route.label,
        "retrieve_ms": retrieve_ms,
        "ranked_pages": _pages_of(items, spanned=False),
        "best_semantic": max((item.signals.semantic for item in items), default=0.0),  # what refusal thresholds
        "spanned_pages": _pages_of(items, spanned=True),
        "top_evidence": [
            {"kind": item.kind, "page": item.page, "block_type": item.block_type, "found_by": list(item.signals.found_by),
             "signals": {name: round(float(getattr(item.signals, name, 0.0)), 4)
                         for name in ("semantic", "lexical", "page_lexical", "structural", "modality", "fused", "final")}}
            for item in sorted(items, key=lambda item: item.rank)[:5]
        ],
        "query_ms": query_ms,
        # the orchestrator's own time (everything but waiting on models), as the final event reports it
        "own_ms": final.cost.orchestrator_ms if final is not None else None,
        "own_ms_by_stage": dict(final.cost.orchestrator_ms_by_stage) if final is not None else {},
        "answer": final.text if final is not None else "",
        "answer_source": final.answer_source if final is not None else "",
        "short_answer": final.short_answer.text if final is not None and final.HasField("short_answer") else "",
        "degraded": bool(final.degraded) if final is not None else False,
        # the answerability model's P(answerable) (-1 under the similarity rule; absent in runs before it existed)
        "answerability": final.answerability.probability if final is not None and final.HasField("answerability") else None,
        "citations": [
            {"page": citation.page, "passage": citation.passage_id,
             "regions": [list(region.bbox) for region in getattr(citation, "regions", ())]}
            for citation in citations
        ],
    }


async def baselines(models: TritonModels, texts: dict[str, list[str]], questions: list[Question], tokenizer: PlainTokenizer,
                    timeout_s: float, suffix: str = "") -> dict[int, dict[str, list[int]]]:
    """Each question's page ranking by each baseline over its document's page `texts` (MinerU's, or the stored
    text with OCR: `suffix` "_ocr" names those systems)."""
    rankings: dict[int, dict[str, list[int]]] = {}
    by_document = collections.defaultdict(list)
    for question in questions:
        by_document[question.document].append(question)
    for document, asked in by_document.items():
        bm25 = Bm25Pages(texts[document])
        dense = DensePassages(texts[document], tokenizer)
        await dense.embed(lambda batch: models.embed(batch, timeout_s))
        vectors = await models.embed([q.text for q in asked], timeout_s)
        for question, vector in zip(asked, vectors):
            rankings[question.id] = {f"bm25_pages{suffix}": bm25.rank(question.text), f"dense_passages{suffix}": dense.rank(vector)}
    return rankings


def stored_pages(data_dir: Path, reports: dict[str, dict]) -> dict[str, dict[str, list]]:
    """Per document, what the product stored of each page (its blocks' text, OCR's included: page_texts) and the
    pages holding text OCR read, from the collections' segments on disk."""
    knowledge = KnowledgeBase(data_dir, read_only=True)
    stored = {}
    for name, report in reports.items():
        segment = next(s for s in knowledge.collection(report["collection"]).snapshot.segments if s.document.name == name)
        blocks = list(segment.blocks)
        stored[name] = {
            "texts": page_texts(ParsedDocument(blocks, segment.document.pages, segment.document.parser)),
            "ocr_text_pages": sorted({b.page for b in blocks if b.ocr_confidence is not None and b.content.strip()}),
        }
    return stored


def score(questions: list[Question], runs: dict[int, dict], rankings: dict[int, dict[str, list[int]]],
          textless: Optional[dict[str, list[int]]] = None) -> dict[str, Any]:
    """`textless`: each document's pages without a text layer (the questions on those pages only are scored apart)."""
    answerable = [q for q in questions if q.answerable and q.evidence_pages]
    present = [s for s in OCR_BASELINES if questions and s in rankings[questions[0].id]]  # older runs have none
    systems = {
        "thinkserve": lambda q: runs[q.id]["ranked_pages"],
        "thinkserve_spanned": lambda q: runs[q.id]["spanned_pages"],
        "bm25_pages": lambda q: rankings[q.id]["bm25_pages"],
        "dense_passages": lambda q: rankings[q.id]["dense_passages"],
        **{s: (lambda q, s=s: rankings[q.id][s]) for s in present},
        **{f"ablation: {name}": (lambda q, name=name: runs[q.id]["ablations"][name])
           for name in (runs[questions[0].id]["ablations"] if questions else {})},
    }

    def table(members: list[Question]) -> dict[str, dict[str, float]]:
        out = {}
        for system, ranked in systems.items():
            hits = [page_hits(ranked(q), q.evidence_pages) for q in members]
            out[system] = {key: float(np.mean([h[key] for h in hits])) if hits else 0.0 for key in hits[0]} if hits else {}
        return out

    sources = sorted({s for q in answerable for s in q.evidence_sources})
    cited = [q for q in answerable if runs[q.id]["citations"]]
    first_on_evidence = [runs[q.id]["citations"][0]["page"] in q.evidence_pages for q in cited]
    short = [q for q in questions if q.short_answer]
    correct = [contains_answer(_CITATION_MARK.sub(" ", runs[q.id]["answer"]), q.answer) for q in short]
    # the short answer field (runs before it existed have none): given, and holding the gold answer
    given = [bool(runs[q.id].get("short_answer")) for q in short]
    short_correct = [contains_answer(runs[q.id].get("short_answer", ""), q.answer) for q in short]
    types = [expected_type(q.text) for q in short]
    contained_all = [contains_answer(_CITATION_MARK.sub(" ", runs[q.id]["answer"]), q.answer) for q in answerable]
    declined = [runs[q.id]["answer_source"] == "refusal" or not runs[q.id]["citations"] for q in questions]
    refused = [runs[q.id]["answer_source"] == "refusal" for q in questions]
    unanswerable = [not q.answerable for q in questions]
    best = [runs[q.id]["best_semantic"] or 0.0 for q in questions]
    routes = collections.Counter(runs[q.id]["route"] for q in questions)
    without_text = [q for q in answerable if textless and set(q.evidence_pages) <= set(textless.get(q.document, ()))]
    return {
        "questions": len(questions),
        "answerable_with_pages": len(answerable),
        "retrieval": {"all": {"questions": len(answerable), **table(answerable)},
                      **{source: {"questions": len(m), **table(m)}
                         for source in sources if (m := [q for q in answerable if source in q.evidence_sources])}},
        # questions whose every evidence page has no text layer: found by OCR's text or the page images alone
        "retrieval_without_text_layer": {"questions": len(without_text), **table(without_text)} if without_text else {},
        "first_citation": {
            "answerable": len(answerable),
            "cited": len(cited),
            "on_evidence_page_of_cited": float(np.mean(first_on_evidence)) if cited else None,
            "on_evidence_page_of_answerable": sum(first_on_evidence) / len(answerable) if answerable else None,
        },
        "answer_accuracy": {
            "short_answers": len(short),
            "contains_answer": float(np.mean(correct)) if short else None,
            "by_format": {fmt: float(np.mean([c for q, c in zip(short, correct) if q.answer_format == fmt]))
                          for fmt in sorted({q.answer_format for q in short})},
            "answerable": len(answerable),
            "contains_answer_all_answerable": float(np.mean(contained_all)) if answerable else None,
            "short_answer_given": float(np.mean(given)) if short else None,
            "short_answer_contains": float(np.mean(short_correct)) if short else None,
            # by the type the question's wording asks for (answer_types.expected_type): questions, answer contains,
            # short answer given, short answer contains
            "by_expected_type": {
                kind: {"questions": sum(t == kind for t in types),
                       "contains_answer": float(np.mean([c for t, c in zip(types, correct) if t == kind])),
                       "short_answer_given": float(np.mean([g for t, g in zip(types, given) if t == kind])),
                       "short_answer_contains": float(np.mean([c for t, c in zip(types, short_correct) if t == kind]))}
                for kind in sorted(set(types))
            },
        },
        "refusal": {"declined (refusal or nothing cited)": refusal_scores(declined, unanswerable),
                    "refusal answer only": refusal_scores(refused, unanswerable)},
        "refusal_by_answerability": _answerability_auc(questions, runs, unanswerable),
        "refusal_by_best_cosine": {
            "auc": separation_auc(best, unanswerable),
            "thresholds": {str(t): refusal_scores([b < t for b in best], unanswerable) for t in REFUSAL_THRESHOLDS},
        },
        "routes": dict(routes),
        "routes_answerable_short": dict(collections.Counter(runs[q.id]["route"] for q in short)),
        "latency_ms": {
            name: {"p50": percentile(values, 50), "p95": percentile(values, 95)}
            for name, values in (("retrieve", [runs[q.id]["retrieve_ms"] for q in questions]),
                                 ("query", [runs[q.id]["query_ms"] for q in questions]))
        },
        "own_time_ms": own_time(questions, runs),
    }


def own_time(questions: list[Question], runs: dict[int, dict]) -> dict[str, Any]:
    """Query's own time (p50, p95) per route and in all, with the stages' p50, and the first question asked of
    each collection apart (its first query after ingest); empty for runs recorded before it was."""
    measured = [q for q in questions if runs[q.id].get("own_ms") is not None]
    if not measured:
        return {}
    first_of: dict[str, int] = {}
    for q in measured:
        first_of.setdefault(q.document, q.id)

    def summary(members: list[Question]) -> dict[str, Any]:
        values = [runs[q.id]["own_ms"] for q in members]
        stages = sorted({stage for q in members for stage in runs[q.id]["own_ms_by_stage"]})
        return {"questions": len(members), "p50": percentile(values, 50), "p95": percentile(values, 95),
                "stages_p50": {s: float(np.median([runs[q.id]["own_ms_by_stage"].get(s, 0.0) for q in members])) for s in stages}}

    later = [q for q in measured if first_of[q.document] != q.id]
    routes = sorted({runs[q.id]["route"] for q in later})
    return {"all": summary(later), "first_per_collection": summary([q for q in measured if first_of[q.document] == q.id]),
            **{route: summary([q for q in later if runs[q.id]["route"] == route]) for route in routes}}


async def evaluate(address: str, triton_url: str, settings: Settings, paths: list[Path], questions: list[Question],
                   parsed: dict[str, dict], top_k: int, concurrency: int, ablations: bool, progress: Progress,
                   answerers: tuple[str, ...] = (), routers: tuple[str, ...] = ()) -> dict[str, Any]:
    """Against a running deployment: ingest every PDF into a collection of its own, rank with the baselines,
    ask every question; the scores and every run."""
    collections_of = {path.name: collection_name(number, path.name) for number, path in enumerate(paths)}
    async with AsyncThinkServeClient(address, timeout_s=settings.server.default_deadline_s * 10) as client, \
            TritonClient(triton_url, settings.triton.call_timeout_s) as triton:
        progress(f"ingesting {len(paths)} PDFs, {concurrency} at a time")
        with LoadSampler() as ingest_load:
            reports, ingest_seconds = await ingest_all(client, paths, collections_of, concurrency, progress)
        progress("baselines")
        tokenizer = PlainTokenizer(settings.tokenizer_file, "ingest.tokenizer")
        stored = stored_pages(settings.storage.data_dir, reports)
        # the baselines embed every passage of a document at once: their batches queue in Triton beyond one call's
        # limit on a busy machine (a run beside a test suite timed out), and their time is not a measurement
        models, timeout = TritonModels(triton), max(settings.triton.call_timeout_s, BASELINE_TIMEOUT_S)
        rankings = await baselines(models, {d: p["texts"] for d, p in parsed.items()}, questions, tokenizer, timeout)
        with_ocr = await baselines(models, {d: p["texts"] for d, p in stored.items()}, questions, tokenizer, timeout, "_ocr")
        rankings = {q: {**ranked, **with_ocr[q]} for q, ranked in rankings.items()}
        progress(f"{len(questions)} questions, Retrieve then Query each")
        runs = {}
        started = time.monotonic()
        with LoadSampler() as query_load:
            for number, question in enumerate(questions, 1):
                runs[question.id] = await ask(client, question, collections_of[question.document], top_k,
                                              ABLATIONS if ablations else {})
                collection = collections_of[question.document]
                if answerers:  # the same question once per answerer (answer_comparison): same-run baselines
                    runs[question.id]["answerers"] = await answer_comparison.ask_answerers(
                        client, collection, question.text, answerers, time.monotonic)
                if routers:
                    runs[question.id]["routers"] = await answer_comparison.ask_routers(
                        client, collection, question.text, routers, time.monotonic)
                if number % 25 == 0:
                    progress(f"{number}/{len(questions)} questions")
            query_seconds = time.monotonic() - started
    pages = sum(report["pages"] for report in reports.values())
    ingested = [report for report in reports.values() if not report["already_present"]]
    textless = {path.name: pages_without_text_layer(path) for path in paths}
    return {
        "ingested_documents": len(ingested),
        "documents": {path.name: {**reports[path.name], "parse_only_seconds": parsed[path.name]["seconds"],
                                  "pages_without_text_layer": textless[path.name],
                                  "ocr_text_pages": stored[path.name]["ocr_text_pages"]} for path in paths},
        "pages": pages,
        "ingest_seconds": ingest_seconds,
        "ingest_concurrency": concurrency,
        "ingest_pages_per_s": pages / ingest_seconds if len(ingested) == len(reports) else None,
        "query_seconds": query_seconds,
        "load_average": {"ingest": ingest_load.summary(), "questions": query_load.summary()},
        "runs": {str(k): v for k, v in runs.items()},
        "baselines": {str(k): v for k, v in rankings.items()},
        "scores": score(questions, runs, rankings, textless),
        "answerer_scores": answer_comparison.score_answerers(
            questions, {q.id: runs[q.id]["answerers"] for q in questions},
            {q.id: runs[q.id].get("answerability") for q in questions}) if answerers else {},
        "router_scores": answer_comparison.score_routers(
            questions, {q.id: runs[q.id]["routers"] for q in questions}) if routers else {},
    }


async def measure(settings: Settings, dataset: Path, names: list[str], questions: list[Question], top_k: int,
                  concurrency: int, ablations: bool, work: Path, progress: Progress,
                  answerers: tuple[str, ...] = (), routers: tuple[str, ...] = ()) -> dict[str, Any]:
    """MinerU alone first (nothing else running), then a deployment of our own for the rest."""
    paths = [dataset / "documents" / name for name in names]
    progress(f"MinerU alone on {len(paths)} PDFs")
    started = time.monotonic()
    parsed = await asyncio.to_thread(parse_only, settings, paths, work / "parse-only", progress)
    parse_seconds = time.monotonic() - started
    async with running(settings, progress) as deployment:
        stats = await evaluate(deployment.address, deployment.triton_url, settings, paths, questions, parsed, top_k,
                               concurrency, ablations, progress, answerers, routers)
    return {**stats, "parse_only_seconds": parse_seconds, "parse_only_pages_per_s": stats["pages"] / parse_seconds}


def _f(value: Optional[float], digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _short_answer_lines(accuracy: dict) -> list[str]:
    """The short answer field: how often it is given and holds the gold answer, by the type the question asks for."""
    if accuracy.get("short_answer_given") is None:
        return []
    lines = [f"- Short answer (the value the question asks for, alone): given for {_f(accuracy['short_answer_given'])} "
             f"of the short-answer questions, holding the expected answer for {_f(accuracy['short_answer_contains'])}.",
             "", "| expected type (from the question) | questions | answer contains | short answer given | short answer contains |",
             "|---|---:|---:|---:|---:|"]
    for kind, row in accuracy["by_expected_type"].items():
        lines.append(f"| {kind} | {row['questions']} | {_f(row['contains_answer'])} | {_f(row['short_answer_given'])} | "
                     f"{_f(row['short_answer_contains'])} |")
    return lines + [""]


def _answerability_auc(questions: list[Question], runs: dict[int, dict], unanswerable: list[bool]) -> Optional[dict]:
    """How well the answerability model's probability picks out the unanswerable questions (None for runs without it)."""
    probabilities = [runs[q.id].get("answerability") for q in questions]
    if any(p is None or p < 0 for p in probabilities):
        return None
    return {"auc": separation_auc(probabilities, unanswerable)}


def _answerability_line(entry: Optional[dict]) -> list[str]:
    if not entry:
        return []
    return [f"- The answerability model's probability separates the unanswerable questions with AUC {_f(entry['auc'])} "
            "here. In sample: the shipped model was fitted on these questions; its figures cross-validated by document "
            "are in `answerability.md`."]


def _threshold_line(sweep: Optional[dict]) -> list[str]:
    if not sweep:
        return []
    cells = "; ".join(f"{t}: P {_f(v['precision'], 2)} R {_f(v['recall'], 2)}" for t, v in sweep["thresholds"].items())
    return [f"- Refusing when Retrieve's best cosine is below t (what `retrieval.min_similarity` sets): {cells}. A low best cosine "
            f"separates unanswerable questions from the others with AUC {_f(sweep['auc'])} (0.5: no better than chance)."]


def _own_time_lines(own: dict[str, Any]) -> list[str]:
    """The report's line on the own time; none for runs recorded before it was."""
    if not own:
        return []

    def stages(summary: dict[str, Any]) -> str:
        ranked = sorted(summary["stages_p50"].items(), key=lambda item: -item[1])
        return ", ".join(f"{stage} {ms:.2f}" for stage, ms in ranked if ms >= 0.05)
    routes = [route for route in ("simple", "moderate", "complex") if route in own]
    return [
        f"- The orchestrator's own time per Query (everything but waiting on models, `cost.orchestrator_ms`): p50 "
        f"{own['all']['p50']:.1f} ms, p95 {own['all']['p95']:.1f} over {own['all']['questions']} questions ("
        + "; ".join(f"{route} p50 {own[route]['p50']:.1f} ms" for route in routes)
        + f"); stages, p50 ms: {stages(own['all'])}. The first question of each collection (its first query after "
        f"ingest): p50 {own['first_per_collection']['p50']:.1f} ms, p95 {own['first_per_collection']['p95']:.1f}."
    ]

def _ocr_lines(stats: dict, without_text: dict, shown: tuple[str, ...]) -> list[str]:
    """The report's section on pages without a text layer: how many got OCR text, what OCR cost, and retrieval on
    the questions only those pages answer."""
    documents = stats["documents"].values()
    textless = sum(len(d.get("pages_without_text_layer", [])) for d in documents)
    lines = ["", "## Pages without a text layer (OCR)", ""]
    if "ocr_text_pages" in next(iter(documents), {}):
        covered = sum(len(set(d["pages_without_text_layer"]) & set(d["ocr_text_pages"])) for d in documents)
        ocr = [d.get("ocr", {}) for d in documents]
        seconds = sum(d["stages"].get("ocr", 0.0) for d in documents)
        span = sum(d["stages"].get("ocr_reading", 0.0) for d in documents)
        spans = (f"; OCR's span from its first image to its last, overlapping the parse, {span:.0f} s in all" if span else "")
        lines.append(
            f"- {textless} of {stats['pages']} pages have no text layer; {covered} of them ({covered / textless:.1%}) got "
            f"OCR text. OCR read {sum(o.get('pages', 0) for o in ocr)} pages and {sum(o.get('figures', 0) for o in ocr)} "
            f"figure crops: {sum(o.get('lines', 0) for o in ocr)} lines, {sum(o.get('low_confidence_lines', 0) for o in ocr)} "
            f"below the confidence threshold (kept, marked); its ingest stage (the wait for OCR after the parse) took "
            f"{seconds:.0f} s in all{spans}."
            if textless else f"- No page of the {stats['pages']} lacks a text layer.")
        decks = [(name, d) for name, d in stats["documents"].items()
                 if d["pages"] and len(d["pages_without_text_layer"]) == d["pages"] and not d["already_present"]]
        for name, d in sorted(decks, key=lambda item: -item[1]["pages"])[:1]:
            lines.append(f"- The largest image-only document, {name} ({d['pages']} pages), ingested end to end in "
                         f"{d['seconds']:.0f} s ({d['pages'] / d['seconds']:.2f} pages/s), OCR {d['stages'].get('ocr', 0.0):.0f} s of it.")
    else:
        lines.append(f"- {textless} of {stats['pages']} pages have no text layer (this run recorded no OCR).")
    if without_text:
        lines += ["", f"Page retrieval on the {without_text['questions']} answerable questions whose evidence pages all lack "
                  "a text layer:", "", "| system | R@1 | R@5 | R@10 |", "|---|---:|---:|---:|"]
        for system in shown:
            row = without_text[system]
            lines.append(f"| {SYSTEM_LABELS[system]} | {row['recall@1']:.3f} | {row['recall@5']:.3f} | {row['recall@10']:.3f} |")
    return lines


def settings_record(settings: Settings) -> dict[str, Any]:
    """The settings a result depends on, as written into its JSON (and read back by --rescore)."""
    return {"profile": settings.profile, "ingest": settings.ingest.model_dump(mode="json"),
            "retrieval": settings.retrieval.model_dump(mode="json"), "router": settings.router.model_dump(mode="json")}


def report(stats: dict, settings: dict[str, Any], dataset: Path, command: str, top_k: int, concurrency: int,
           wall_seconds: float, overrides: dict[str, str]) -> tuple[dict, str]:
    scores = stats["scores"]
    machine = machine_facts()
    retrieval = scores["retrieval"]
    overall = retrieval["all"]
    changed = "settings changed: " + ", ".join(f"`{k} = {v}`" for k, v in overrides.items()) if overrides else "default settings"
    lines = [
        "# Document QA on real PDFs: retrieval, citations, answers, refusals",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine['cpu']}, {machine['logical_cores']} logical cores, {machine['memory_gib']} GiB, GPU: "
        f"{machine['gpu']}, Python {machine['python']}  ",
        f"Dataset: `{dataset.name}`, {len(stats['documents'])} PDFs, {stats['pages']} pages, {scores['questions']} questions "
        f"({overall['questions']} answerable with evidence pages). Profile `{settings['profile']}`, "
        f"{changed}; one "
        f"collection per document; Retrieve with top_k={top_k}, Query with every option at its default.  ",
        f"Wall time {wall_seconds:.0f} s: MinerU parse-only {stats['parse_only_seconds']:.0f} s, ingest "
        f"{stats['ingest_seconds']:.0f} s ({concurrency} documents at a time), questions {stats['query_seconds']:.0f} s."
        + (f" The machine's 1-minute load average (2 cores; other work shares it), sampled every 15 s: ingest mean "
           f"{stats['load_average']['ingest']['mean']:.1f} (max {stats['load_average']['ingest']['max']:.1f}), questions "
           f"mean {stats['load_average']['questions']['mean']:.1f}." if stats.get("load_average") else ""),
        "",
        "## Page retrieval (answerable questions; any evidence page counts)",
        "",
        "| system | R@1 | R@5 | R@10 | MRR@10 |",
        "|---|---:|---:|---:|---:|",
    ]
    labels = {**SYSTEM_LABELS, **{name: f"Retrieve, {name.removeprefix('ablation: ')}" for name in overall if name.startswith("ablation: ")}}
    for system, label in labels.items():
        if system not in overall:  # the OCR-text baselines, in runs recorded before them
            continue
        row = overall[system]
        lines.append(f"| {label} | {row['recall@1']:.3f} | {row['recall@5']:.3f} | {row['recall@10']:.3f} | {row['mrr@10']:.3f} |")
    bm25 = overall["bm25_pages"]
    ours = overall["thinkserve"]
    lines += [
        "",
        f"Retrieve minus BM25 over pages: R@1 {ours['recall@1'] - bm25['recall@1']:+.3f}, R@5 "
        f"{ours['recall@5'] - bm25['recall@5']:+.3f}, R@10 {ours['recall@10'] - bm25['recall@10']:+.3f}.",
        "",
        "By evidence source (R@1 / R@5):",
        "",
    ]
    shown = SYSTEMS + tuple(s for s in OCR_BASELINES if s in overall)
    lines += [
        "| source | n | " + " | ".join(SYSTEM_LABELS[s] for s in shown) + " |",
        "|---|---:|" + "---:|" * len(shown),
    ]
    for source, row in retrieval.items():
        if source == "all":
            continue
        cells = [f"{row[s]['recall@1']:.2f} / {row[s]['recall@5']:.2f}" for s in shown]
        lines.append(f"| {source} | {row['questions']} | " + " | ".join(cells) + " |")
    lines += _ocr_lines(stats, scores.get("retrieval_without_text_layer") or {}, shown)
    citation, accuracy, refusal = scores["first_citation"], scores["answer_accuracy"], scores["refusal"]
    declined = refusal["declined (refusal or nothing cited)"]
    lines += [
        "",
        "## Answers (Query, every request option at its default)",
        "",
        f"- First citation on an evidence page: {_f(citation['on_evidence_page_of_cited'])} of the {citation['cited']} "
        f"answerable questions whose answer cites something ({_f(citation['on_evidence_page_of_answerable'])} of all "
        f"{citation['answerable']} answerable).",
        f"- Answer contains the expected answer (normalised: NFKC, case folded, thousands separators dropped, "
        f"punctuation, $ and % ignored, whole words): {_f(accuracy['contains_answer'])} of {accuracy['short_answers']} "
        "short answers (Int, Float, Str of at most 5 words); "
        + ", ".join(f"{fmt} {_f(value)}" for fmt, value in accuracy["by_format"].items()) + "; "
        f"{_f(accuracy.get('contains_answer_all_answerable'))} of all {accuracy.get('answerable', 'n/a')} answerable questions.",
        *_short_answer_lines(accuracy),
        f"- Declining to answer (a refusal, or an answer citing nothing) on the {declined['unanswerable']} unanswerable "
        f"questions: precision {_f(declined['precision'])}, recall {_f(declined['recall'])}, F1 {_f(declined.get('f1'))} "
        f"({declined['declined']} declined); refusals alone: precision {_f(refusal['refusal answer only']['precision'])}, "
        f"recall {_f(refusal['refusal answer only']['recall'])}, F1 {_f(refusal['refusal answer only'].get('f1'))} "
        f"({refusal['refusal answer only']['declined']} refused).",
        *_answerability_line(scores.get("refusal_by_answerability")),
        *_threshold_line(scores.get("refusal_by_best_cosine")),
        "- Routes: " + ", ".join(f"{route} {count}" for route, count in sorted(scores["routes"].items()))
        + " (short-answer questions: " + ", ".join(f"{route} {count}" for route, count in sorted(scores["routes_answerable_short"].items())) + ").",
        f"- Latency, one query at a time: Retrieve p50 {scores['latency_ms']['retrieve']['p50']:.0f} ms / p95 "
        f"{scores['latency_ms']['retrieve']['p95']:.0f} ms; Query p50 {scores['latency_ms']['query']['p50']:.0f} ms / p95 "
        f"{scores['latency_ms']['query']['p95']:.0f} ms.",
        *_own_time_lines(scores.get("own_time_ms") or {}),
        *answer_comparison.report_lines(stats.get("answerer_scores") or {}, stats.get("router_scores") or {}),
        "",
        "## Ingest",
        "",
        f"MinerU parse-only {stats['parse_only_pages_per_s']:.2f} pages/s; " + (
            f"ingest through the service {stats['ingest_pages_per_s']:.2f} pages/s "
            f"({stats['ingest_pages_per_s'] / stats['parse_only_pages_per_s']:.0%} of parse-only)."
            if stats["ingest_pages_per_s"] is not None else
            f"ingest not measured: {len(stats['documents']) - stats['ingested_documents']} documents were already in --data-dir."
        ),
        "",
    ]
    # every PDF has running heads dropped: the other warnings are the ones worth reading
    warned = {name: [w for w in d["warnings"] if "running heads" not in w] for name, d in stats["documents"].items()}
    if any(warned.values()):
        lines += ["Document warnings (running heads dropped left out):", ""]
        lines += [f"- {name}: {'; '.join(w)}" for name, w in warned.items() if w] + [""]
    payload = {
        "benchmark": NAME, "command": command, "machine": machine, "uncommitted_changes": uncommitted_changes(),
        "wall_seconds": wall_seconds, "dataset": str(dataset.name), "top_k": top_k,
        "settings": settings, "overrides": overrides, "stats": stats,
    }
    return payload, "\n".join(lines)


BASELINE_TIMEOUT_S = 900.0


def rescore(path: Path, questions: list[Question], dataset: Path, command: str) -> tuple[dict, str]:
    """A previous run's answers, rankings and timings scored again (a new figure without a new 50-minute run);
    the report names both commands. A results file may be gzipped (.json.gz: how the larger ones are committed,
    a tenth of the size, so the tree stays small enough to travel to the GPU machine), and a name as the run wrote
    it (document_qa.json) finds its committed .json.gz."""
    try:
        previous = read_json(path)
        stats = previous["stats"]
        runs = {int(k): v for k, v in stats["runs"].items()}
        rankings = {int(k): v for k, v in stats["baselines"].items()}
    except (OSError, ValueError, KeyError) as error:
        raise SystemExit(f"--rescore: {path} is not a {NAME} results file: {error}") from None
    missing = [q.id for q in questions if q.id not in runs or q.id not in rankings]
    if missing:
        raise SystemExit(f"--rescore: {path} has no run of question {missing[0]} ({len(missing)} missing): "
                         "give the --dataset and --documents of that run")
    textless = {name: pages_without_text_layer(dataset / "documents" / name) for name in {q.document for q in questions}}
    stats = {**stats, "scores": score(questions, runs, rankings, textless)}
    if all("answerers" in runs[q.id] for q in questions) and questions:
        stats["answerer_scores"] = answer_comparison.score_answerers(
            questions, {q.id: runs[q.id]["answerers"] for q in questions}, {q.id: runs[q.id].get("answerability") for q in questions})
    if all("routers" in runs[q.id] for q in questions) and questions:
        stats["router_scores"] = answer_comparison.score_routers(questions, {q.id: runs[q.id]["routers"] for q in questions})
    for name, document in stats["documents"].items():  # older runs did not record them
        document.setdefault("pages_without_text_layer", textless.get(name, []))
    # the concurrency is not in older results files; 2 was the default then
    concurrency = stats.get("ingest_concurrency", 2)
    return report(stats, previous["settings"], dataset, f"{command}` (scored again; measured by `{previous['command']}",
                  previous["top_k"], concurrency, previous["wall_seconds"], previous.get("overrides") or {})


def declare_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", type=Path, default=DEFAULT_DATASET, help="folder with documents/ and questions.json")
    parser.add_argument("--documents", type=int, default=0, help="only the first N documents (by name) and their questions")
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME",
                        help="only these documents (file names) and their questions")
    parser.add_argument("--top-k", type=int, default=20, help="Retrieve's top_k: evidence items ranked per question")
    parser.add_argument("--ingest-concurrency", type=int, default=2, help="documents ingested at once")
    parser.add_argument("--ablations", action="store_true", help="also Retrieve with each signal switched off")
    parser.add_argument("--answerers", nargs="+", default=[], choices=answer_comparison.ANSWERERS,
                        help="also Query each question once per answerer (the request option), scored side by side")
    parser.add_argument("--routers", nargs="+", default=[], choices=answer_comparison.ROUTER_MODES,
                        help="also Retrieve each question once per router mode, scored on single- vs cross-page evidence")
    parser.add_argument("--data-dir", type=Path, help="keep the collections here (and reuse those already there)")
    parser.add_argument("--config", type=Path, help="settings file (TOML); default: the built-in tiny profile")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting over the config, e.g. retrieval.structural_weight=0.5 (repeatable)")
    parser.add_argument("--rescore", type=Path, metavar="JSON",
                        help="measure nothing: score a previous run's results file again with this code's scoring")
    parser.add_argument("--output", type=Path, default=None,
                        help="results folder (default: benchmarks/results/<the dataset folder's name>)")
    parser.add_argument("--name", default=NAME, help="result file name")


def run_benchmark(args: argparse.Namespace, command: str) -> int:
    malformed = [item for item in args.set if "=" not in item]
    if malformed:
        raise UsageError(f"--set takes KEY=VALUE, got {', '.join(malformed)}")
    overrides = dict(item.split("=", 1) for item in args.set)
    if args.rescore and (overrides or args.config or args.data_dir or args.ablations):
        raise UsageError("--rescore measures nothing: --set, --config, --data-dir and --ablations belong to the run it scores")
    questions = load_questions(args.dataset)
    names = sorted({q.document for q in questions})
    if args.only:
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            raise UsageError(f"--only: no questions about {', '.join(unknown)}")
        names = [name for name in names if name in set(args.only)]
    if args.documents:
        names = names[: args.documents]
    questions = [q for q in questions if q.document in set(names)]
    if args.rescore:
        payload, markdown = rescore(args.rescore, questions, args.dataset, command)
    else:
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="thinkserve-docqa-") as scratch:
            work = Path(scratch)
            settings = Settings.load(args.config, overrides).scratch(args.data_dir or work / "data")
            stats = asyncio.run(measure(settings, args.dataset, names, questions, args.top_k, args.ingest_concurrency,
                                        args.ablations, work, lambda message: print(f"* {message}", file=sys.stderr, flush=True),
                                        tuple(args.answerers), tuple(args.routers)))
        payload, markdown = report(stats, settings_record(settings), args.dataset, command, args.top_k,
                                   args.ingest_concurrency, time.monotonic() - started, overrides)
    write_and_show(args.name, payload, markdown, args.output or RESULTS / args.dataset.resolve().name)
    return 0
