"""Token chunks (what the extractor reads): sizes and overlap in the embedder's tokens, exact page/bbox spans,
text cut from the source."""

import pytest

from orchestrator.knowledge.parsing.chunking import chunk_blocks
from orchestrator.models.tokens import PlainTokenizer
from orchestrator.knowledge.parsing.documents import Block
from orchestrator.knowledge.parsing.text_source import decode_text, parse_text
from orchestrator.errors import InvalidRequestError
from tests.conftest import MODEL_REPOSITORY

TOKENIZER_FILE = MODEL_REPOSITORY / "text_embedder_tokenize" / "1" / "tokenizer.json"
pytestmark = pytest.mark.skipif(not TOKENIZER_FILE.exists(), reason="run `make models` first")


@pytest.fixture(scope="module")
def tokenizer():
    return PlainTokenizer(TOKENIZER_FILE, "ingest.tokenizer")


def numbered_blocks(pages=3, per_page=4, words=30):
    blocks = [Block("title", "Annual Report", page=0, bbox=(100, 50, 900, 80), level=1)]
    for page in range(pages):
        for n in range(per_page):
            text = " ".join(f"p{page}b{n}w{i}" for i in range(words))
            blocks.append(Block("text", text, page=page, bbox=(100, 100 + 200 * n, 900, 280 + 200 * n)))
    blocks.append(Block("image", "", page=1, bbox=(0, 0, 10, 10), caption="Figure 1"))
    return blocks


def test_windows_respect_size_and_overlap_and_never_split_words(tokenizer):
    blocks = numbered_blocks()
    chunks = chunk_blocks(blocks, tokenizer, size=120, overlap=20)
    assert len(chunks) > 3
    for chunk in chunks:
        assert chunk.tokens <= 120
        assert tokenizer.count(chunk.text) <= 120 + 2 * len(chunk.spans)  # block separators add no words
        for word in chunk.text.split():
            assert word == "Annual" or word == "Report" or word.startswith("p"), word
    for first, second in zip(chunks, chunks[1:]):
        tail = first.text.split()[-3:]
        assert second.text.split()[:3] != first.text.split()[:3]
        assert set(tail) <= set(second.text.split()), "consecutive chunks overlap"


def test_chunks_know_their_pages_and_bboxes(tokenizer):
    blocks = numbered_blocks(pages=3, per_page=2, words=10)
    (chunk,) = chunk_blocks(blocks, tokenizer, size=1200, overlap=100)
    assert [span.block for span in chunk.spans] == [0, 1, 2, 3, 4, 5, 6]  # the image (block 7) is not text
    assert [span.page for span in chunk.spans] == [0, 0, 0, 1, 1, 2, 2]
    assert all(span.bbox == blocks[span.block].bbox for span in chunk.spans)
    assert chunk.section == "Annual Report"
    assert chunk.text.split("\n\n") == [b.content for b in blocks[:7]]

    long_chunks = chunk_blocks(numbered_blocks(), tokenizer, size=1200, overlap=100)
    assert len(long_chunks) == 2
    assert long_chunks[0].spans[0].page == 0 and long_chunks[-1].spans[-1].page == 2


def test_sections_follow_markdown_headings(tokenizer):
    parsed = parse_text("# Report\n\nIntro text.\n\n## Revenue\n\nRevenue grew 12%.\n\n- a\n- b\n", markdown=True)
    assert [b.type for b in parsed.blocks] == ["title", "text", "title", "text", "list"]
    assert [b.level for b in parsed.blocks if b.type == "title"] == [1, 2]
    chunks = chunk_blocks(parsed.blocks, tokenizer, size=4, overlap=1)
    by_text = {c.text: c.section for c in chunks}
    assert [section for text, section in by_text.items() if "12%" in text] == ["Report > Revenue"]
    assert all(span.page == -1 for c in chunks for span in c.spans)


def test_non_utf8_text_is_refused_with_the_offset():
    with pytest.raises(InvalidRequestError, match="not UTF-8 text .*0xff at offset 6"):
        decode_text(b"hello \xff world", "notes.txt")
    assert decode_text("\ufeffbom".encode("utf-8"), "x.txt") == "bom"


def test_a_half_full_window_ends_before_a_heading(tokenizer):
    words = " ".join(f"word{i}" for i in range(40))
    parsed = parse_text(f"# One\n\n{words}\n\n# Two\n\n{words}\n\n{words}", markdown=True)
    chunks = chunk_blocks(parsed.blocks, tokenizer, size=150, overlap=20)
    assert chunks[0].section == "One" and chunks[1].section == "Two"
    assert chunks[1].text.startswith("Two\n\n")  # no overlap carried across the section break
    assert "Two" not in chunks[0].text.split()
