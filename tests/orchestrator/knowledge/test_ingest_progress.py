"""Ingest progress counts pages (orchestrator.knowledge.ingest_progress, orchestrator.client.ingest_batch.estimated_pages):
a MinerU output folder counts its pages, not one; done and total span a busy period; a failed document's pages
leave the total; OCR's pages count as they are read; the metrics export the same figures."""

from __future__ import annotations

import json

import pytest

from orchestrator.client.ingest_batch import estimated_pages
from orchestrator.knowledge.ingest_progress import IngestProgress
from orchestrator.observability.metrics import ServiceMetrics
from thinkserve_bench.corpora import pdf_factory


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_pages_done_of_total_ocr_pages_and_the_current_document():
    clock = Clock()
    progress = IngestProgress(clock, idle_s=10.0)
    deck, report = progress.begin("deck.pdf"), progress.begin("report.pdf")
    deck.pages(53)
    report.pages(40)
    for _ in range(3):
        deck.ocr_page()
    clock.now = 110.0
    now = progress.figures()
    assert (now.pages_done, now.pages_total, now.ocr_pages, now.documents_in_flight) == (0, 93, 3, 2)
    assert now.current_document == "report.pdf" and now.seconds == pytest.approx(10.0)
    report.done()
    deck.failed()  # its pages leave the total; the pages OCR read stay counted
    clock.now = 120.0
    now = progress.figures()
    assert (now.pages_done, now.pages_total, now.ocr_pages, now.documents_done, now.documents_failed) == (40, 40, 3, 1, 1)
    # 40 pages in the 10 s it was busy: the idle time after the last document does not count
    assert now.current_document == "" and now.pages_per_s == pytest.approx(4.0)
    totals = progress.totals()
    assert (totals.pages, totals.ocr_pages, totals.documents, totals.documents_failed) == (40, 3, 1, 1)


def test_a_new_batch_after_an_idle_spell_starts_the_counts_again_and_a_short_gap_does_not():
    clock = Clock()
    progress = IngestProgress(clock, idle_s=10.0)
    first = progress.begin("a.md")
    first.pages(1)
    clock.now += 2.0
    first.done()
    clock.now += 1.0  # a gap shorter than idle_s: the same batch
    second = progress.begin("b.pdf")
    second.pages(4)
    assert progress.figures().pages_total == 5
    clock.now += 3.0
    second.done()
    clock.now += 60.0
    progress.begin("c.pdf").pages(7)  # after an idle minute: a new batch
    now = progress.figures()
    assert (now.pages_done, now.pages_total, now.documents_done) == (0, 7, 0)
    assert progress.totals().pages == 5  # the counters since start keep counting


def test_the_metrics_export_the_same_figures():
    clock = Clock()
    progress = IngestProgress(clock)
    metrics = ServiceMetrics()
    metrics.track_ingest(progress.figures, progress.totals)
    document = progress.begin("scan.pdf")
    document.pages(12)
    document.ocr_page()
    clock.now += 4.0
    text = metrics.exposition().decode()
    assert 'thinkserve_ingest_progress_pages{state="total"} 12.0' in text
    assert 'thinkserve_ingest_current_document{document="scan.pdf"} 1.0' in text
    assert "thinkserve_ingest_ocr_pages_total 1.0" in text
    document.done()
    text = metrics.exposition().decode()
    assert "thinkserve_ingest_pages_total 12.0" in text and 'thinkserve_ingest_documents_total{outcome="done"} 1.0' in text
    assert "thinkserve_ingest_pages_per_second 3.0" in text and "thinkserve_ingest_current_document{" not in text


def test_a_mineru_folder_counts_its_pages_and_a_pdf_its_page_tree(tmp_path):
    folder = tmp_path / "report"
    folder.mkdir()
    items = [{"type": "text", "text": f"Page {n} says something.", "page_idx": n, "bbox": [100, 100, 900, 200]} for n in range(7)]
    (folder / "report_content_list.json").write_text(json.dumps(items))
    assert estimated_pages(folder) == 7
    pdf = pdf_factory.write_long_pdf(tmp_path / "long.pdf", 5)
    assert estimated_pages(pdf) == 5
    beside = tmp_path / "with-origin"  # a folder with its PDF: the PDF's page count (a content list skips blank pages)
    beside.mkdir()
    (beside / "x_content_list.json").write_text(json.dumps(items[:2]))
    (beside / "x_origin.pdf").write_bytes(pdf.read_bytes())
    assert estimated_pages(beside) == 5
    (tmp_path / "notes.md").write_text("# Notes")
    assert estimated_pages(tmp_path / "notes.md") == 1


def test_each_document_in_flight_tells_its_stage_pages_read_and_warnings_in_its_own_collection():
    """GetIngestProgress's figures (issue 55): a deck without a text layer is read page by page by OCR while MinerU
    parses; a PDF with one has its pages read when the parse hands them over; another collection's document is not
    listed."""
    clock = Clock()
    progress = IngestProgress(clock)
    deck = progress.begin("deck.pdf", "alpha")
    report = progress.begin("report.pdf", "alpha")
    progress.begin("theirs.pdf", "beta").pages(3)
    deck.pages(31)
    deck.stage("parse")
    deck.ocr_planned(31)
    deck.warn("31 pages of 31 have no text layer: OCR reads them")
    report.pages(10)
    report.stage("parse")
    for _ in range(12):
        deck.ocr_page()
    clock.now += 6.0
    first, second = progress.documents("alpha")
    assert (first.name, first.stage, first.pages_total, first.pages_parsed, first.ocr_pages, first.pages_read) == (
        "deck.pdf", "parse", 31, 0, 12, 12)
    assert first.pages_per_s == pytest.approx(2.0) and first.warnings == ("31 pages of 31 have no text layer: OCR reads them",)
    assert (second.name, second.pages_read) == ("report.pdf", 0)  # MinerU has not handed its pages over yet
    deck.parsed(31)  # the parse ends; OCR is still reading: only its pages count
    deck.stage("ocr")
    deck.warn("31 pages of 31 have no text layer: OCR reads them", "page 4 was not parsed (a crash): OCR reads its page image")
    report.parsed(10)
    report.ocr_planned(0)
    first, second = progress.documents("alpha")
    assert (first.stage, first.pages_read, len(first.warnings)) == ("ocr", 12, 2)
    assert second.pages_read == 10
    report.done()
    assert [d.name for d in progress.documents("alpha")] == ["deck.pdf"]
    assert [d.name for d in progress.documents("beta")] == ["theirs.pdf"]


def test_the_cli_moves_its_bar_by_the_pages_read_and_prints_each_warning_once():
    from orchestrator.api.protos import pb
    from orchestrator.client.ingest_batch import LiveProgress

    live = LiveProgress()
    deck = pb.IngestingDocument(name="deck.pdf", stage="ocr", pages_total=31, pages_read=12, ocr_pages=12,
                                ocr_pages_planned=31, warnings=["31 pages of 31 have no text layer: OCR reads them"])
    other = pb.IngestingDocument(name="someone-elses.pdf", pages_total=5, pages_read=5, warnings=["not ours"])
    in_flight = {"deck.pdf": None}
    assert live.update([deck, other], in_flight) == [("deck.pdf", "31 pages of 31 have no text layer: OCR reads them")]
    assert (live.pages_read(in_flight), live.ocr_pages(in_flight)) == (12, 12)
    assert live.stage_of("deck.pdf") == " (ocr: 12/31 pages read, ocr 12/31)"
    deck.pages_read = 20
    assert live.update([deck], in_flight) == []  # told once
    assert live.pages_read(in_flight) == 20
    live.forget("deck.pdf")
    assert live.pages_read(in_flight) == 0 and live.stage_of("deck.pdf") == ""
