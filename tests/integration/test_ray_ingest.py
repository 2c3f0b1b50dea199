"""`thinkserve ingest --ray` against the real orchestrator and Triton, with MinerU on a real local Ray cluster:
the documents it stores must be the ones a plain ingest stores, and a corrupt PDF must fail alone with its cause."""

from __future__ import annotations

import asyncio
import io
import shutil
import zipfile

import pytest

pytest.importorskip("ray", reason='Ray is an optional extra: pip install "thinkserve[ray]" (make setup installs it)')

from orchestrator.client import ThinkServeClient  # noqa: E402
from orchestrator.client.ingest_batch import ingest_paths  # noqa: E402
from orchestrator.knowledge.storage.registry import KnowledgeBase  # noqa: E402
from orchestrator.knowledge.parsing.mineru import MineruOptions  # noqa: E402
from orchestrator.client.ray_ingest import RayOptions, pack_parse  # noqa: E402
from thinkserve_bench.corpora import pdf_factory  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """Two generated PDFs (one in a subfolder), a Markdown file and a corrupt PDF."""
    made = tmp_path_factory.mktemp("made")
    report = pdf_factory.write_sample_report(made / "northwind.pdf")  # also writes its chart PNG beside it
    folder = tmp_path_factory.mktemp("batch")
    (folder / "reports").mkdir()
    shutil.copyfile(report.path, folder / "reports" / "northwind.pdf")
    pdf_factory.write_long_pdf(folder / "long.pdf", 6)
    (folder / "notes.md").write_text("# Notes\n\nThe warehouse in Leeds ships to Porto on Mondays.\n")
    pdf_factory.write_corrupt_pdf(folder / "corrupt.pdf")
    return folder


def ingest(address, collection, folder, capsys, ray=None):
    failures = asyncio.run(ingest_paths(address, collection, [folder], concurrency=2, ray=ray))
    return failures, capsys.readouterr().out


def records(snapshot):
    """What must not depend on where the parse ran, per document name."""
    out = {}
    for name, d in snapshot.documents.items():
        evidence = sorted((e.kind, e.block_type, e.pages, e.text) for e in snapshot.evidence if e.document_name == name)
        pages = [p.page for p in snapshot.pages if p.document_id == d.document_id]
        out[name] = (d.pages, d.blocks, d.chunks, d.units, d.entities, d.relations, evidence, pages)
    return out


def test_ray_ingest_stores_what_a_plain_ingest_stores(running_orchestrator, batch, capsys):
    address = running_orchestrator.address
    plain_failures, plain_out = ingest(address, "plain", batch, capsys)
    ray = RayOptions(num_cpus=2)
    ray_failures, ray_out = ingest(address, "fanout", batch, capsys, ray=ray)

    assert plain_failures == ray_failures == 1, (plain_out, ray_out)
    failed = next(line for line in ray_out.splitlines() if line.startswith("FAILED "))
    assert failed.startswith("FAILED corrupt.pdf: INVALID_ARGUMENT: corrupt.pdf: PDF is corrupt or not a PDF"), failed
    assert "(MinerU on Ray node " in failed
    assert "3 documents ingested into fanout" in ray_out and "; 1 failed" in ray_out

    knowledge = KnowledgeBase(running_orchestrator.data_dir, read_only=True)
    plain, fanout = knowledge.collection("plain").snapshot, knowledge.collection("fanout").snapshot
    assert sorted(fanout.documents) == sorted(plain.documents) == ["long.pdf", "notes.md", "reports/northwind.pdf"]
    expected, got = records(plain), records(fanout)
    for name in expected:
        assert got[name] == expected[name], name
    assert fanout.documents["long.pdf"].pages == 6 and fanout.documents["reports/northwind.pdf"].units == 2
    assert {f: i.size for f, i in fanout.page_indexes.items()} == {f: i.size for f, i in plain.page_indexes.items()}
    # parsed on Ray, the PDFs reached the server as MinerU output folders; Markdown went up as itself
    assert fanout.documents["long.pdf"].media_type == "application/zip"
    assert fanout.documents["notes.md"].document_id == plain.documents["notes.md"].document_id


    # a fresh parse packs to the same bytes (the server names documents by their upload's hash), so another --ray
    # run finds the document already present instead of replacing it
    source = batch / "reports" / "northwind.pdf"
    again = pack_parse(source, MineruOptions())
    archive = zipfile.ZipFile(io.BytesIO(again))
    images = sorted(n for n in archive.namelist() if n.startswith("images/"))
    assert archive.namelist() == ["content_list.json", "document_origin.pdf", *images] and len(images) == 2
    assert archive.read("document_origin.pdf") == source.read_bytes()
    with ThinkServeClient(address) as client:
        report = client.ingest("fanout", again, "reports/northwind.pdf", "application/zip")
    assert report.already_present and report.document.name == "reports/northwind.pdf"
