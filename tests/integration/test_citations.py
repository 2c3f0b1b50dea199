"""Evidence and citations name the page a fact is printed on, over real gRPC, on a PDF MinerU parses, with the
default 1,200-token chunks: the fact sits on page 3 of a chunk that starts on page 1."""

from __future__ import annotations

import pytest

from orchestrator.client import ThinkServeClient
from orchestrator.server.deployment import Deployment
from thinkserve_bench.corpora import pdf_factory
from tests.conftest import settings_with
from tests.integration.conftest import BackgroundLoop, event_of

pytestmark = pytest.mark.integration

COLLECTION = "deep"
FACT_PAGE = 2  # 0-based


@pytest.fixture(scope="module")
def client(triton, triton_settings, tmp_path_factory):
    """An orchestrator with the default ingest settings (1,200-token chunks) on the session's Triton."""
    settings = settings_with(triton_settings.model_copy(update={"url": triton.endpoints.grpc}), tmp_path_factory.mktemp("deep"),
                             server={"port": 0})
    loop = BackgroundLoop()
    deployment = Deployment(settings)
    address = loop.run(deployment.start(progress=lambda _: None))
    with ThinkServeClient(address, timeout_s=300) as client:
        yield client
    loop.run(deployment.stop())
    loop.close()


@pytest.fixture(scope="module")
def document(client, tmp_path_factory):
    path = pdf_factory.write_long_chunk_report(tmp_path_factory.mktemp("pdf") / "operations-review.pdf", FACT_PAGE)
    return client.ingest_file(COLLECTION, path).document


def test_one_chunk_spans_the_pages_but_passages_do_not(document):
    assert document.pages == 5 and document.chunks in (1, 2)  # one chunk over every text page (and the chart's words)
    assert document.passages >= 4
    # the last page is a picture (a bar chart) without a text layer: OCR reads it, its words join the chart's unit,
    # and no page is left without text
    assert document.ocr_pages == 1 and document.ocr_lines > 0 and document.units == 1
    assert not [w for w in document.warnings if "no extractable text" in w]


def test_the_evidence_and_the_citation_name_the_page_and_block_of_the_fact(client, document):
    events = list(client.query(COLLECTION, "How much was the Halvorsen turbine contract signed for?"))
    best = event_of(events, "evidence").items[0]
    assert best.kind == "passage" and best.page == FACT_PAGE and pdf_factory.DEEP_FACT in best.text
    assert {region.page for region in best.regions} == {FACT_PAGE}
    assert "page_lexical" in best.signals.found_by and best.signals.page_lexical > 0
    final = event_of(events, "final")
    assert final.answer_source == "extractive" and pdf_factory.DEEP_FACT in final.text
    first = final.citations[0]
    assert (first.evidence_rank, first.page, first.quote) == (best.rank, FACT_PAGE, pdf_factory.DEEP_FACT)
    (region,) = first.regions
    fact_block = [r for r in best.regions if list(r.bbox) == list(region.bbox)]
    assert region.page == FACT_PAGE and len(region.bbox) == 4 and fact_block  # one of the passage's blocks: the fact's
    assert region.bbox[3] - region.bbox[1] < 60  # a one-line paragraph, not the page or the passage


def test_a_source_without_pages_is_cited_without_them(client):
    client.ingest("notes", b"# Plant notes\n\nThe boiler was replaced in May 2024 by Kettle Works.", "notes.md")
    events = list(client.query("notes", "Who replaced the boiler?"))
    (item,) = [i for i in event_of(events, "evidence").items if i.kind == "passage"]
    assert item.page == -1 and not item.regions and item.signals.page_lexical > 0  # the whole file is one "page"
    final = event_of(events, "final")
    assert "Kettle Works" in final.text and final.citations[0].page == -1 and not final.citations[0].regions
