"""The end-to-end part's knowledge base, carried as inputs the GPU machine can ingest.

The documents are the cost run's whose questions the part replays (`thinkserve_bench.target.default_documents`:
the sample report in Markdown, the generated Northwind PDF, two generated 4-page reports; 11 pages): the
questions then ask about what the knowledge base holds. The GPU machine has no MinerU, so each PDF is parsed here,
once, and zipped as the Ingest RPC reads a content list made elsewhere (`orchestrator.client.ray_ingest.pack_parse`: the
content list, its images/ and the PDF itself, from which the server renders the page images). There the real
orchestrator ingests them through its Ingest RPC: page renders, passages, graph and every embedding are made by
the GPU repository's own models, the ones that then answer.

Why not carry a knowledge base built here: its vectors would come from this machine's models, and the GPU
repository's page towers have other dimensions (the standin profile's CLIP and OpenCLIP 512, SigLIP 768 against
the tiny profile's 128, 128 and 96): page retrieval would fail, and only the text embedder (MiniLM's 384) would
match. Ingesting there costs seconds of GPU time and keeps every vector consistent with the models queried.

    .venv/bin/python -m thinkserve_bench.gpu.corpus OUTPUT      # pack.py makes it as <pack>/corpus
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parents[3]
MANIFEST = "corpus.json"
ZIP_MEDIA_TYPE = "application/zip"  # how `thinkserve ingest --ray` sends a parsed PDF under its own name
# What the corpus is made from: a change to any of these makes it again
SOURCES = (Path(__file__), ROOT / "benchmarks/thinkserve_bench/target.py", ROOT / "benchmarks/thinkserve_bench/corpora/pdf_factory.py",
           ROOT / "benchmarks/thinkserve_bench/corpora/quality_corpus.py", ROOT / "samples/northwind-2024-annual-report.md")

Log = Callable[[str], None]


def fingerprint() -> str:
    digest = hashlib.sha256()
    for path in SOURCES:
        digest.update(path.read_bytes() if path.is_file() else b"missing")
    try:
        import importlib.metadata

        digest.update(importlib.metadata.version("mineru").encode())
    except Exception:  # noqa: BLE001 - no MinerU: make_corpus says so when it runs
        pass
    return digest.hexdigest()[:16]


def make_corpus(folder: Path, force: bool = False, log: Log = print) -> dict:
    """The corpus in `folder` (made again only when its sources changed); returns its manifest."""
    manifest_path = folder / MANIFEST
    wanted = fingerprint()
    if not force and manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("fingerprint") == wanted and all((folder / d["file"]).is_file() for d in manifest["documents"]):
            return manifest
    from orchestrator.knowledge.parsing.mineru import MineruOptions
    from orchestrator.client.ray_ingest import pack_parse
    from thinkserve_bench.target import default_documents

    started = time.perf_counter()
    final, folder = folder, folder.with_name(f"{folder.name}.{os.getpid()}.partial")  # renamed when whole
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    documents = []
    with tempfile.TemporaryDirectory(prefix="thinkserve-gpu-corpus-") as scratch:
        for path in default_documents(Path(scratch) / "documents"):
            if path.suffix.lower() == ".pdf":
                log(f"  parsing {path.name} with MinerU (the GPU machine has none)")
                data, media_type, file = pack_parse(path, MineruOptions()), ZIP_MEDIA_TYPE, path.name + ".zip"
            else:
                data, media_type, file = path.read_bytes(), "", path.name
            (folder / file).write_bytes(data)
            documents.append({"name": path.name, "file": file, "media_type": media_type, "bytes": len(data)})
    manifest = {"fingerprint": wanted, "documents": documents, "bytes": sum(d["bytes"] for d in documents),
                "seconds": round(time.perf_counter() - started, 1)}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    folder.rename(final)
    return manifest


def read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"no corpus at {folder}: make the pack (python -m thinkserve_bench.gpu.pack), which makes it")
    return json.loads(path.read_text())


async def ingest_corpus(address: str, collection: str, folder: Path, progress: Log = print) -> dict:
    """Every document of the corpus through the orchestrator's Ingest RPC, under its own name, one at a time."""
    from orchestrator.client import AsyncThinkServeClient

    manifest = read_manifest(folder)
    began = time.monotonic()
    rows = []
    async with AsyncThinkServeClient(address, timeout_s=600) as client:
        for document in manifest["documents"]:
            report = await client.ingest(collection, (folder / document["file"]).read_bytes(), document["name"],
                                         document["media_type"])
            info = report.document
            rows.append({"name": info.name, "pages": info.pages, "passages": info.passages, "chunks": info.chunks,
                         "entities": info.entities, "seconds": round(report.seconds, 2), "warnings": list(info.warnings)})
            progress(f"  ingested {info.name}: {info.pages} pages, {info.passages} passages, {report.seconds:.1f} s")
    return {"documents": rows, "pages": sum(r["pages"] for r in rows), "passages": sum(r["passages"] for r in rows),
            "seconds": round(time.monotonic() - began, 1), "corpus_bytes": manifest["bytes"]}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m thinkserve_bench.gpu.corpus", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output", type=Path, help="the corpus folder (pack.py makes <pack>/corpus)")
    parser.add_argument("--force", action="store_true", help="make it again even when its sources did not change")
    args = parser.parse_args(argv)
    manifest = make_corpus(args.output, args.force)
    print(f"{args.output}: {len(manifest['documents'])} documents, {manifest['bytes'] / 2**20:.2f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
