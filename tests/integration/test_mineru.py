"""The real MinerU (flash tier, offline, no models) on a generated 3-page report, and the PDF checks before it.

No Triton needed. One subprocess parse of the report is shared by the module (~2.5 s); the in-process, image,
timeout and network-guard checks add ~6 s.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.errors import InvalidRequestError
from orchestrator.knowledge.parsing.content_list import read_content_list
from orchestrator.knowledge.parsing.documents import BBOX_SCALE, ParsedDocument
from orchestrator.knowledge.parsing.mineru import (
    CONTENT_LIST_NAME,
    MineruOptions,
    MineruParser,
    MineruTimeoutError,
)
from orchestrator.knowledge.parsing.pdf import inspect_pdf, render_pages
from thinkserve_bench.corpora.pdf_factory import (
    SampleReport,
    write_corrupt_pdf,
    write_empty_pdf,
    write_encrypted_pdf,
    write_header_line_pdf,
    write_long_pdf,
    write_sample_report,
)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> SampleReport:
    return write_sample_report(tmp_path_factory.mktemp("pdf") / "report.pdf")


@pytest.fixture(scope="module")
def parsed(report, tmp_path_factory) -> tuple[ParsedDocument, Path]:
    work_dir = tmp_path_factory.mktemp("mineru-work")
    return MineruParser().parse(report.path, work_dir), work_dir


def test_report_pages_and_provenance(parsed):
    document, work_dir = parsed
    assert document.page_count == 3
    assert document.parser.startswith("mineru-4.") and document.parser.endswith("/flash")
    assert document.asset_root == work_dir.resolve()
    assert [b.page for b in document.blocks] == sorted(b.page for b in document.blocks)
    assert {b.page for b in document.blocks} == {0, 1, 2}
    for block in document.blocks:
        x0, y0, x1, y1 = block.bbox
        assert 0 <= x0 < x1 <= BBOX_SCALE and 0 <= y0 < y1 <= BBOX_SCALE, block
    assert document.warnings == []


def test_page_one_text(parsed, report):
    document, _ = parsed
    page = [b for b in document.blocks if b.page == 0]
    assert any(b.type == "title" and b.content == report.title for b in page)
    texts = [b.content for b in page if b.type == "text"]
    for sentence in report.sentences:
        assert any(sentence in text for text in texts), sentence


def test_page_two_table(parsed, report):
    document, work_dir = parsed
    tables = [b for b in document.blocks if b.type == "table"]
    assert len(tables) == 1
    table = tables[0]
    assert table.page == 1
    assert table.content.splitlines() == [" | ".join(row) for row in report.table_rows]
    assert table.caption == report.table_caption
    assert "<td>1250</td>" in table.table_html
    assert (work_dir / table.asset).is_file()


def test_page_three_figure(parsed, report):
    document, work_dir = parsed
    figures = [b for b in document.blocks if b.type in ("image", "chart")]
    assert len(figures) == 1
    figure = figures[0]
    assert figure.page == 2
    assert figure.caption == report.figure_caption
    assert figure.asset.startswith("images/") and (work_dir / figure.asset).stat().st_size > 1000


def test_work_dir_holds_a_content_list_the_shared_reader_reads(parsed):
    document, work_dir = parsed
    again = read_content_list(work_dir / CONTENT_LIST_NAME, page_count=3)
    assert again.blocks == document.blocks
    assert again.parser == "content_list_v1"


def test_inprocess_mode_gives_the_same_blocks_and_no_telemetry_module(parsed, report, tmp_path):
    document, _ = parsed
    inprocess = MineruParser(MineruOptions(mode="inprocess")).parse(report.path, tmp_path)
    assert inprocess.blocks == document.blocks
    assert not [name for name in sys.modules if name.startswith("mineru.doclib")]


def test_image_input_becomes_one_full_page_image(report, tmp_path):
    document = MineruParser().parse(report.chart_png, tmp_path)
    assert document.page_count == 1
    assert [(b.type, b.page, b.bbox) for b in document.blocks] == [("image", 0, (0, 0, BBOX_SCALE, BBOX_SCALE))]
    assert (tmp_path / document.blocks[0].asset).is_file()


def test_timeout_kills_the_parse(report, tmp_path):
    with pytest.raises(MineruTimeoutError, match=r"report.pdf within 0.3 s \(killed\)"):
        MineruParser(MineruOptions(timeout_s=0.3)).parse(report.path, tmp_path)


def test_worker_refuses_network():
    code = (
        "from orchestrator.knowledge.parsing.mineru import _refuse_network\n"
        "_refuse_network()\n"
        "import socket\n"
        "try:\n"
        "    socket.getaddrinfo('mineru.net', 443)\n"
        "except PermissionError as error:\n"
        "    print(error)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "network access refused in the MinerU worker (lookup of 'mineru.net')" in result.stdout, result.stderr


def test_unsupported_and_broken_inputs_never_reach_mineru(tmp_path):
    parser = MineruParser()
    (tmp_path / "notes.docx").write_bytes(b"PK")
    with pytest.raises(InvalidRequestError, match=r"notes.docx: MinerU parsing takes PDF, PNG or JPEG"):
        parser.parse(tmp_path / "notes.docx", tmp_path / "w1")
    (tmp_path / "fake.png").write_bytes(b"not an image")
    with pytest.raises(InvalidRequestError, match=r"fake.png: not a readable image"):
        parser.parse(tmp_path / "fake.png", tmp_path / "w2")
    with pytest.raises(InvalidRequestError, match=r"secret.pdf: PDF is encrypted: needs a password"):
        parser.parse(write_encrypted_pdf(tmp_path / "secret.pdf"), tmp_path / "w3")


def test_inspect_pdf_names_the_cause_whatever_failed_before(tmp_path, report):
    """PDFium reports a stale error for a PDF without pages; each cause must still be named right."""
    encrypted = write_encrypted_pdf(tmp_path / "encrypted.pdf")
    empty = write_empty_pdf(tmp_path / "empty.pdf")
    corrupt = write_corrupt_pdf(tmp_path / "corrupt.pdf")
    expected = {
        encrypted: "encrypted.pdf: PDF is encrypted: needs a password",
        empty: "empty.pdf: PDF has no pages",
        corrupt: "corrupt.pdf: PDF is corrupt or not a PDF",
    }
    for path in (encrypted, empty, corrupt, empty, encrypted, empty):
        with pytest.raises(InvalidRequestError) as error:
            inspect_pdf(path)
        assert str(error.value).startswith(expected[path])
    assert inspect_pdf(report.path) == 3
    with pytest.raises(InvalidRequestError, match="missing.pdf: PDF file not found"):
        inspect_pdf(tmp_path / "missing.pdf")


def test_render_pages(tmp_path, report):
    from PIL import Image

    paths = render_pages(report.path, tmp_path / "pages", dpi=150, max_side=800)
    assert [p.name for p in paths] == ["page-0000.jpg", "page-0001.jpg", "page-0002.jpg"]
    for path in paths:
        with Image.open(path) as image:
            assert max(image.size) == 800 and image.format == "JPEG"  # A4 at 150 dpi is 1240 x 1754: capped
    small = render_pages(report.path, tmp_path / "small", dpi=36, max_side=800, jpeg_quality=None)
    with Image.open(small[0]) as image:
        assert image.size == (298, 421) and image.format == "PNG" and small[0].suffix == ".png"


def test_long_pdf_is_fast_to_write_and_inspect(tmp_path):
    path = write_long_pdf(tmp_path / "long.pdf", 2000)
    assert inspect_pdf(path) == 2000


def test_a_document_whose_only_lines_are_running_heads_keeps_them(tmp_path):
    # MinerU takes a short line near the top of every page for a page header; dropped, nothing would be left
    document = MineruParser().parse(write_header_line_pdf(tmp_path / "notes.pdf", 3), tmp_path / "work")
    assert [(b.type, b.content, b.page) for b in document.blocks] == [
        ("text", f"Short note number {n + 1}.", n) for n in range(3)]
    assert any("they are the only text of the document" in warning for warning in document.warnings)


def test_a_memory_limit_must_be_positive():
    with pytest.raises(ValueError, match="memory_limit_mb"):
        MineruOptions(memory_limit_mb=0)
    from orchestrator.config import IngestSettings
    from orchestrator.knowledge.ingest import parser_memory_limit

    assert parser_memory_limit(IngestSettings()) == 8192  # the flash tier's default
    assert parser_memory_limit(IngestSettings(parser_tier="standard")) is None  # torch and CUDA: no address-space limit
    assert parser_memory_limit(IngestSettings(parser_tier="standard", parser_memory_mb=20000)) == 20000
    assert parser_memory_limit(IngestSettings(parser_memory_mb=0)) is None
    assert parser_memory_limit(IngestSettings(parser_mode="inprocess")) is None
