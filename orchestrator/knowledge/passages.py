"""Plain text and Markdown -> passages of about `target_chars`, each knowing the heading path it sits under."""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


@dataclass(frozen=True)
class Passage:
    text: str
    section: str  # "Heading > Subheading", empty before the first heading
    ordinal: int  # position within the document


def split_passages(text: str, target_chars: int) -> list[Passage]:
    """Group paragraphs into passages; never splits a paragraph unless it alone exceeds the target."""
    headings: list[str] = []
    passages: list[Passage] = []
    buffer: list[str] = []
    buffer_section = ""

    def flush() -> None:
        if buffer:
            passages.append(Passage("\n\n".join(buffer), buffer_section, len(passages)))
            buffer.clear()

    for block in re.split(r"\n\s*\n", text.replace("\r\n", "\n")):
        block = block.strip()
        if not block:
            continue
        heading = _HEADING.match(block.splitlines()[0])
        if heading:
            flush()
            level = len(heading.group(1))
            headings[level - 1 :] = [heading.group(2)]
            block = "\n".join(block.splitlines()[1:]).strip()
            if not block:
                continue
        section = " > ".join(headings)
        if buffer and (section != buffer_section or sum(map(len, buffer)) + len(block) > target_chars):
            flush()
        buffer_section = section
        for piece in _pieces(block, target_chars):
            if buffer and sum(map(len, buffer)) + len(piece) > target_chars:
                flush()
            buffer.append(piece)
    flush()
    return passages


def _pieces(block: str, target_chars: int) -> list[str]:
    """A paragraph longer than the target is cut at sentence ends (or hard, for one endless sentence)."""
    if len(block) <= target_chars:
        return [block]
    pieces, current = [], ""
    for sentence in re.split(r"(?<=[.!?])\s+", block):
        while len(sentence) > target_chars:
            pieces.append(sentence[:target_chars])
            sentence = sentence[target_chars:]
        if current and len(current) + 1 + len(sentence) > target_chars:
            pieces.append(current)
            current = sentence
        else:
            current = f"{current} {sentence}".strip()
    if current:
        pieces.append(current)
    return pieces
