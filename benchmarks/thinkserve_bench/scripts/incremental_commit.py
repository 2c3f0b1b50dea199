"""Adding and deleting one document in a large collection: the commit, its publication, the queries around it.

    thinkserve-bench incremental_commit [--documents 100] [--chunks-per-document 1000] [--rounds 3]

A synthetic collection (benchmarks/thinkserve_bench/scripts/synthetic_collection.py, 100 x 1,000 chunks by default, no models) is
written to disk and opened as a server opens it (KnowledgeBase with warm=True). Measured, in one run:
  steady        retrieval (dense + BM25 over passages and pages + graph + fusion, the Simple route) once
                everything is built: the query a user waits for when nothing has changed
  add           one 20-page document (80 chunks) committed: the commit's wall time (durable when it returns),
                a query sent at once (it reads the previous snapshot while the new one is built), the time
                until the new snapshot is published (its BM25 indexes built: what an ingest waits for before it
                answers), the first query on it, the time until its own graph is built and a query then
  delete        the same document deleted, measured the same way
  bulk          --bulk documents committed back to back by two writers that each wait for visibility, as
                `thinkserve ingest` of a folder does: seconds per document
  builds        what a snapshot builds on first use (BM25 indexes, graph, node-evidence table), each timed
                alone: from nothing, and for a snapshot that appends one document to a built one
The commit writes the segment durably as ingest does; the document's model time (embedding it) is not part of
this benchmark: its vectors come with it.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from thinkserve_bench.machine import machine_facts
from thinkserve_bench.result_files import RESULTS, uncommitted_changes, write_results
from thinkserve_bench.stats import summarize
from orchestrator.config import Settings
from orchestrator.knowledge.storage.indexes import IndexSpec
from orchestrator.knowledge.storage.registry import KnowledgeBase
from orchestrator.knowledge.storage.snapshot import Snapshot
from orchestrator.pipeline.plan import QueryOptions, make_plan
from orchestrator.pipeline.retrieval import retrieve
from orchestrator.pipeline.router import query_features

from .synthetic_collection import CollectionShape, SyntheticCorpus, write_collection

NAME = "incremental_commit"
COLLECTION = "large"
LAZY_PARTS = ("lexical", "page_lexical", "graph", "node_evidence")


def query_ms(snapshot: Snapshot, question, settings: Settings) -> float:
    plan = make_plan("simple", QueryOptions(), settings)
    started = time.perf_counter()
    features = query_features(question.text, snapshot.entity_key_set)
    retrieve(snapshot, [question.text], question.vector, plan, settings.retrieval, features.entities, features.modalities)
    return (time.perf_counter() - started) * 1000


async def bulk_load(collection, documents: list, wait_each: bool = True) -> dict:
    """Documents committed back to back by two writers (two in flight, as `thinkserve ingest` sends a folder).
    wait_each: each waits until queries can see its document, as a plain Ingest call does; otherwise each
    answers once durable (return_when_durable, what `thinkserve ingest` now sends) and the load waits once,
    at its end. Commits that land during a build are published by one build together."""
    pending = list(documents)
    commits: list[float] = []
    started = time.monotonic()

    async def writer() -> None:
        while pending:
            segment = pending.pop(0)
            staging = collection.staging_folder()
            (staging / "assets").mkdir()
            (staging / "pages").mkdir()
            async with collection.write_lock:
                began = time.monotonic()
                await asyncio.to_thread(collection.commit, segment, staging)
                commits.append(time.monotonic() - began)
                generation = collection.head().generation
            if wait_each:
                await collection.visible(generation)

    await asyncio.gather(writer(), writer())
    await collection.visible(collection.head().generation)
    return {"documents": len(documents), "wall_s": time.monotonic() - started, "commits_s": float(sum(commits))}


def wait_published(collection, limit_s: float = 600) -> float:
    """Seconds until queries read the collection's newest commit (its snapshot built and published)."""
    started = time.monotonic()
    while collection.snapshot is not collection.head():
        if time.monotonic() - started > limit_s:
            raise TimeoutError("the new snapshot was not published")
        time.sleep(0.005)
    return time.monotonic() - started


def wait_graph(collection, limit_s: float = 600) -> float:
    """Seconds until the published snapshot's own graph is built (a large collection publishes before it)."""
    started = time.monotonic()
    while collection.snapshot is not collection.head() or not collection.snapshot.built("graph_built"):
        if time.monotonic() - started > limit_s:
            raise TimeoutError("the new snapshot's graph was not built")
        time.sleep(0.005)
    return time.monotonic() - started


def timed_parts(snapshot: Snapshot) -> dict[str, float]:
    """Seconds each lazily built part of a snapshot takes, built in order."""
    builds = {}
    for part in LAZY_PARTS:
        started = time.monotonic()
        getattr(snapshot, part)
        builds[part] = time.monotonic() - started
    return builds


def wait_warm(snapshot: Snapshot, limit_s: float = 600) -> float:
    started = time.monotonic()
    while not all(part in snapshot.__dict__ for part in LAZY_PARTS + ("nodes_per_evidence",)):
        if time.monotonic() - started > limit_s:
            raise TimeoutError("the background warm-up did not finish")
        time.sleep(0.01)
    return time.monotonic() - started


def declare_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--documents", type=int, default=100)
    parser.add_argument("--chunks-per-document", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--queries", type=int, default=30)
    parser.add_argument("--bulk", type=int, default=10, help="documents committed back to back by two writers")
    parser.add_argument("--name", default=NAME)
    parser.add_argument("--output", type=Path, default=RESULTS)


def run_benchmark(args: argparse.Namespace, command: str) -> None:
    shape = CollectionShape(documents=args.documents + 1 + 2 * args.bulk, chunks_per_document=args.chunks_per_document)
    corpus = SyntheticCorpus(shape)  # then the document added and deleted (80 chunks of it), then the bulk load's
    segments = corpus.segments()
    questions = corpus.questions(args.queries)
    settings = Settings()
    sys.setswitchinterval(settings.server.switch_interval_ms / 1000)  # as a serving process sets it
    data_dir = Path(tempfile.mkdtemp(prefix="incremental-commit-"))
    rounds = []
    try:
        write_collection(segments[: args.documents], data_dir, COLLECTION)
        knowledge = KnowledgeBase(data_dir, IndexSpec(), warm=True)
        collection = knowledge.collection(COLLECTION)
        opened = time.monotonic()
        snapshot = collection.snapshot
        open_s = time.monotonic() - opened
        warm_after_open_s = wait_warm(snapshot)
        steady = [query_ms(snapshot, q, settings) for q in questions]
        cold_builds = timed_parts(Snapshot(99, snapshot.segments, IndexSpec()))
        extra = corpus.document(args.documents, 80)
        started = time.monotonic()
        appended = Snapshot(100, list(snapshot.segments) + [extra], IndexSpec(), base=snapshot)
        append_made_s = time.monotonic() - started
        append_builds = timed_parts(appended)  # the BM25 indexes from the published snapshot's runs
        del appended
        for number in range(args.rounds):
            extra = corpus.document(args.documents, 80)
            question = questions[number % len(questions)]
            staging = collection.staging_folder()
            (staging / "assets").mkdir()
            (staging / "pages").mkdir()
            started = time.monotonic()
            collection.commit(extra, staging)
            commit_s = time.monotonic() - started
            during_ms = query_ms(collection.snapshot, question, settings)  # the previous snapshot, built
            visible_s = wait_published(collection)
            first_ms = query_ms(collection.snapshot, question, settings)  # over the previous graph until its own is built
            graph_s = visible_s + wait_graph(collection)
            with_graph_ms = query_ms(collection.snapshot, question, settings)
            started = time.monotonic()
            collection.delete(extra.document.name)
            delete_s = time.monotonic() - started
            during_delete_ms = query_ms(collection.snapshot, question, settings)
            delete_visible_s = wait_published(collection)
            first_after_delete_ms = query_ms(collection.snapshot, question, settings)  # its graph cut down before publication
            delete_graph_s = delete_visible_s + wait_graph(collection)
            rounds.append({
                "commit_s": commit_s, "query_during_build_ms": during_ms, "visible_s": visible_s, "first_query_ms": first_ms,
                "delete_s": delete_s, "query_during_delete_build_ms": during_delete_ms, "delete_visible_s": delete_visible_s,
                "first_query_after_delete_ms": first_after_delete_ms, "graph_s": graph_s, "first_query_with_graph_ms": with_graph_ms,
                "delete_graph_s": delete_graph_s,
            })
            print(f"* round {number}: commit {commit_s:.2f} s, published {visible_s:.2f} s later, first query {first_ms:.0f} ms, "
                  f"graph {graph_s:.2f} s after the commit; delete {delete_s:.2f} s, published {delete_visible_s:.2f} s later, "
                  f"first query {first_after_delete_ms:.0f} ms, graph {delete_graph_s:.2f} s after", flush=True)
        evidence = len(collection.snapshot.evidence)
        def batch(number: int) -> list:
            return [corpus.document(args.documents + 1 + number * args.bulk + i, 80) for i in range(args.bulk)]

        async def both() -> tuple[dict, dict]:  # one event loop: the collection's write lock belongs to it
            return await bulk_load(collection, batch(0)), await bulk_load(collection, batch(1), wait_each=False)

        bulk, durable = asyncio.run(both())
        print(f"* bulk load: {args.bulk} documents in {bulk['wall_s']:.1f} s ({bulk['commits_s']:.1f} s of it in commits); "
              f"answering once durable: {durable['wall_s']:.1f} s", flush=True)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    result = {
        "benchmark": NAME, "command": command, "machine": machine_facts(),
        "uncommitted_changes": uncommitted_changes(), "shape": {**shape.__dict__, "documents": args.documents},
        "evidence": evidence, "open_s": open_s, "warm_after_open_s": warm_after_open_s,
        "steady_query": summarize([ms / 1000 for ms in steady]), "cold_builds_s": cold_builds,
        "append_made_s": append_made_s, "append_builds_s": append_builds, "rounds": rounds,
        "bulk": bulk, "bulk_durable": durable,
    }
    path, md_path = write_results(args.name, result, markdown(result), args.output)
    print(markdown(result))
    print(f"wrote {path} and {md_path}")


def markdown(result: dict) -> str:
    steady = result["steady_query"]["p50_ms"]
    rounds = result["rounds"]

    def median(key: str) -> float:
        return float(np.median([r[key] for r in rounds]))

    machine = result["machine"]
    lines = [
        "# Adding and deleting one document in a large collection",
        "",
        f"Command: `{result['command']}`  ",
        f"Machine: {machine['cpu']}, {machine['logical_cores']} logical cores, {machine['memory_gib']} GiB, GPU: {machine['gpu'] or 'none'}  ",
        f"Collection: {result['evidence']:,} chunks in {result['shape']['documents']} synthetic documents, flat index; "
        f"opened in {result['open_s']:.1f} s, warmed in the background {result['warm_after_open_s']:.1f} s after. "
        f"The document added and deleted: 20 pages, 80 chunks. Medians over {len(rounds)} rounds.",
        "",
        "| | seconds or ms | x steady query |",
        "|---|---:|---:|",
        f"| steady-state query (Simple route retrieval, p50 of {result['steady_query']['count']}) | {steady:.1f} ms | 1.0 |",
        f"| commit of the document (durable when it returns; slowest round) | {median('commit_s'):.2f} s "
        f"({max(r['commit_s'] for r in rounds):.2f} s) | |",
        f"| a query sent at once (it reads the previous snapshot) | {median('query_during_build_ms'):.1f} ms | "
        f"{median('query_during_build_ms') / steady:.1f} |",
        f"| the new snapshot built and published (what an ingest waits for) | {median('visible_s'):.2f} s after the commit | |",
        f"| the first query on it | {median('first_query_ms'):.1f} ms | {median('first_query_ms') / steady:.1f} |",
        f"| its graph built (extended, before publication) | {median('graph_s'):.2f} s after the commit | |",
        f"| a query then | {median('first_query_with_graph_ms'):.1f} ms | {median('first_query_with_graph_ms') / steady:.1f} |",
        f"| delete of the document | {median('delete_s'):.2f} s | |",
        f"| a query sent at once | {median('query_during_delete_build_ms'):.1f} ms | {median('query_during_delete_build_ms') / steady:.1f} |",
        f"| the snapshot without it published | {median('delete_visible_s'):.2f} s after the delete | |",
        f"| the first query on it | {median('first_query_after_delete_ms'):.1f} ms | {median('first_query_after_delete_ms') / steady:.1f} |",
        f"| its graph there (cut down from the previous one: graph_without) | {median('delete_graph_s'):.2f} s after the delete | |",
        "",
        f"Bulk load: {result['bulk']['documents']} documents of 80 chunks committed back to back by two writers, each "
        f"waiting for its document to be visible as an ingest does: {result['bulk']['wall_s']:.1f} s, "
        f"{result['bulk']['wall_s'] / max(1, result['bulk']['documents']):.2f} s a document, of which the commits took "
        f"{result['bulk']['commits_s']:.1f} s in all (no model time: the vectors come with the documents). "
        f"The same with each answering once durable (return_when_durable, as `thinkserve ingest` sends a folder) "
        f"and one wait for visibility at the end: {result['bulk_durable']['wall_s']:.1f} s, "
        f"{result['bulk_durable']['wall_s'] / max(1, result['bulk_durable']['documents']):.2f} s a document.",
        "",
        "What a snapshot builds on first use, from nothing (an opened collection; seconds): "
        + ", ".join(f"{part} {seconds:.2f}" for part, seconds in result["cold_builds_s"].items())
        + f". The same for a snapshot that appends the 80-chunk document to the built one (made in "
        f"{result['append_made_s']:.2f} s: records joined, vector indexes extended): "
        + ", ".join(f"{part} {seconds:.2f}" for part, seconds in result["append_builds_s"].items())
        + ". The BM25 indexes extend the previous snapshot's runs (knowledge/lexical.py), the graph and its node "
        "table the previous graph (graph.py's appended_graph); a delete takes the document's share out of the "
        "previous graph (graph_without). Queries keep reading the previous snapshot until the new one's BM25 "
        "indexes and its extended or cut-down graph are built; only a graph built from every document (after an "
        "opening) is published after its snapshot at this size (storage.publish_before_graph_rows). An ingest or "
        "delete answers once its snapshot is published.",
        "",
    ]
    return "\n".join(lines)
