"""Adjacent context (AutoThinkRAG): the text blocks around a selected unit on its page, found by bbox.

A figure or table cut out of its page loses what the page says about it ("as Table 2 shows, ..."); the blocks
nearest to it on the same page, by vertical gap between their boxes, bring that back. Sources without pages
(Markdown, text) fall back to the neighbouring blocks in reading order.
"""

from __future__ import annotations

from typing import Sequence

from ..knowledge.parsing.documents import NO_PAGE, TEXT_TYPES, Block

MAX_CONTEXT_CHARS = 600


def vertical_gap(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> int:
    """Distance between two boxes along the page's vertical axis (0 when they overlap vertically)."""
    return max(0, max(a[1], b[1]) - min(a[3], b[3]))


def adjacent_blocks(blocks: Sequence[Block], index: int, per_side: int, exclude: frozenset[int] = frozenset()) -> list[int]:
    """Indices of up to `per_side` text blocks above and below block `index`, in reading order."""
    if per_side <= 0 or not 0 <= index < len(blocks):
        return []
    anchor = blocks[index]
    candidates = [
        i for i, block in enumerate(blocks)
        if i != index and i not in exclude and block.type in TEXT_TYPES and block.content.strip()
        and (anchor.page == NO_PAGE or block.page == anchor.page)
    ]
    if anchor.page == NO_PAGE or not any(anchor.bbox):
        before = [i for i in candidates if i < index][-per_side:]
        after = [i for i in candidates if i > index][:per_side]
        return before + after
    above = [i for i in candidates if blocks[i].bbox[3] <= anchor.bbox[1] or (i < index and blocks[i].bbox[1] < anchor.bbox[1])]
    below = [i for i in candidates if i not in above]

    def nearest(side: list[int]) -> list[int]:
        return sorted(side, key=lambda i: (vertical_gap(blocks[i].bbox, anchor.bbox), abs(i - index)))[:per_side]

    return sorted(nearest(above) + nearest(below))


def context_texts(blocks: Sequence[Block], indices: Sequence[int]) -> tuple[str, ...]:
    return tuple(_trim(blocks[i].content) for i in indices)


def _trim(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_CONTEXT_CHARS else text[: MAX_CONTEXT_CHARS - 1].rstrip() + "…"
