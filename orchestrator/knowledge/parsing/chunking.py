"""The text stream the entity extractor reads: token windows (1,200 tokens, 100 overlap by default, the paper's)
counted with the embedder's tokenizer; a window that is at least half full ends before a heading instead of
running into the next section. Retrieval indexes passages instead (passages.py): chunks cross pages.

Every chunk remembers the blocks it spans (page + bbox each). Chunk text is cut from the original block text by
character offsets (never detokenised: the embedder's tokenizer is lower-cased), and a window never ends inside
a word.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ...errors import ConfigurationError
from ...models.tokens import PlainTokenizer
from .documents import TEXT_TYPES, Block
from .sections import block_sections


@dataclass(frozen=True)
class Span:
    """Where a piece of evidence sits: a block of the document, its page and its bbox (0-1000 scale)."""

    block: int
    page: int
    bbox: tuple[int, int, int, int]
    # the block's characters in the evidence text ([start, end)); 0, 0 where not recorded (chunks, units)
    start: int = 0
    end: int = 0
    ocr_confidence: Optional[float] = None  # the block's text was read by OCR, this confidently (Block.ocr_confidence)


@dataclass(frozen=True)
class TextChunk:
    text: str
    tokens: int
    section: str  # heading path at the chunk's start ("Results > Revenue"), "" before the first title
    spans: tuple[Span, ...]


@dataclass(frozen=True)
class _Token:
    block: int  # index into the document's blocks
    start: int  # character offsets in that block's text
    end: int
    word: int  # word number within the document: windows never split one


def chunk_blocks(
    blocks: Sequence[Block], tokenizer: PlainTokenizer, size: int, overlap: int, sections: Optional[Sequence[str]] = None
) -> list[TextChunk]:
    """Token windows over the text blocks in reading order; visual blocks belong to the multimodal stream.
    `sections`: each block's heading path (sections.block_sections; by default, with no page a slide)."""
    if overlap >= size:
        raise ConfigurationError(f"chunk overlap ({overlap}) must be smaller than the chunk size ({size})")
    sections = block_sections(blocks) if sections is None else sections
    text_blocks = [i for i, block in enumerate(blocks) if block.type in TEXT_TYPES and block.content.strip()]
    tokens: list[_Token] = []
    word_base = 0
    for index, encoding in zip(text_blocks, tokenizer.encode([blocks[i].content for i in text_blocks])):
        words = [w if w is not None else -1 for w in encoding.word_ids]
        for (start, end), word in zip(encoding.offsets, words):
            tokens.append(_Token(index, start, end, word_base + max(word, 0)))
        word_base += (max(words) + 1 if words else 0) + 1

    # Token positions where a heading starts: a window at least half full ends before one, without overlap,
    # so a chunk rarely straddles two sections and its section label holds for most of its text.
    heading_starts = [
        position for position, token in enumerate(tokens)
        if blocks[token.block].type == "title" and (position == 0 or tokens[position - 1].block != token.block)
    ]
    chunks: list[TextChunk] = []
    start = 0
    while start < len(tokens):
        end = _word_boundary(tokens, min(start + size, len(tokens)), start)
        heading = next((h for h in reversed(heading_starts) if start + size // 2 <= h < end), None) if end < len(tokens) else None
        if heading is not None:
            end = heading
        window = tokens[start:end]
        chunks.append(
            TextChunk(
                text=_text_of(blocks, window),
                tokens=len(window),
                section=sections[window[0].block],
                spans=tuple(
                    Span(i, blocks[i].page, blocks[i].bbox) for i in dict.fromkeys(token.block for token in window)
                ),
            )
        )
        if end == len(tokens):
            break
        if heading is not None:
            start = end
            continue
        start = max(_word_start(tokens, end - overlap), start + 1)
        while start < end - 1 and _is_punctuation(blocks, tokens[start]):  # "." is no way to start a chunk
            start += 1
    return chunks


def _word_boundary(tokens: Sequence[_Token], end: int, start: int) -> int:
    """Move `end` back so the window does not cut a word (unless one word fills the window)."""
    boundary = end
    while end < len(tokens) and boundary > start + 1 and tokens[boundary].word == tokens[boundary - 1].word:
        boundary -= 1
    return boundary if boundary > start + 1 or end >= len(tokens) else end


def _word_start(tokens: Sequence[_Token], position: int) -> int:
    while position > 0 and tokens[position].word == tokens[position - 1].word:
        position -= 1
    return position


def _is_punctuation(blocks: Sequence[Block], token: _Token) -> bool:
    text = blocks[token.block].content[token.start : token.end]
    return bool(text) and not any(character.isalnum() for character in text)


def _text_of(blocks: Sequence[Block], tokens: Sequence[_Token]) -> str:
    """The original text a run of tokens covers, blocks separated by blank lines."""
    pieces: list[str] = []
    for index in dict.fromkeys(token.block for token in tokens):
        covered = [token for token in tokens if token.block == index]
        pieces.append(blocks[index].content[covered[0].start : covered[-1].end])
    return "\n\n".join(pieces)
