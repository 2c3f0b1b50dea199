"""Query latency: retrieval + graph + fusion on a large synthetic collection, and the whole pipeline per route.

    thinkserve-bench query_latency [--documents 100 --chunks-per-document 1000] [--queries 200]
                                       [--rounds 5] [--part all|retrieval|pipeline]

Part `retrieval` (no models): a synthetic collection of documents x chunks (benchmarks/thinkserve_bench/scripts/synthetic_collection.py)
is loaded as one snapshot per FAISS index kind; for each route's policy, questions made from random chunks
run the router's features and `retrieve` (dense chunks and entities, BM25, k-hop + personalized
PageRank, fusion) with the question vector given, as the pipeline runs it after embedding. Reports p50/p95
per stage and in all. Goal: under 10 ms p50 at 100,000 chunks.

Part `pipeline` (the real deployment: Triton with the tiny repository, the orchestrator over gRPC): the
sample report, a three-page PDF and a generated two-document PDF corpus are ingested; every question runs
on each fixed route (the tiny profile's defaults: extractive answer), and on the Complex route with the LLM
answerer (uncertainty loop included), one warm-up round then `rounds` measured rounds, one query at a time.
Reports per-stage p50/p95 from the pipeline's own timing events, the client-observed latency, and the
orchestrator's own share of the time (everything that is not waiting on a model). Goal: under 10%.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import numpy as np

from thinkserve_bench.corpora.pdf_factory import write_sample_report
from thinkserve_bench.corpora.report_corpus import write_corpus
from thinkserve_bench.machine import machine_facts
from thinkserve_bench.result_files import invocation, write_results
from thinkserve_bench.stats import summarize
from orchestrator.client import AsyncThinkServeClient
from orchestrator.config import ROUTE_NAMES, Settings
from orchestrator.server.deployment import running
from orchestrator.knowledge.storage.indexes import IndexSpec
from orchestrator.knowledge.storage.snapshot import Snapshot
from orchestrator.pipeline.plan import QueryOptions, make_plan
from orchestrator.pipeline.retrieval import retrieve
from orchestrator.pipeline.router import query_features

from .synthetic_collection import CollectionShape, SyntheticCorpus

NAME = "query_latency"
RETRIEVAL_STAGES = ("route", "dense", "sparse", "graph", "fusion")
EVIDENCE_K = 20  # the chunk_top_k of the moderate and complex routes
EF_SWEEP = (16, 32, 64, 128, 256)
QUESTIONS = [
    "What was Northwind's total revenue in 2024?",
    "Which region grew the fastest, and why?",
    "Who became chief executive in 2024?",
    "Where is the new factory and when did it start production?",
    "Which distribution centres did the company open during the spring?",
    "Compare the revenue of the regions in the table.",
    "What does the chart of quarterly shipments show?",
    "Which site reported the largest order backlog, and how did energy use change?",
]
PIPELINE_CONFIGS = {
    "simple": {"route": "simple"},
    "moderate": {"route": "moderate"},
    "complex": {"route": "complex"},
    "complex + LLM answerer": {"route": "complex", "answerer": "llm"},
}


def _stats(samples_ms: list[float]) -> dict:
    return summarize([s / 1000.0 for s in samples_ms])


# ---------------------------------------------------------------------------------------------- retrieval


def measure_retrieval(shape: CollectionShape, kinds: list[str], queries: int, flat_queries: int) -> dict:
    started = time.monotonic()
    corpus = SyntheticCorpus(shape)
    segments = corpus.segments()
    questions = corpus.questions(queries)
    settings = Settings()
    built = {"segments_s": time.monotonic() - started}
    results: dict = {"shape": shape.__dict__, "build": built, "kinds": {}}
    for kind in kinds:
        began = time.monotonic()
        snapshot = Snapshot(1, segments, IndexSpec(kind=kind))
        timings = {"indexes_s": time.monotonic() - began}
        for part in ("graph", "lexical", "node_evidence", "entity_key_set"):
            began = time.monotonic()
            getattr(snapshot, part)
            timings[f"{part}_s"] = time.monotonic() - began
        graph = snapshot.graph
        exact = _exact_top(corpus.chunk_vectors, questions, EVIDENCE_K)
        sweep = _ef_sweep(snapshot, questions, exact, settings.index.hnsw_ef_search) if kind == "hnsw" else {}
        per_route = {}
        count = queries if kind != "flat" else min(queries, flat_queries)
        for route in ROUTE_NAMES:
            plan = make_plan(route, QueryOptions(), settings)
            stages: dict[str, list[float]] = {stage: [] for stage in RETRIEVAL_STAGES}
            totals, graph_nodes, candidates = [], [], []
            for i, question in enumerate(questions[: count + 5]):
                began = time.perf_counter()
                features = query_features(question.text, snapshot.entity_key_set)
                routed = time.perf_counter()
                result = retrieve(
                    snapshot, [question.text], question.vector, plan, settings.retrieval, features.entities, features.modalities
                )
                ended = time.perf_counter()
                if i < 5:  # warm-up
                    continue
                totals.append((ended - began) * 1000)
                stages["route"].append((routed - began) * 1000)
                for stage in RETRIEVAL_STAGES[1:]:
                    stages[stage].append(result.timings_ms.get(stage, 0.0))
                graph_nodes.append(len(result.expansion.nodes))
                candidates.append(len(result.candidates))
            per_route[route] = {
                "total": _stats(totals),
                "stages": {stage: _stats(values) for stage, values in stages.items()},
                "graph_nodes_mean": float(np.mean(graph_nodes)),
                "candidates_mean": float(np.mean(candidates)),
                "plan": {"chunk_top_k": plan.chunk_top_k, "entity_top_k": plan.entity_top_k, "graph_hops": plan.graph_hops},
            }
        results["kinds"][kind] = {
            "build": timings,
            "ef_sweep": sweep,
            "evidence": len(snapshot.evidence),
            "entities": len(snapshot.entity_keys),
            "relations": len(snapshot.relation_keys),
            "graph_nodes": graph.node_count,
            "graph_edges": len(graph.edges),
            "routes": per_route,
        }
        del snapshot
    return results


def _exact_top(vectors: np.ndarray, questions, k: int) -> list[set[int]]:
    """The true k nearest chunks of each question (inner product over every vector)."""
    scores = np.stack([q.vector[0] for q in questions]) @ vectors.T
    return [set(np.argpartition(-row, k)[:k].tolist()) for row in scores]


def _ef_sweep(snapshot: Snapshot, questions, exact: list[set[int]], configured: int) -> dict:
    """Chunk search on the HNSW index at several efSearch values: p50 latency and recall@k against exact."""
    out = {}
    for ef in EF_SWEEP:
        snapshot.evidence_index.set_ef_search(ef)
        times, hits = [], 0
        for question, truth in zip(questions, exact):
            began = time.perf_counter()
            _, rows = snapshot.evidence_index.search(question.vector, EVIDENCE_K)
            times.append((time.perf_counter() - began) * 1000)
            hits += len(truth & set(rows[0].tolist()))
        out[ef] = {"p50_ms": float(np.median(times)), "recall": hits / (EVIDENCE_K * len(questions))}
    snapshot.evidence_index.set_ef_search(configured)
    return out


# ---------------------------------------------------------------------------------------------- pipeline


async def measure_pipeline(rounds: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="thinkserve-bench-") as folder:
        work = Path(folder)
        settings = Settings().scratch(work / "data")
        documents = [
            Path("samples/northwind-2024-annual-report.md"),
            write_sample_report(work / "northwind-report.pdf").path,
            *write_corpus(work / "corpus", documents=2, pages=6),
        ]
        async with running(settings, lambda message: print(f"* {message}", flush=True)) as deployment:
            async with AsyncThinkServeClient(deployment.address, timeout_s=600) as client:
                pages = 0
                for document in documents:
                    report = await client.ingest_file("bench", document)
                    pages += report.document.pages
                results = {"documents": len(documents), "pages": pages, "questions": QUESTIONS, "rounds": rounds, "configs": {}}
                for label, options in PIPELINE_CONFIGS.items():
                    print(f"* {label}", flush=True)
                    results["configs"][label] = await _run_config(client, options, rounds)
    return results


async def _run_config(client: AsyncThinkServeClient, options: dict, rounds: int) -> dict:
    samples = []
    for round_number in range(rounds + 1):
        for question in QUESTIONS:
            began = time.perf_counter()
            final = None
            async for event in client.query("bench", question, **options):
                if event.WhichOneof("event") == "final":
                    final = event.final
            wall_ms = (time.perf_counter() - began) * 1000
            if round_number == 0:  # warm-up
                continue
            samples.append({
                "question": question,
                "client_ms": wall_ms,
                "timings": {t.stage: t.milliseconds for t in final.timings},
                "model_ms": final.cost.model_ms,
                "orchestrator_ms": final.cost.orchestrator_ms,
                "answer_source": final.answer_source,
                "degraded": final.degraded,
                "models": {f"{u.model}/{u.stage}": u.calls for u in final.cost.models},
            })
    stages = sorted({stage for s in samples for stage in s["timings"]})
    totals = [s["timings"]["total"] for s in samples]
    return {
        "options": options,
        "samples": samples,
        "client": _stats([s["client_ms"] for s in samples]),
        "stages": {stage: _stats([s["timings"][stage] for s in samples if stage in s["timings"]]) for stage in stages},
        "orchestrator_share": sum(s["orchestrator_ms"] for s in samples) / sum(totals),
        "orchestrator_share_p50": float(np.median([s["orchestrator_ms"] / s["timings"]["total"] for s in samples])),
        "orchestrator_ms": _stats([s["orchestrator_ms"] for s in samples]),
    }


# ---------------------------------------------------------------------------------------------- report


def markdown(command: str, machine: dict, retrieval: dict | None, pipeline: dict | None) -> str:
    lines = [
        "# Query latency",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine['cpu']}, {machine['logical_cores']} logical cores, {machine['memory_gib']} GiB, GPU: {machine['gpu']}",
        "",
    ]
    if retrieval:
        shape = retrieval["shape"]
        lines += [
            "## Retrieval + graph + fusion on a synthetic collection (no models)",
            "",
            f"{shape['documents'] * shape['chunks_per_document']:,} chunks ({shape['documents']} documents), "
            f"{shape['entities_per_chunk']} entities per chunk from a pool of {shape['entity_pool']:,} (Zipf), "
            f"{shape['words_per_chunk']} words per chunk, {shape['dimension']}-d vectors. Per query: the router's "
            "features, then dense search over chunks and over entities, BM25, k-hop + personalized "
            "PageRank from the matched entities, fusion (the question vector is given: embedding is a model call).",
            "",
            "| index | route | p50 ms | p95 ms | route | dense | sparse | graph | fusion | graph nodes | candidates |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for kind, data in retrieval["kinds"].items():
            for route, r in data["routes"].items():
                stage = " | ".join(f"{r['stages'][s]['p50_ms']:.2f}" for s in RETRIEVAL_STAGES)
                lines.append(
                    f"| {kind} | {route} | **{r['total']['p50_ms']:.2f}** | {r['total']['p95_ms']:.2f} | {stage} | "
                    f"{r['graph_nodes_mean']:.0f} | {r['candidates_mean']:.0f} |"
                )
        for kind, data in retrieval["kinds"].items():
            if data["ef_sweep"]:
                lines += [
                    "", f"Chunk search alone on the {kind} index, by efSearch (recall@{EVIDENCE_K} against exact search):", "",
                    "| efSearch | p50 ms | recall |", "|---:|---:|---:|",
                ]
                lines += [f"| {ef} | {v['p50_ms']:.2f} | {v['recall']:.3f} |" for ef, v in data["ef_sweep"].items()]
        lines += ["", "Stage columns are p50 ms. One-time costs when a snapshot is loaded:", ""]
        for kind, data in retrieval["kinds"].items():
            build = ", ".join(f"{name[:-2]} {seconds:.1f} s" for name, seconds in data["build"].items())
            lines.append(
                f"- {kind}: {data['evidence']:,} chunks, {data['entities']:,} entities, {data['relations']:,} relations, "
                f"graph {data['graph_nodes']:,} nodes / {data['graph_edges']:,} edges; {build}"
            )
        lines.append("")
    if pipeline:
        lines += [
            "## The whole pipeline per route (tiny profile, real Triton, real gRPC)",
            "",
            f"{pipeline['documents']} documents ({pipeline['pages']} pages), {len(pipeline['questions'])} questions x "
            f"{pipeline['rounds']} rounds per configuration after one warm-up round, one query at a time.",
            "",
            "| configuration | client p50 ms | client p95 ms | rag_ttft p50 | orchestrator's own time p50 ms | its share of the time |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for label, data in pipeline["configs"].items():
            ttft = data["stages"].get("rag_ttft", {}).get("p50_ms", float("nan"))
            lines.append(
                f"| {label} | {data['client']['p50_ms']:.1f} | {data['client']['p95_ms']:.1f} | {ttft:.1f} | "
                f"{data['orchestrator_ms']['p50_ms']:.1f} | **{100 * data['orchestrator_share']:.1f}%** |"
            )
        lines += ["", "Per-stage p50 / p95 ms (from the pipeline's timing events):", ""]
        stages = sorted({s for data in pipeline["configs"].values() for s in data["stages"]})
        lines += ["| stage | " + " | ".join(pipeline["configs"]) + " |", "|---|" + "---:|" * len(pipeline["configs"])]
        for stage in stages:
            cells = []
            for data in pipeline["configs"].values():
                value = data["stages"].get(stage)
                cells.append(f"{value['p50_ms']:.1f} / {value['p95_ms']:.1f}" if value else "")
            lines.append(f"| {stage} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def declare_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--part", choices=("all", "retrieval", "pipeline"), default="all")
    parser.add_argument("--documents", type=int, default=100)
    parser.add_argument("--chunks-per-document", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--flat-queries", type=int, default=50, help="queries on the exact Flat index (slow at 100k)")
    parser.add_argument("--kinds", nargs="+", default=["hnsw", "flat"])
    parser.add_argument("--rounds", type=int, default=5)


def run_benchmark(args: argparse.Namespace, command: str) -> None:
    command = invocation(NAME, [
        f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in vars(args).items()
    ])
    machine = machine_facts()
    retrieval = pipeline = None
    if args.part in ("all", "retrieval"):
        shape = CollectionShape(documents=args.documents, chunks_per_document=args.chunks_per_document)
        retrieval = measure_retrieval(shape, args.kinds, args.queries, args.flat_queries)
    if args.part in ("all", "pipeline"):
        pipeline = asyncio.run(measure_pipeline(args.rounds))
    payload = {"command": command, "machine": machine, "retrieval": retrieval, "pipeline": pipeline}
    json_path, md_path = write_results(NAME, payload, markdown(command, machine, retrieval, pipeline))
    print(md_path.read_text())
    print(f"results: {json_path}, {md_path}")
