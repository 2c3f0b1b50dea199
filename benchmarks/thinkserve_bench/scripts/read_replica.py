"""Read replicas: how far behind the writer a replica serves, and what the writer's lock and following cost.

    thinkserve-bench read_replica [--documents 20] [--chunks-per-document 1000] [--commits 100] [--interval 1.0]

A synthetic collection (benchmarks/thinkserve_bench/scripts/synthetic_collection.py, no models) is written to disk. This process is the
writer (KnowledgeBase with warm=True, as `serve` runs it: it holds the folder's lock and builds its own
snapshots in the background); a second process is a replica (read-only, warm, following every --interval s,
as `serve --read-only` runs it). Measured, in one run on one machine:
  lag        from the writer's commit returning (durable) to the replica publishing that generation (its
             snapshot loaded and built), over --commits commits: odd commits add an 80-chunk document (the
             replica extends its indexes), even ones delete it again (the replica reads the stored indexes)
  following  the Simple-route retrieval of the same questions on a writer's snapshot and on a following
             replica's snapshot of the same generation, in this process, alternated: the ratio of p50s
  lock       taking and releasing the writer lock of a data folder (a server takes it once, at start)
Both processes share this machine's cores, so the replica's builds compete with the writer's: a replica on a
machine of its own lags less.
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
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
from orchestrator.knowledge.storage.writer_lock import WriterLock

from .incremental_commit import query_ms, wait_warm
from .synthetic_collection import CollectionShape, SyntheticCorpus, write_collection

NAME = "read_replica"
COLLECTION = "large"


def replica(data_dir: Path, interval_s: float, kind: str) -> None:
    """The replica process: prints "ready", then "<generation> <wall time>" each time it publishes one."""
    knowledge = KnowledgeBase(data_dir, IndexSpec(kind=kind), read_only=True, warm=True)
    collection = knowledge.collection(COLLECTION)
    wait_warm(collection.snapshot)
    knowledge.follow(interval_s)
    print("ready", flush=True)
    seen = collection.snapshot.generation
    while True:
        generation = collection.snapshot.generation
        if generation != seen:
            print(f"{generation} {time.time()}", flush=True)
            seen = generation
        time.sleep(0.001)


def lock_cost_us(rounds: int = 200) -> float:
    """Median microseconds to take and give back the writer lock of a fresh folder."""
    samples = []
    with tempfile.TemporaryDirectory(prefix="writer-lock-") as scratch:
        for number in range(rounds):
            folder = Path(scratch) / str(number)
            folder.mkdir()
            started = time.perf_counter()
            WriterLock(folder).release()
            samples.append((time.perf_counter() - started) * 1e6)
    return float(np.median(samples))


def declare_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--documents", type=int, default=20)
    parser.add_argument("--chunks-per-document", type=int, default=1000)
    parser.add_argument("--commits", type=int, default=100)
    parser.add_argument("--interval", type=float, default=1.0, help="the replica's storage.follow_interval_s")
    parser.add_argument("--index", default="flat", choices=("flat", "hnsw"))
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--name", default=NAME)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--replica", type=Path, help=argparse.SUPPRESS)  # run as the replica process


def run_benchmark(args: argparse.Namespace, command: str) -> None:
    if args.replica:
        return replica(args.replica, args.interval, args.index)

    shape = CollectionShape(documents=args.documents + 1, chunks_per_document=args.chunks_per_document)
    corpus = SyntheticCorpus(shape)
    questions = corpus.questions(min(args.queries, 50))
    settings = Settings()
    spec = IndexSpec(kind=args.index)
    data_dir = Path(tempfile.mkdtemp(prefix="read-replica-"))
    rng = random.Random(0)
    lags = {"add": [], "delete": []}
    try:
        write_collection(corpus.segments()[: args.documents], data_dir, COLLECTION)
        writer = KnowledgeBase(data_dir, spec, warm=True, retain_dropped_s=settings.storage.retain_dropped_s)
        collection = writer.collection(COLLECTION)
        wait_warm(collection.snapshot)
        follower = subprocess.Popen(
            [sys.executable, "-m", "thinkserve_bench", "read_replica", "--replica", str(data_dir), "--interval", str(args.interval),
             "--index", args.index],
            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[3],
        )
        try:
            assert follower.stdout.readline().strip() == "ready", "the replica did not start"
            extra = corpus.document(args.documents, 80)
            for number in range(args.commits):
                time.sleep(rng.uniform(0, args.interval))  # commits fall anywhere in the replica's follow period
                if number % 2 == 0:
                    staging = collection.staging_folder()
                    (staging / "assets").mkdir()
                    (staging / "pages").mkdir()
                    collection.commit(extra, staging)
                else:
                    collection.delete(extra.document.name)
                committed = time.time()
                generation = collection.head().generation
                while True:  # the replica reports every generation it publishes, in order
                    reported, at = follower.stdout.readline().split()
                    if int(reported) >= generation:
                        break
                lags["add" if number % 2 == 0 else "delete"].append(float(at) - committed)
                print(f"* commit {number}: generation {generation}, replica {1000 * (float(at) - committed):.0f} ms behind",
                      flush=True)
        finally:
            follower.kill()
            follower.wait()

        # the cost of following, per query: the same generation read by the writer and by a following replica
        reader = KnowledgeBase(data_dir, spec, read_only=True, warm=True)
        followed = reader.collection(COLLECTION)
        reader.follow(args.interval)
        own = collection.snapshot
        wait_warm(own)
        wait_warm(followed.snapshot)
        assert followed.snapshot.generation == own.generation
        times = {"writer": [], "replica": []}
        for number in range(args.queries):
            question = questions[number % len(questions)]
            for role, snapshot in (("writer", own), ("replica", followed.snapshot))[:: 1 if number % 2 else -1]:
                times[role].append(query_ms(snapshot, question, settings) / 1000)
        reader.close()
        writer.close()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    result = {
        "benchmark": NAME, "command": command, "machine": machine_facts(),
        "uncommitted_changes": uncommitted_changes(), "shape": {**shape.__dict__, "documents": args.documents},
        "index": args.index, "interval_s": args.interval,
        "lag": {kind: summarize(samples) for kind, samples in lags.items()},
        "lag_all": summarize(lags["add"] + lags["delete"]),
        "query": {role: summarize(samples) for role, samples in times.items()},
        "lock_us": lock_cost_us(),
    }
    path, md_path = write_results(args.name, result, markdown(result), args.output)
    print(markdown(result))
    print(f"wrote {path} and {md_path}")


def markdown(result: dict) -> str:
    machine, lag, query = result["machine"], result["lag"], result["query"]
    chunks = result["shape"]["documents"] * result["shape"]["chunks_per_document"]

    def row(label: str, summary: dict) -> str:
        return f"| {label} | {summary['count']} | {summary['p50_ms']:.0f} | {summary['p95_ms']:.0f} | {summary['max_ms']:.0f} |"

    ratio = query["replica"]["p50_ms"] / query["writer"]["p50_ms"]
    return "\n".join([
        "# Read replicas: lag behind the writer, and what following costs",
        "",
        f"Command: `{result['command']}`  ",
        f"Machine: {machine['cpu']}, {machine['logical_cores']} logical cores, {machine['memory_gib']} GiB, GPU: {machine['gpu'] or 'none'}  ",
        f"Collection: {chunks:,} chunks in {result['shape']['documents']} synthetic documents, {result['index']} index. "
        f"The replica is a second process following every {result['interval_s']:g} s (storage.follow_interval_s); "
        "writer and replica share this machine's cores.",
        "",
        "Replica lag: from the writer's commit returning (durable) to the replica publishing that generation, "
        "built (ms):",
        "",
        "| commit | n | p50 | p95 | max |",
        "|---|---:|---:|---:|---:|",
        row("add an 80-chunk document", lag["add"]),
        row("delete it", lag["delete"]),
        row("all", result["lag_all"]),
        "",
        f"Simple-route retrieval of the same generation, alternated in one process: writer p50 "
        f"{query['writer']['p50_ms']:.1f} ms, following replica p50 {query['replica']['p50_ms']:.1f} ms "
        f"(ratio {ratio:.2f}; {query['writer']['count']} queries each). Following reads the manifest once per "
        "interval on a thread of its own; a query reads the snapshot it finds, as on the writer.",
        "",
        f"The writer lock: {result['lock_us']:.0f} µs to take and give back (median of 200), once per server start; "
        "nothing per query.",
        "",
    ])
