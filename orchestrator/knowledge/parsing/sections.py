"""The heading path each block is filed under: the `section` of its passage, its chunk or its unit, which the
user reads beside an evidence item and a generated answer's prompt names as the evidence's source.

Titles nest by level in reading order, and the path carries over a page break where a document flows on (a
report's section goes on for pages). A slide (documents.SLIDE_ASPECT) does not flow on: it is filed under the
headings on it only, and a slide without a title block under its opening line when that reads as a title (one
short line, not a sentence: what a parser leaves of a divider slide's title), else under none. Before, a slide
whose title the parser or OCR did not mark inherited the title of the last slide that had one (issue 55: page
13's evidence under slide 11's title, pages 29 and 30 under one).
"""

from __future__ import annotations

import re
from typing import Collection, Sequence

from .documents import TEXT_TYPES, Block

# An opening line read as a slide's title: at most this many characters, at least 3 letters, no sentence end.
OPENING_MAX_CHARS = 100
_SENTENCE_END = re.compile(r"[.,;]\s*$")
_LIST_MARK = re.compile(r"^\s*([-*•▪◦‣]|\d+[.)])\s")
_EMPHASIS = re.compile(r"^(\*\*|__|\*|_)(.+)\1$")


def block_sections(blocks: Sequence[Block], slides: Collection[int] = ()) -> list[str]:
    """The heading path in force at each block (a title's own path ends with it), " > "-joined; `slides`: the pages
    that are slides."""
    openings = _slide_openings(blocks, slides)
    sections: list[str] = []
    headings: list[str] = []
    page = None
    for index, block in enumerate(blocks):
        if block.page != page:
            page = block.page
            if page in slides:
                headings = []
        if block.type == "title" or index in openings:
            level = block.level if block.type == "title" else 1
            headings[max(0, level - 1) :] = [heading_text(block.content)]
        sections.append(" > ".join(headings))
    return sections


def heading_text(content: str) -> str:
    """A heading as a section names it: trimmed, without the emphasis a parser may wrap it in ("**Funding**")."""
    text = content.strip()
    while (match := _EMPHASIS.match(text)) is not None:
        text = match.group(2).strip()
    return text


def _slide_openings(blocks: Sequence[Block], slides: Collection[int]) -> set[int]:
    """The blocks that stand for the title of a slide that has no title block: its first text block, if it reads as a
    title."""
    titled = {block.page for block in blocks if block.type == "title"}
    openings, seen = set(), set()
    for index, block in enumerate(blocks):
        if block.page not in slides or block.page in titled or block.page in seen:
            continue
        if block.type not in TEXT_TYPES or not block.content.strip():
            continue
        seen.add(block.page)
        text = heading_text(block.content)
        if (
            block.type == "text" and "\n" not in text and len(text) <= OPENING_MAX_CHARS
            and sum(c.isalpha() for c in text) >= 3 and not _SENTENCE_END.search(text) and not _LIST_MARK.match(text)
        ):
            openings.add(index)
    return openings
