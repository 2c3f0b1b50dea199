"""Passages (the retrieval units of text): within the embedder's window, never across a page, every block's
page, bbox and place in the passage text recorded."""

import pytest

from orchestrator.errors import ConfigurationError
from orchestrator.knowledge.parsing.documents import Block
from orchestrator.knowledge.parsing.passages import passages_of
from orchestrator.knowledge.parsing.text_source import parse_text
from orchestrator.models.tokens import PlainTokenizer
from tests.conftest import MODEL_REPOSITORY

TOKENIZER_FILE = MODEL_REPOSITORY / "text_embedder_tokenize" / "1" / "tokenizer.json"
pytestmark = pytest.mark.skipif(not TOKENIZER_FILE.exists(), reason="run `make models` first")


@pytest.fixture(scope="module")
def tokenizer():
    return PlainTokenizer(TOKENIZER_FILE, "ingest.tokenizer")


def test_blocks_of_a_page_are_packed_and_a_page_break_always_ends_a_passage(tokenizer):
    blocks = [
        Block("title", "Quarterly report", page=0, bbox=(100, 40, 900, 80), level=1),
        Block("text", "Revenue rose to 12 million.", page=0, bbox=(100, 100, 900, 160)),
        Block("image", "", page=0, bbox=(100, 200, 900, 500), caption="Figure 1"),
        Block("text", "Costs fell.", page=0, bbox=(100, 520, 900, 560)),
        Block("text", "Outlook is stable.", page=1, bbox=(100, 100, 900, 160)),
    ]
    first, second = passages_of(blocks, tokenizer, 64)
    assert first.text == "Quarterly report\n\nRevenue rose to 12 million.\n\nCosts fell."
    assert first.page == 0 and first.section == "Quarterly report"
    assert [(s.block, s.page, s.bbox) for s in first.spans] == [
        (0, 0, (100, 40, 900, 80)), (1, 0, (100, 100, 900, 160)), (3, 0, (100, 520, 900, 560)),
    ]
    assert [first.text[s.start : s.end] for s in first.spans] == ["Quarterly report", "Revenue rose to 12 million.", "Costs fell."]
    assert second.text == "Outlook is stable." and second.page == 1
    assert [(s.block, s.start, s.end) for s in second.spans] == [(4, 0, len("Outlook is stable."))]
    assert first.tokens == tokenizer.count("Quarterly report") + tokenizer.count("Revenue rose to 12 million.") + tokenizer.count("Costs fell.")


def test_a_long_block_is_cut_at_sentence_ends_within_the_window(tokenizer):
    sentences = [f"Sentence number {i} reports that the figure rose by {i} percent." for i in range(30)]
    block = Block("text", " ".join(sentences), page=2, bbox=(50, 50, 950, 950))
    passages = passages_of([block], tokenizer, 40)
    assert len(passages) > 5
    assert all(p.tokens <= 40 and tokenizer.count(p.text) == p.tokens for p in passages)
    assert all(p.text.endswith("percent.") for p in passages)  # every cut falls at a sentence end
    assert " ".join(p.text for p in passages) == block.content  # nothing lost, nothing repeated
    for passage in passages:
        (span,) = passage.spans
        assert (span.block, span.page, span.bbox) == (0, 2, (50, 50, 950, 950))
        assert passage.text[span.start : span.end] == passage.text


def test_a_block_that_fits_a_passage_of_its_own_is_never_cut(tokenizer):
    short = Block("text", "One two three four five.", page=0)
    paragraph = Block("text", " ".join(["Revenue grew in every region this year."] * 3), page=0)
    first, second = passages_of([short, paragraph], tokenizer, tokenizer.count(paragraph.content) + 2)
    assert first.text == short.content and second.text == paragraph.content


def test_a_sentence_longer_than_the_window_is_cut_between_words(tokenizer):
    block = Block("text", " ".join(f"alpha{i}" for i in range(200)), page=0)
    passages = passages_of([block], tokenizer, 30)
    assert all(p.tokens <= 30 for p in passages)
    assert " ".join(p.text for p in passages).split() == block.content.split()  # no word split in two


def test_a_heading_starts_a_new_passage_unless_the_current_one_is_a_stub(tokenizer):
    words = " ".join(f"word{i}" for i in range(12))  # with its heading: 25 tokens
    parsed = parse_text(f"# Revenue\n\n{words}\n\n## Costs\n\nCosts fell by 3%.\n\n# Outlook\n\nStable.", markdown=True)
    # at 120 tokens a stub is under 30: "Costs" joins the 25-token passage, "Outlook" (after 32) does not
    wide = passages_of(parsed.blocks, tokenizer, 120)
    assert [(p.section, p.tokens) for p in wide] == [("Revenue", 32), ("Outlook", 3)]
    assert wide[0].text.endswith("Costs\n\nCosts fell by 3%.") and wide[1].text == "Outlook\n\nStable."
    assert all(p.page == -1 and all(s.page == -1 for s in p.spans) for p in wide)  # Markdown has no pages
    # at 60 a stub is under 15: "Costs" starts a passage of its own, which "Outlook" (after 10) joins
    narrow = passages_of(parsed.blocks, tokenizer, 60)
    assert [(p.section, p.text.split("\n\n")[0]) for p in narrow] == [("Revenue", "Revenue"), ("Revenue > Costs", "Costs")]
    assert narrow[1].text.endswith("Outlook\n\nStable.")


def test_window_below_eight_tokens_is_refused(tokenizer):
    with pytest.raises(ConfigurationError, match="passage_tokens"):
        passages_of([Block("text", "x", page=0)], tokenizer, 4)
