"""Restart of a large collection: how long until it can answer, with its vector indexes stored or built anew.

    thinkserve-bench collection_restart [--documents 100] [--chunks-per-document 10000] [--kind hnsw]

A synthetic collection (benchmarks/thinkserve_bench/scripts/synthetic_collection.py: documents x chunks, 384-d vectors, entities and
relations) is written straight to disk as segments and a manifest (no models). Then, each in a fresh process:
  first start   opening the collection builds its vector indexes from the segments and writes them
                (what every start cost before stored indexes, stored_indexes.py)
  restart       opening it again loads the stored indexes
  restart       once more, for the spread
Each start reports the seconds until the snapshot is open (segments mapped, vector indexes loaded or built),
then 20 dense searches and the time to read the evidence records they return (a segment's records are read
on first use); the restart's searches must return what the first start's did. The BM25 indexes (over
passages and over pages, assembled from each segment's stored term counts) and the graph are built on a
query's first use or by the server's background warm-up, not at open: their time is reported separately,
once, with the rest of the warm-up (every record read, the vectors faulted in).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from thinkserve_bench.machine import machine_facts
from thinkserve_bench.result_files import RESULTS, uncommitted_changes, write_results
from orchestrator.knowledge.storage.indexes import IndexSpec

from .synthetic_collection import CollectionShape, SyntheticCorpus, write_collection

NAME = "collection_restart"
COLLECTION = "large"

# One start, in a fresh process: open, one dense search (and with --lazy, the BM25 index and the graph).
START = r"""
import json, resource, sys, time
started = time.monotonic()
import numpy as np
from orchestrator.knowledge.storage.indexes import IndexSpec
from orchestrator.knowledge.storage.registry import KnowledgeBase
imported = time.monotonic()
data_dir, spec, lazy = sys.argv[1], IndexSpec(**json.loads(sys.argv[2])), sys.argv[3] == "lazy"
snapshot = KnowledgeBase(__import__("pathlib").Path(data_dir), spec).collection("large").snapshot
opened = time.monotonic()
queries = np.load(sys.argv[4])
scores, rows = snapshot.evidence_index.search(queries, 10)
searched = time.monotonic()
texts = [snapshot.evidence[row].text for row in rows.ravel().tolist() if row >= 0]  # the records a query returns
read = time.monotonic()
result = {"import_s": imported - started, "open_s": opened - imported, "search_ms": (searched - opened) * 1000,
          "records_ms": (read - searched) * 1000, "rows": rows.tolist(), "vectors": snapshot.evidence_index.size,
          "kind": snapshot.evidence_index.kind}
if lazy:
    lexical_started = time.monotonic(); snapshot.lexical; snapshot.page_lexical; snapshot.page_rows
    result["bm25_build_s"] = time.monotonic() - lexical_started
    graph_started = time.monotonic(); snapshot.node_evidence; result["graph_build_s"] = time.monotonic() - graph_started
    warm_started = time.monotonic(); snapshot.warm(); result["warm_rest_s"] = time.monotonic() - warm_started
result["max_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print(json.dumps(result))
"""


def write(shape: CollectionShape, data_dir: Path) -> dict:
    started = time.monotonic()
    corpus = SyntheticCorpus(shape)
    documents = (corpus.document(number, shape.chunks_per_document) for number in range(shape.documents))  # one at a time
    root = write_collection(documents, data_dir, COLLECTION)
    np.save(data_dir / "queries.npy", np.concatenate([q.vector for q in corpus.questions(20)]))
    return {"seconds": time.monotonic() - started, "disk_gib": _size(root) / 2**30}


def start(data_dir: Path, spec: IndexSpec, lazy: bool = False) -> dict:
    spec_json = json.dumps({name: getattr(spec, name) for name in spec.__dataclass_fields__})
    done = subprocess.run(
        [sys.executable, "-c", START, str(data_dir), spec_json, "lazy" if lazy else "-", str(data_dir / "queries.npy")],
        capture_output=True, text=True, check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def markdown(result: dict) -> str:
    shape, runs = result["shape"], result["starts"]
    first, restarts = runs[0], runs[1:]
    lines = [
        "# Collection restart: stored vector indexes against building them at every start",
        "",
        f"Command: `{result['command']}`  ",
        f"Machine: {result['machine']['cpu']}, {result['machine']['logical_cores']} logical cores, "
        f"{result['machine']['memory_gib']} GiB, GPU: {result['machine']['gpu'] or 'none'}  ",
        f"Collection: {shape['documents']} documents x {shape['chunks_per_document']} chunks = "
        f"{shape['documents'] * shape['chunks_per_document']:,} evidence vectors (384-d), {result['entities']:,} entities, "
        f"index `{result['spec']['kind']}` (M {result['spec']['hnsw_neighbors']}, efSearch {result['spec']['hnsw_ef_search']}); "
        f"segments {result['written']['disk_gib']:.2f} GiB on disk, stored indexes {result['index_gib']:.2f} GiB.",
        "",
        "| start | open (s) | Python imports before it (s) | first 20 dense searches (ms) | their records read (ms) | max RSS (GiB) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, run in [("first start: indexes built and written", first)] + [(f"restart {n}: indexes loaded", r) for n, r in enumerate(restarts, 1)]:
        lines.append(f"| {label} | {run['open_s']:.1f} | {run['import_s']:.1f} | {run['search_ms']:.1f} | "
                     f"{run.get('records_ms', float('nan')):.0f} | {run['max_rss_gib']:.2f} |")
    lines += [
        "",
        f"Restart (open, indexes loaded) {min(r['open_s'] for r in restarts):.1f}-{max(r['open_s'] for r in restarts):.1f} s "
        f"against {first['open_s']:.1f} s building them: {first['open_s'] / max(min(r['open_s'] for r in restarts), 1e-9):.1f}x. "
        f"Every restart's 20 searches returned the first start's rows: {result['same_rows']}.",
        "",
        f"Not at open, on a query's first use or in the background warm-up (measured once, in the last restart): "
        f"BM25 indexes over passages and pages {restarts[-1].get('bm25_build_s', float('nan')):.1f} s, "
        f"graph {restarts[-1].get('graph_build_s', float('nan')):.1f} s, the rest of the warm-up "
        f"{restarts[-1].get('warm_rest_s', float('nan')):.1f} s.",
        "",
    ]
    return "\n".join(lines)


def declare_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--documents", type=int, default=100)
    parser.add_argument("--chunks-per-document", type=int, default=10_000)
    parser.add_argument("--words", type=int, default=120, help="words per chunk")
    parser.add_argument("--kind", choices=("hnsw", "ivf"), default="hnsw")
    parser.add_argument("--restarts", type=int, default=2)
    parser.add_argument("--name", default=NAME)
    parser.add_argument("--output", type=Path, default=RESULTS)


def run_benchmark(args: argparse.Namespace, command: str) -> None:
    shape = CollectionShape(documents=args.documents, chunks_per_document=args.chunks_per_document, words_per_chunk=args.words)
    spec = IndexSpec(kind=args.kind)
    data_dir = Path(tempfile.mkdtemp(prefix="collection-restart-"))
    try:
        print(f"* writing {shape.chunks:,} chunks as {shape.documents} segments ...", flush=True)
        written = write(shape, data_dir)
        runs = []
        for number in range(args.restarts + 1):
            runs.append(start(data_dir, spec, lazy=number == args.restarts))
            print(f"* start {number}: open {runs[-1]['open_s']:.1f} s", flush=True)
        root = data_dir / "collections" / COLLECTION
        index_bytes = sum(_size(folder) for folder in root.glob("indexes-*"))
        entities = sum(len(json.loads((folder / "keys.json").read_text())["entities"]) for folder in root.glob("seg-*"))
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    result = {
        "benchmark": NAME, "command": command, "machine": machine_facts(), "uncommitted_changes": uncommitted_changes(),
        "shape": shape.__dict__, "spec": spec.__dict__, "written": written, "index_gib": index_bytes / 2**30,
        "entities": entities, "starts": [{k: v for k, v in run.items() if k != "rows"} for run in runs],
        "same_rows": all(run["rows"] == runs[0]["rows"] for run in runs[1:]),
        "peak_rss_gib_this_process": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }
    json_path, md_path = write_results(args.name, result, markdown(result), args.output)
    print(markdown(result))
    print(f"wrote {json_path} and {md_path}")
