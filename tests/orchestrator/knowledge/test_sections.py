"""The heading path blocks are filed under (orchestrator.knowledge.parsing.sections): a report's sections flow on
across pages, a slide is filed under its own title only (issue 55), and passages, chunks and units all read it."""

from __future__ import annotations

import pytest

from orchestrator.knowledge.parsing.chunking import chunk_blocks
from orchestrator.knowledge.parsing.documents import Block, ParsedDocument
from orchestrator.knowledge.parsing.passages import passages_of
from orchestrator.knowledge.parsing.sections import block_sections, heading_text
from orchestrator.models.tokens import PlainTokenizer
from tests.conftest import MODEL_REPOSITORY


@pytest.fixture(scope="module")
def tokenizer() -> PlainTokenizer:
    return PlainTokenizer(MODEL_REPOSITORY / "text_embedder_tokenize" / "1" / "tokenizer.json", "ingest.tokenizer")


def _deck() -> list[Block]:
    """What a parser makes of a deck: the cover's title at level 1, the slides' titles at level 2, a divider whose
    title came out as bold text, and a slide with no title at all."""
    return [
        Block("title", "Westbrook transit plan", page=0, level=1),
        Block("text", "Prepared for the city council.", page=0),
        Block("title", "Why the plan is needed", page=1, level=2),
        Block("text", "• Traffic grew by 18 percent.", page=1),
        Block("text", "**Funding sources**", page=2),
        Block("text", "Bus ridership fell to 41,000 trips a day.", page=3),
        Block("image", "", page=3),
        Block("title", "Questions", page=4, level=2),
        Block("table", "Dates and places", page=4),
    ]


def test_a_reports_section_flows_on_across_pages():
    blocks = [
        Block("title", "Results", page=0, level=1), Block("text", "Revenue rose.", page=0),
        Block("text", "It rose again on the next page.", page=1),
        Block("title", "Regional detail", page=2, level=2), Block("text", "The north led.", page=2),
    ]
    assert block_sections(blocks) == ["Results", "Results", "Results", "Results > Regional detail", "Results > Regional detail"]


def test_a_slide_is_filed_under_its_own_title_only():
    slides = range(5)
    assert block_sections(_deck(), slides) == [
        "Westbrook transit plan", "Westbrook transit plan",
        "Why the plan is needed", "Why the plan is needed",  # not under the cover's title
        "Funding sources",  # the divider's opening line reads as its title
        "", "",  # a slide that opens with a sentence has none: not the divider's
        "Questions", "Questions",
    ]
    # the same blocks on pages that are not slides flow on, as before
    assert block_sections(_deck())[5] == "Westbrook transit plan > Why the plan is needed"


def test_a_heading_drops_the_emphasis_a_parser_wrapped_it_in():
    assert heading_text("  **Funding sources** ") == "Funding sources" and heading_text("__*A*__") == "A"
    assert heading_text("2 * 3 = 6") == "2 * 3 = 6"


def test_passages_and_chunks_are_filed_under_the_sections_given(tokenizer):
    parsed = ParsedDocument(_deck(), 5, "test", page_aspects=[16 / 9] * 5)
    assert parsed.slides() == frozenset(range(5))
    sections = block_sections(parsed.blocks, parsed.slides())
    passages = passages_of(parsed.blocks, tokenizer, 64, sections)
    assert [(p.page, p.section) for p in passages] == [
        (0, "Westbrook transit plan"), (1, "Why the plan is needed"), (2, "Funding sources"), (3, ""),
        (4, "Questions"),
    ]
    chunks = chunk_blocks(parsed.blocks, tokenizer, 12, 2, sections)
    assert {c.spans[0].page: c.section for c in chunks}[1] == "Why the plan is needed"
    portrait = ParsedDocument(_deck(), 5, "test", page_aspects=[0.77] * 5)
    assert portrait.slides() == frozenset() and passages_of(portrait.blocks, tokenizer, 64)[3].section == "Westbrook transit plan > Why the plan is needed"
