"""Evidence from slide decks carries its own slide's title (issue 55): generated decks whose slides each have a
title of their own, one with a text layer (parsed by the real MinerU), one drawn as pictures (read by OCR through
the real Triton), ingested by the real orchestrator. Every evidence record stored, and every evidence item a
query returns, is filed under the title of the slide it is on, and under no other slide's."""

from __future__ import annotations

import pytest

from thinkserve_bench.corpora import slide_decks
from orchestrator.client import ThinkServeClient
from orchestrator.knowledge.storage.registry import KnowledgeBase
from tests.integration.conftest import event_of

pytestmark = pytest.mark.integration

QUESTIONS = [
    "What is the average household income near the corridor?",
    "How often do trains run between Diridon and Westbrook?",
    "When are the public hearings held?",
]


def _letters(text: str) -> str:
    """What OCR reliably keeps of a title: its letters and digits (it may drop the spaces between words)."""
    return "".join(c for c in text.casefold() if c.isalnum())


@pytest.fixture(scope="module")
def decks(running_orchestrator, tmp_path_factory):
    folder = tmp_path_factory.mktemp("decks")
    written = [slide_decks.write_deck(folder / "transit-plan.pdf"),
               slide_decks.write_deck(folder / "transit-plan-pictures.pdf", image_only=True)]
    with ThinkServeClient(running_orchestrator.address, timeout_s=600) as client:
        reports = {deck.path.name: client.ingest_file("decks", deck.path) for deck in written}
    return {deck.path.name: deck for deck in written}, reports


def test_the_decks_are_read_as_a_person_sees_them(decks):
    written, reports = decks
    pictures = reports["transit-plan-pictures.pdf"].document
    assert pictures.ocr_pages == len(slide_decks.SLIDES)  # no text layer: every slide read by OCR
    # the logo and the footer recur on every slide (OCR reads few of the small slide numbers): no slide's own text
    [dropped] = [w for w in pictures.warnings if "repeated at one place on most pages read by OCR" in w]
    assert int(dropped.split()[1]) >= 2 * len(slide_decks.SLIDES), dropped


def test_every_stored_evidence_record_is_filed_under_its_own_slides_title(decks, running_orchestrator):
    written, _ = decks
    segments = KnowledgeBase(running_orchestrator.data_dir, read_only=True).collection("decks").snapshot.segments
    checked = 0
    for segment in segments:
        deck = written[segment.document.name]
        for record in segment.evidence:
            assert _letters(record.section) == _letters(deck.title_of(record.page)), (segment.document.name, record.page, record.section)
            checked += 1
    assert checked >= 2 * len(slide_decks.SLIDES)  # a record or more on every slide of both decks


def test_every_evidence_item_a_query_returns_names_its_own_slide(decks, running_orchestrator):
    written, _ = decks
    items = 0
    with ThinkServeClient(running_orchestrator.address, timeout_s=300) as client:
        for question in QUESTIONS:
            evidence = event_of(list(client.query("decks", question, top_k=8)), "evidence")
            for item in evidence.items:
                deck = written[item.document_name]
                assert _letters(item.section) == _letters(deck.title_of(item.page)), (question, item.page, item.section)
                items += 1
    assert items >= 2 * len(QUESTIONS)
