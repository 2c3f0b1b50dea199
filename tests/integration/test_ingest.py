"""Ingest through the real orchestrator and Triton: MinerU on generated PDFs, content lists made elsewhere,
replace and delete without orphans, the graph's exact contents, and bad documents refused one by one."""

from __future__ import annotations

import asyncio
import collections
import io
import json
import re
import time
import zipfile

import grpc
import numpy as np
import pytest

from orchestrator.client import ThinkServeClient
from orchestrator.client.ingest_batch import ingest_paths
from orchestrator.knowledge.graph.graph import BELONGS_TO
from orchestrator.knowledge.storage.manifest import MANIFEST
from orchestrator.knowledge.storage.registry import KnowledgeBase
from thinkserve_bench.corpora import pdf_factory, slide_decks
from tests.integration.conftest import event_of
from tests.integration.test_models import call, png

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(running_orchestrator):
    with ThinkServeClient(running_orchestrator.address, timeout_s=300) as client:
        yield client


def stored(running_orchestrator, collection: str):
    """The collection as the server committed it, read from disk by a separate read-only reader."""
    return KnowledgeBase(running_orchestrator.data_dir, read_only=True).collection(collection).snapshot


@pytest.fixture(scope="module")
def report_pdf(tmp_path_factory):
    return pdf_factory.write_sample_report(tmp_path_factory.mktemp("pdf") / "northwind-report.pdf")


def test_a_pdf_becomes_blocks_chunks_units_pages_and_vectors(client, running_orchestrator, report_pdf):
    report = client.ingest_file("pdfs", report_pdf.path)
    document = report.document
    assert not report.already_present and not report.replaced
    assert document.parser.startswith("mineru-") and document.parser.endswith("/flash")
    assert document.pages == 3 and document.units == 2 and document.chunks >= 1 and document.entities > 0
    assert {t.stage for t in report.stages} >= {"parse", "render_pages", "chunk", "extract", "embed", "commit"}

    snapshot = stored(running_orchestrator, "pdfs")
    (segment,) = snapshot.segments
    # relations are stored for the graph but not embedded: only retrieval.relation_seeds (off) reads their vectors
    assert document.relations == len(segment.relation_keys) > 0 and len(segment.relation_vectors) == 0
    assert len(segment.entity_vectors) == document.entities and snapshot.relation_keys == []
    # entities named by one evidence record only get no vector (ingest.entity_min_mentions = 2)
    named = collections.Counter(mention.key for mention in segment.entities)
    embedded = {key for key, vector in zip(segment.entity_keys, segment.entity_vectors) if np.any(vector)}
    assert embedded == {key for key in segment.entity_keys if named[key] >= 2} and len(embedded) < document.entities
    units = {e.block_type: e for e in snapshot.evidence if e.kind == "unit"}
    assert set(units) == {"table", "image"}
    table, figure = units["table"], units["image"]
    assert table.pages == (1,) and figure.pages == (2,)
    assert report_pdf.table_caption in table.text and "Revenue" in table.text and "1250" in table.text
    assert report_pdf.figure_caption in figure.text
    for unit in (table, figure):
        assert unit.asset.startswith(f"{document.document_id}/assets/")
        assert snapshot.asset_file(unit.asset) is not None  # the image is stored with the document
        (span,) = unit.spans
        assert 0 <= span.bbox[0] < span.bbox[2] <= 1000 and 0 <= span.bbox[1] < span.bbox[3] <= 1000
    passages = [e for e in snapshot.evidence if e.kind == "passage"]
    assert len(passages) == document.passages and all(len(e.pages) == 1 for e in passages)  # never across a page
    assert {e.page for e in passages} == {0, 1, 2}  # every page has text (page 2: the "Shipments" heading)
    assert any(report_pdf.sentences[0][:40] in e.text for e in passages)
    for passage in passages:
        assert all(passage.text[s.start : s.end].strip() for s in passage.spans)  # each block's place in the text
    assert [p.page for p in snapshot.pages] == [0, 1, 2]
    assert {family: index.size for family, index in snapshot.page_indexes.items()} == {"clip": 3, "siglip": 3, "openclip": 3}

    # the evidence a query returns carries page regions and the asset path, never a server path
    events = list(client.query("pdfs", "Revenue by region in thousands of euros", max_tokens=1, top_k=5))
    items = event_of(events, "evidence").items
    table_item = next(item for item in items if item.block_type == "table")
    assert [r.page for r in table_item.regions] == [1] and len(table_item.regions[0].bbox) == 4
    assert table_item.asset == table.asset and not table_item.asset.startswith("/")


GRAPH_TEXT = """# Partners

Acme Corporation signed a supply contract with Globex Industries in March.

Globex Industries opened a plant in Springfield.
"""


def content_list_archive(caption: str) -> bytes:
    """A MinerU V1 output folder, zipped as the CLI sends it: a table with a caption and its image."""
    items = [
        {"type": "text", "text": "Quarterly Review", "text_level": 1, "bbox": [100, 60, 900, 90], "page_idx": 0},
        {"type": "text", "text": "Sales grew in every region.", "bbox": [100, 100, 900, 140], "page_idx": 0},
        {
            "type": "table",
            "img_path": "images/table.png",
            "table_caption": [caption],
            "table_body": "<table><tr><td>Region</td><td>Sales</td></tr><tr><td>North</td><td>12</td></tr></table>",
            "table_footnote": [],
            "bbox": [120, 200, 880, 400],
            "page_idx": 1,
        },
    ]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("review/review_content_list.json", json.dumps(items))
        archive.writestr("review/images/table.png", png(64, 32))
    return buffer.getvalue()


def test_the_graph_holds_exactly_the_extracted_entities_and_belongs_to_edges(client, running_orchestrator):
    client.ingest("graph", GRAPH_TEXT.encode(), "partners.md")
    client.ingest("graph", content_list_archive("Table 1: Sales of Initech by region"), "review")
    snapshot = stored(running_orchestrator, "graph")
    graph = snapshot.graph
    entities = {graph.nodes.key[n] for n in range(graph.node_count) if graph.nodes.kind[n] == "entity"}
    assert {"acme corporation", "globex industries", "springfield", "initech"} <= entities
    related = {
        frozenset((graph.nodes.key[s], graph.nodes.key[d]))
        for s, d, kind in zip(graph.edges.src, graph.edges.dst, graph.edges.kind)
        if kind != BELONGS_TO
    }
    assert frozenset(("acme corporation", "globex industries")) in related
    assert frozenset(("globex industries", "springfield")) in related
    assert frozenset(("acme corporation", "springfield")) not in related  # never in the same sentence
    (unit,) = [e for e in snapshot.evidence if e.kind == "unit"]
    belongs = {
        graph.nodes.key[s] for s, d, kind in zip(graph.edges.src, graph.edges.dst, graph.edges.kind)
        if kind == BELONGS_TO and graph.nodes.key[d] == unit.evidence_id
    }
    assert "initech" in belongs
    assert unit.pages == (1,) and unit.spans[0].bbox == (120, 200, 880, 400)
    assert unit.text.startswith("Table: Table 1: Sales of Initech by region") and "North | 12" in unit.text


def test_replace_and_delete_leave_no_orphans(client, running_orchestrator):
    collection = "lifecycle"
    client.ingest(collection, b"# Shared\n\nAcme Corporation works with Umbrella Group.", "keep.md")
    first = client.ingest(collection, b"# Old\n\nAcme Corporation bought Hooli Systems.", "notes.md")
    second = client.ingest(collection, b"# New\n\nAcme Corporation sold Pied Piper.", "notes.md")
    assert second.replaced and not first.replaced and second.document_id != first.document_id
    snapshot = stored(running_orchestrator, collection)
    assert list(snapshot.documents) == ["keep.md", "notes.md"]
    assert "hooli systems" not in snapshot.entity_keys and "pied piper" in snapshot.entity_keys
    assert not any("Hooli" in e.text for e in snapshot.evidence)

    removed = client.delete_document(collection, "notes.md")
    assert removed.document_id == second.document_id
    snapshot = stored(running_orchestrator, collection)
    assert list(snapshot.documents) == ["keep.md"]
    assert {"acme corporation", "umbrella group"} <= set(snapshot.entity_keys)
    assert not {"pied piper", "hooli systems"} & set(snapshot.entity_keys)
    graph = snapshot.graph
    acme = graph.node("acme corporation")
    assert graph.nodes.documents[acme] == (snapshot.documents["keep.md"].document_id,)  # shared entity: one mention left
    assert snapshot.evidence_index.size == len(snapshot.evidence) == snapshot.documents["keep.md"].chunks
    root = running_orchestrator.data_dir / "collections" / collection
    assert sorted(p.name for p in root.iterdir()) == sorted([MANIFEST, snapshot.segments[0].folder.name])
    assert [d.name for d in client.list_documents(collection)] == ["keep.md"]
    with pytest.raises(grpc.RpcError) as missing:
        client.delete_document(collection, "notes.md")
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


def test_progress_counts_the_pages_of_a_mineru_folder_and_a_pdf(running_orchestrator, tmp_path, capsys):
    """The CLI's bar counts pages (a MinerU output folder's seven, not one), shows OCR's pages and pages/s, and ends
    at the pages the server counted; the server's report carries the same figures for its busy period."""
    folder = tmp_path / "batch"
    (folder / "minutes").mkdir(parents=True)
    items = [{"type": "text", "text": f"Minute {n}: the board approved budget line {n}.", "page_idx": n, "bbox": [100, 100, 900, 200]}
             for n in range(7)]
    (folder / "minutes" / "minutes_content_list.json").write_text(json.dumps(items))
    pdf_factory.write_long_pdf(folder / "long.pdf", 5)
    failures = asyncio.run(ingest_paths(running_orchestrator.address, "progress", [folder], concurrency=2))
    captured = capsys.readouterr()
    assert failures == 0, captured.out
    assert re.search(r"\b12/12 \[.*page/s, ocr=0 docs=2/2 failed=0", captured.err.replace("\r", "\n")), captured.err
    assert "2 documents ingested into progress: 12 pages (0 read by OCR) in " in captured.out
    assert re.search(r"minutes: added, 7 pages, .* \(\d+\.\d\d pages/s\)", captured.out), captured.out

    with ThinkServeClient(running_orchestrator.address, timeout_s=300) as client:
        report = client.ingest_file("progress-report", folder / "long.pdf")
    assert report.pages_per_s == pytest.approx(5 / report.seconds, rel=1e-6)
    progress = report.progress
    assert progress.pages_done >= 5 and progress.pages_total >= progress.pages_done and progress.documents_done >= 1
    assert progress.pages_per_s > 0 and progress.seconds > 0


def test_the_cli_shows_the_servers_progress_while_a_deck_without_a_text_layer_ingests(running_orchestrator, tmp_path, capsys):
    """Issue 55: the bar moves by the pages the server has read (GetIngestProgress) while the document ingests, not
    only when it is done, with its stage and OCR's pages; the deck's missing text layer is told as it is found,
    before its report."""
    folder = tmp_path / "decks"
    folder.mkdir()
    deck = slide_decks.write_deck(folder / "transit-deck.pdf", image_only=True)
    failures = asyncio.run(ingest_paths(running_orchestrator.address, "live-progress", [deck.path], concurrency=1))
    captured = capsys.readouterr()
    assert failures == 0, captured.out
    pages = len(slide_decks.SLIDES)
    warning = f"transit-deck.pdf: warning: {pages} pages of {pages} have no text layer: OCR reads them"
    lines = captured.out.splitlines()
    assert lines.index(warning) < next(i for i, line in enumerate(lines) if line.startswith("transit-deck.pdf: added")), lines
    states = captured.err.replace("\r", "\n").splitlines()
    partial = {int(m.group(1)) for m in (re.search(rf"\b(\d+)/{pages} \[.*\((?:parse|ocr): ", s) for s in states) if m}
    assert any(0 < n < pages for n in partial), captured.err  # the bar moved before the document was done
    assert any(re.search(rf"ocr \d+/{pages}\)", s) for s in states), captured.err


def test_bad_documents_fail_alone_with_their_cause(running_orchestrator, tmp_path, capsys):
    folder = tmp_path / "batch"
    folder.mkdir()
    (folder / "good.md").write_text("# Good\n\nThe warehouse in Leeds ships on Mondays.")
    pdf_factory.write_corrupt_pdf(folder / "corrupt.pdf")
    pdf_factory.write_encrypted_pdf(folder / "locked.pdf")
    pdf_factory.write_empty_pdf(folder / "empty.pdf")
    pdf_factory.write_long_pdf(folder / "huge.pdf", 2000)
    (folder / "latin1.txt").write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    escape = folder / "escape"
    escape.mkdir()
    (escape / "escape_content_list.json").write_text(
        json.dumps([{"type": "image", "img_path": "../../secret.png", "image_caption": ["x"], "page_idx": 0, "bbox": [0, 0, 1, 1]}])
    )
    failures = asyncio.run(ingest_paths(running_orchestrator.address, "batch", [folder], concurrency=2))
    out = capsys.readouterr().out
    assert failures == 6, out
    expected = {
        "corrupt.pdf": "corrupt or not a PDF",
        "locked.pdf": "encrypted: needs a password",
        "empty.pdf": "has no pages",
        "huge.pdf": "has 2000 pages; the limit is ingest.max_pages = 1000",
        "latin1.txt": "not UTF-8 text",
        "escape": "../../secret.png",
    }
    for name, reason in expected.items():
        line = next(line for line in out.splitlines() if line.startswith(f"FAILED {name}:"))
        assert "INVALID_ARGUMENT" in line and reason in line, line
    assert "good.md: added" in out
    with ThinkServeClient(running_orchestrator.address) as client:
        assert [d.name for d in client.list_documents("batch")] == ["good.md"]
    root = running_orchestrator.data_dir / "collections" / "batch"
    assert len([p for p in root.iterdir() if p.is_dir()]) == 1  # no staging folder of a failed document is left


def test_a_parse_over_its_memory_limit_fails_alone_with_resource_exhausted(triton, triton_settings, tmp_path, capsys):
    from orchestrator.server.deployment import Deployment
    from tests.conftest import settings_with
    from tests.integration.conftest import BackgroundLoop

    # a limit below what any MinerU parse needs (about 300 MiB here): the PDF cannot be parsed within it
    settings = settings_with(triton_settings.model_copy(update={"url": triton.endpoints.grpc}), tmp_path / "data",
                             ingest={"parser_memory_mb": 200})
    folder, source = tmp_path / "batch", tmp_path / "source"
    folder.mkdir()
    source.mkdir()
    (folder / "report.pdf").write_bytes(pdf_factory.write_sample_report(source / "report.pdf").path.read_bytes())
    (folder / "notes.md").write_text("# Notes\n\nThe warehouse in Leeds ships on Mondays.")
    loop = BackgroundLoop()
    deployment = Deployment(settings)
    address = loop.run(deployment.start(progress=lambda _: None))
    try:
        failures = asyncio.run(ingest_paths(address, "limited", [folder], concurrency=2))
        out = capsys.readouterr().out
        assert failures == 1, out
        line = next(line for line in out.splitlines() if line.startswith("FAILED report.pdf:"))
        assert "RESOURCE_EXHAUSTED" in line and "report.pdf" in line and "memory limit of 200 MiB" in line, line
        with ThinkServeClient(address) as client:
            assert client.health().serving  # the server and Triton were never at risk
            assert [d.name for d in client.list_documents("limited")] == ["notes.md"]  # the rest of the batch
    finally:
        loop.run(deployment.stop())
        loop.close()


def test_llm_extraction_and_vlm_descriptions_go_through_triton(triton, tmp_path, report_pdf):
    """The model paths the tiny profile does not use by default (its LLM and VLM have random weights): every
    chunk and unit goes to the LLM for extraction, every unit with an image to the VLM; the random output is
    parsed without failing the document."""
    from orchestrator.config import IngestSettings
    from orchestrator.knowledge.ingest import Ingestor
    from tests.conftest import MODEL_REPOSITORY

    settings = IngestSettings(extractor="llm", describer="vlm", extraction_max_tokens=24, description_max_tokens=12)
    tokenizer = MODEL_REPOSITORY / "text_embedder_tokenize" / "1" / "tokenizer.json"

    def successes(statistics):
        return int(statistics["model_stats"][0].get("inference_stats", {}).get("success", {}).get("count", 0))

    async def work(models):
        before = {m: successes(await models.client.model_statistics(m)) for m in ("llm", "vlm")}
        ingestor = Ingestor(KnowledgeBase(tmp_path), models, settings, tokenizer)
        result = await ingestor.ingest("models", report_pdf.path.name, report_pdf.path.read_bytes())
        after = {m: successes(await models.client.model_statistics(m)) for m in ("llm", "vlm")}
        return result, before, after

    result, before, after = call(triton, work)
    document = result.document
    assert document.units == 2 and not result.already_present
    assert after["vlm"] - before["vlm"] == 2  # the table and the figure, each with its image
    assert after["llm"] - before["llm"] == document.chunks + document.units  # one extraction per evidence record
    snapshot = KnowledgeBase(tmp_path, read_only=True).collection("models").snapshot
    table = next(e for e in snapshot.evidence if e.block_type == "table")
    assert table.text.startswith("Table: " + report_pdf.table_caption)  # caption first, then the VLM's words


def test_relations_are_embedded_when_relation_seeds_reads_them(triton, tmp_path, report_pdf):
    from orchestrator.config import IngestSettings
    from orchestrator.knowledge.ingest import Ingestor
    from tests.conftest import MODEL_REPOSITORY

    tokenizer = MODEL_REPOSITORY / "text_embedder_tokenize" / "1" / "tokenizer.json"

    async def work(models):
        ingestor = Ingestor(KnowledgeBase(tmp_path), models, IngestSettings(), tokenizer, embed_relations=True)
        return await ingestor.ingest("relations", report_pdf.path.name, report_pdf.path.read_bytes())

    document = call(triton, work).document
    snapshot = KnowledgeBase(tmp_path, read_only=True).collection("relations").snapshot
    (segment,) = snapshot.segments
    assert document.relations == len(segment.relation_keys) == len(segment.relation_vectors) > 0
    assert snapshot.relation_keys == segment.relation_keys and snapshot.relation_index.size == document.relations
    assert np.allclose(np.linalg.norm(segment.relation_vectors, axis=1), 1.0, atol=1e-3)  # real embeddings


def test_a_content_list_with_its_original_takes_pages_and_page_images_from_it(client, running_orchestrator, tmp_path):
    """MinerU output folders that carry `<name>_origin.pdf` (MinerU 1.x-3.x, `ingest --ray`): the PDF gives the
    page count (blank last pages included), the page images, and to OCR the pages the content list says nothing
    of; an original that does not fit is not used."""
    origin = pdf_factory.write_long_pdf(tmp_path / "long.pdf", 3).read_bytes()
    items = [{"type": "text", "text": "Section 1 of the long document.", "bbox": [100, 100, 900, 140], "page_idx": 0}]

    def archive(items, origin_bytes) -> bytes:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as bundle:
            bundle.writestr("long/long_content_list.json", json.dumps(items))
            bundle.writestr("long/long_origin.pdf", origin_bytes)
            bundle.writestr("long/long_layout.pdf", b"%PDF- MinerU's debug render, never read")
        return buffer.getvalue()

    report = client.ingest("origins", archive(items, origin), "long")
    assert report.document.pages == 3
    # the content list says nothing of the original's last two pages: OCR reads them from the original
    assert list(report.document.warnings) == [] and report.document.ocr_pages == 2
    assert any("Section 3" in b.content and b.ocr_confidence for b in stored(running_orchestrator, "origins").segments[0].blocks)
    snapshot = stored(running_orchestrator, "origins")
    assert [p.page for p in snapshot.pages] == [0, 1, 2]
    assert {family: index.size for family, index in snapshot.page_indexes.items()} == {"clip": 3, "siglip": 3, "openclip": 3}

    beyond = items + [{"type": "text", "text": "A page the original lacks.", "bbox": [100, 100, 900, 140], "page_idx": 4}]
    report = client.ingest("origins", archive(beyond, origin), "beyond")
    assert report.document.pages == 5
    assert any("items on page 5 but long_origin.pdf has 3: no page images" in w for w in report.document.warnings)
    snapshot = stored(running_orchestrator, "origins")
    assert not [p for p in snapshot.pages if p.document_id == report.document.document_id]

    huge = pdf_factory.write_long_pdf(tmp_path / "huge.pdf", 2000).read_bytes()
    with pytest.raises(grpc.RpcError) as refused:
        client.ingest("origins", archive(items, huge), "huge")
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'huge' has 2000 pages; the limit is ingest.max_pages = 1000" in refused.value.details()


def test_an_ingest_can_return_once_durable_and_the_document_becomes_visible(running_orchestrator):
    with ThinkServeClient(running_orchestrator.address) as client:
        waited = client.ingest("durable", b"# Depot\n\nThe Oslo depot opens at six.", "depot.md")
        assert waited.visible and "publish" in {s.stage for s in waited.stages}  # read-your-writes by default
        report = client.ingest("durable", b"# Depot\n\nThe Oslo depot opens at seven.", "depot.md", return_when_durable=True)
        assert report.replaced and "publish" not in {s.stage for s in report.stages}
        deadline = time.monotonic() + 30
        while [d.document_id for d in client.list_documents("durable")] != [report.document_id]:
            assert time.monotonic() < deadline, "the durable commit never became visible"
            time.sleep(0.05)
        client.delete_collection("durable")
