"""The retrieval units of text: passages the embedder reads whole, that never cross a page.

Blocks of one page are packed in reading order into passages of at most `size` of the embedder's tokens; a
block that does not fit in what is left starts the next passage, and one longer than `size` is cut at sentence
ends (at word boundaries inside a sentence longer than `size`); a heading starts a new passage unless the
current one is a stub. Every passage knows the blocks it covers, each with its page, bbox and character range
in the passage text, so a sentence quoted from a passage is cited with the page and region it sits in.

Why not the 1,200-token chunks: a chunk crosses pages (its page was its first block's, three pages before the
sentence that matched), the embedder reads 256 tokens of it at most (its vector was a mean of five pieces),
and BM25 scores it as one long bag of words. Chunks remain the unit the entity extractor reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

from ...errors import ConfigurationError
from ...models.tokens import PlainTokenizer
from .chunking import Span
from .documents import TEXT_TYPES, Block
from .sections import block_sections

# A heading starts a new passage unless the current one holds less than this share of the window (a stub, such
# as a line above the heading), so a section's text is filed under its own heading. On the real-document
# benchmark 0, 0.25 and 0.5 ranked pages alike (within 0.01 R@1); 0 made 7% more passages.
HEADING_FILL = 0.25
_SENTENCE_END = re.compile(r"(?<=[.!?;:])[\"'”’)\]]*\s+|\n+")


@dataclass(frozen=True)
class Passage:
    text: str
    tokens: int
    section: str  # heading path in force at the passage's start
    page: int  # every span of a passage is on this page
    spans: tuple[Span, ...]  # the blocks it covers, with their character range in `text`


@dataclass(frozen=True)
class _Piece:
    block: int
    start: int  # character offsets in the block's content
    end: int
    tokens: int


def passages_of(
    blocks: Sequence[Block], tokenizer: PlainTokenizer, size: int, sections: Optional[Sequence[str]] = None
) -> list[Passage]:
    """Passages over the text blocks (visual blocks are units of their own), in reading order. `sections`: each
    block's heading path (sections.block_sections; by default, with no page a slide)."""
    if size < 8:
        raise ConfigurationError(f"ingest.passage_tokens must be at least 8, got {size}")
    sections = block_sections(blocks) if sections is None else sections
    indexes = [i for i, block in enumerate(blocks) if block.type in TEXT_TYPES and block.content.strip()]
    encodings = tokenizer.encode([blocks[i].content for i in indexes]) if indexes else []
    passages: list[Passage] = []
    current: list[_Piece] = []
    section = ""

    def flush() -> None:
        if current:
            passages.append(_passage(blocks, current, section))
            current.clear()

    for index, encoding in zip(indexes, encodings):
        block = blocks[index]
        used, tokens = sum(p.tokens for p in current), len(encoding.offsets)
        if current and (
            blocks[current[0].block].page != block.page
            or (block.type == "title" and used >= size * HEADING_FILL)
            or size - used < tokens <= size  # it fits a passage of its own: never cut it
            or (tokens > size and size - used < size // 4)  # too little room to start a long block here
        ):
            flush()
            used = 0
        pieces = _pieces(index, block.content, encoding.offsets, size - used, size)
        for number, piece in enumerate(pieces):
            if not current:
                section = sections[index]  # a passage opening with a heading is filed under it
            current.append(piece)
            if number < len(pieces) - 1:  # the rest of the block goes on in the next passage
                flush()
    flush()
    return passages


def _pieces(index: int, content: str, offsets: Sequence[tuple[int, int]], room: int, size: int) -> list[_Piece]:
    """The block cut into runs of tokens, the first at most `room`, the others at most `size`, each ending at a
    sentence end when one falls in the last three quarters of its window, else between two words."""
    if not offsets:
        return []
    # the characters where a sentence begins: a token starting at one begins a sentence
    breaks = {m.end() for m in _SENTENCE_END.finditer(content)}
    pieces: list[_Piece] = []
    start, limit = 0, max(1, room)
    while start < len(offsets):
        end = min(start + limit, len(offsets))
        if end < len(offsets):
            cut = next((k for k in range(end, start + limit // 4, -1) if _starts_after(offsets, k, breaks)), None)
            end = cut if cut is not None else _word_start(content, offsets, end, start)
        pieces.append(_Piece(index, offsets[start][0], offsets[end - 1][1], end - start))
        start, limit = end, size
    return pieces


def _starts_after(offsets: Sequence[tuple[int, int]], k: int, breaks: set[int]) -> bool:
    """Token k begins right after a sentence break."""
    return offsets[k][0] in breaks


def _word_start(content: str, offsets: Sequence[tuple[int, int]], end: int, start: int) -> int:
    """Move `end` back to the first token of the word it falls in (a word is never split across passages)."""
    k = end
    while k > start + 1 and offsets[k][0] == offsets[k - 1][1] and not content[offsets[k][0]].isspace():
        k -= 1
    return k if k > start + 1 else end


def _passage(blocks: Sequence[Block], pieces: Sequence[_Piece], section: str) -> Passage:
    texts, spans, position = [], [], 0
    for piece in pieces:
        if texts:
            position += 2  # the "\n\n" joining blocks
        text = blocks[piece.block].content[piece.start : piece.end]
        block = blocks[piece.block]
        spans.append(Span(piece.block, block.page, block.bbox, position, position + len(text), block.ocr_confidence))
        texts.append(text)
        position += len(text)
    return Passage("\n\n".join(texts), sum(p.tokens for p in pieces), section, blocks[pieces[0].block].page, tuple(spans))
