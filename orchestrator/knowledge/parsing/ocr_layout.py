"""Recognised text lines -> blocks in reading order: what OCR gives a page in place of a parser's layout.

The `ocr` model returns lines (text, corners, confidence). Here they become what a parser would have made of the
page: boxes on one row joined (the detector splits a line at wide spaces), rows stacked with the spacing of their
own height and sharing a left edge or most of their width joined into paragraphs, a short paragraph of rows much
taller than the page's body text a title, and every block put in reading order by an XY-cut (the page cut along
its widest empty band, across or down, again and again), so two columns are read one after the other.

A slide (documents.SLIDE_ASPECT) has one title: its first paragraph in reading order that reads as one, whatever
its height. On the dev set's five image-only decks slide titles were as tall as their text, so the height rule
marked none of them and took big figures ("86,2%", a logo's "O") for titles, and every slide was filed under the
last of those. Lines repeated at one place on most pages (a logo, a footer, "Slide 12") are running heads: dropped,
as the parser drops a text layer's (`without_running_heads`), so a logo above the title does not take its place.

Distances are measured in units of the page's height on both axes (the 0-1000 page scale stretches x by the
page's aspect ratio), so one rule serves portrait pages, slides and figure crops.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np

from .documents import BBOX_SCALE, SLIDE_ASPECT, Block

# Boxes on one row: overlapping vertically by half the smaller height, at most this many heights apart.
ROW_GAP = 1.5
# Rows of one paragraph: at most this many (mean) heights apart vertically, heights within this ratio.
PARAGRAPH_GAP = 0.8
PARAGRAPH_HEIGHT_RATIO = 1.45
# A paragraph of at most 2 rows whose rows are this many times the page's body height is a title.
TITLE_HEIGHT_RATIO = 1.5
TITLE_MAX_CHARS = 150
# A slide's title: its first paragraph of at most this many rows, not ending as a sentence does; paragraphs before
# it that are marks are passed over: fewer than 3 letters (a logo's), below the recogniser's floor, or small print
# (rows under SLIDE_SMALL_PRINT of the body height and under SLIDE_MARK_HEIGHT of the slide's tallest words: a
# tagline above a divider's title). Either height rule alone lost titles on the dev decks: the first those of
# divider slides, whose few large words make the body height; the second those beside a big number or logo.
SLIDE_TITLE_ROWS = 3
SLIDE_SMALL_PRINT = 0.8
SLIDE_MARK_HEIGHT = 0.5
_SENTENCE_END = re.compile(r"[.,;]\s*$")
# A running head: a line whose letters (or, for a number, its place alone) recur within this distance on the
# 0-1000 scale, on at least this share of the pages read (and on 3 of them).
RUNNING_HEAD_DISTANCE = 30
RUNNING_HEAD_SHARE = 0.5


@dataclass(frozen=True)
class TextLine:
    """One recognised line on a page: its text, its box (x0, y0, x1, y1) on the 0-1000 page scale, and the
    recogniser's confidence (mean probability of its characters)."""

    text: str
    box: tuple[float, float, float, float]
    confidence: float


def page_lines(
    texts: Sequence[str], boxes: np.ndarray, confidence: np.ndarray,
    region: tuple[int, int, int, int] = (0, 0, BBOX_SCALE, BBOX_SCALE),
) -> list[TextLine]:
    """The `ocr` model's lines of an image placed on the page: `boxes` [n, 4, 2] are corners as fractions of the
    image, which covers `region` (x0, y0, x1, y1 on the 0-1000 page scale: the whole page, or a figure's box)."""
    x0, y0, x1, y1 = region
    lines = []
    for text, corners, score in zip(texts, np.asarray(boxes, dtype=np.float64).reshape(-1, 4, 2), confidence):
        if not text.strip():
            continue
        xs, ys = corners[:, 0], corners[:, 1]
        lines.append(TextLine(
            text.strip(),
            (x0 + xs.min() * (x1 - x0), y0 + ys.min() * (y1 - y0), x0 + xs.max() * (x1 - x0), y0 + ys.max() * (y1 - y0)),
            float(score),
        ))
    return lines


@dataclass
class _Row:
    text: str
    box: list[float]  # x0, y0, x1, y1 in page-height units (x stretched by the aspect ratio)
    confidence: float

    @property
    def height(self) -> float:
        return max(self.box[3] - self.box[1], 1e-6)

    @property
    def width(self) -> float:
        return max(self.box[2] - self.box[0], 1e-6)


def paragraphs(
    lines: Sequence[TextLine], page: int, aspect: float, min_confidence: float, block_type: str = "text"
) -> list[Block]:
    """The lines of one page (or of one region of it) as text and title blocks in reading order. `aspect` is the
    page's width / height; lines below `min_confidence` form blocks of their own (marked by their confidence)."""
    if not lines:
        return []
    rows = _rows([
        _Row(line.text, [line.box[0] * aspect / BBOX_SCALE, line.box[1] / BBOX_SCALE,
                         line.box[2] * aspect / BBOX_SCALE, line.box[3] / BBOX_SCALE], line.confidence)
        for line in lines
    ], min_confidence)
    body = _body_height(rows)
    groups = _paragraphs(rows, min_confidence)
    slide = block_type == "text" and aspect >= SLIDE_ASPECT
    blocks = []
    for group in groups:
        x0 = min(r.box[0] for r in group) / aspect * BBOX_SCALE
        x1 = max(r.box[2] for r in group) / aspect * BBOX_SCALE
        y0 = min(r.box[1] for r in group) * BBOX_SCALE
        y1 = max(r.box[3] for r in group) * BBOX_SCALE
        text = _joined([r.text for r in group])
        height = statistics.median(r.height for r in group)
        is_title = (
            not slide and block_type == "text" and len(group) <= 2 and len(text) <= TITLE_MAX_CHARS
            and height >= TITLE_HEIGHT_RATIO * body
        )
        blocks.append(Block(
            type="title" if is_title else block_type,
            content=text,
            page=page,
            bbox=_scaled((x0, y0, x1, y1)),
            level=1 if is_title else 0,
            ocr_confidence=round(min(r.confidence for r in group), 4),
        ))
    order = reading_order([b.bbox for b in blocks], aspect)
    if slide:
        title = _slide_title([(blocks[i], groups[i]) for i in order], body, min_confidence)
        if title is not None:
            blocks[order[title]] = replace(blocks[order[title]], type="title", level=1)
    return [blocks[i] for i in order]


def _slide_title(ordered: Sequence[tuple[Block, Sequence[_Row]]], body: float, min_confidence: float) -> int | None:
    """The position of the slide's title among its paragraphs in reading order: the first that is not a mark, if it
    reads as a title (a few rows, short, not ending as a sentence does); None when it does not."""
    worded = [
        (block, statistics.median(r.height for r in group))
        for block, group in ordered
        if sum(c.isalpha() for c in block.content) >= 3 and min(r.confidence for r in group) >= min_confidence
    ]
    tallest = max((height for _, height in worded), default=0.0)
    for position, (block, group) in enumerate(ordered):
        height = statistics.median(r.height for r in group)
        if not any(block is other for other, _ in worded) or (
            height < SLIDE_SMALL_PRINT * body and height < SLIDE_MARK_HEIGHT * tallest
        ):
            continue
        fits = len(group) <= SLIDE_TITLE_ROWS and len(block.content) <= TITLE_MAX_CHARS
        return position if fits and not _SENTENCE_END.search(block.content) else None
    return None


def without_running_heads(pages: Mapping[int, Sequence[TextLine]]) -> tuple[dict[int, list[TextLine]], int]:
    """The pages' lines less their running heads, and how many lines were dropped. A line is one when a line of the
    same letters lies at about its place on at least RUNNING_HEAD_SHARE of the pages, and on 3 or more; digits do
    not count ("Slide 12", "Page 3 of 20", a page number alone), so titles that differ by a number only ("Step 1",
    "Step 2") on most pages would be taken for one."""
    read = [page for page, lines in pages.items() if lines]
    needed = max(3, RUNNING_HEAD_SHARE * len(read))
    if len(read) < 3:
        return {page: list(lines) for page, lines in pages.items()}, 0
    cell = RUNNING_HEAD_DISTANCE
    seen: dict[tuple[str, int, int], set[int]] = defaultdict(set)  # (letters, cell of x0, cell of y0) -> pages
    keys = {}
    for page in read:
        for index, line in enumerate(pages[page]):
            key = _head_key(line.text)
            keys[page, index] = key
            seen[key, int(line.box[0] // cell), int(line.box[1] // cell)].add(page)
    kept, dropped = {}, 0
    for page, lines in pages.items():
        kept[page] = []
        for index, line in enumerate(lines):
            x, y = int(line.box[0] // cell), int(line.box[1] // cell)
            near = set().union(*(seen.get((keys[page, index], x + dx, y + dy), ()) for dx in (-1, 0, 1) for dy in (-1, 0, 1)))
            if len(near) >= needed:
                dropped += 1
            else:
                kept[page].append(line)
    return kept, dropped


def _head_key(text: str) -> str:
    letters = "".join(c for c in text.casefold() if c.isalpha())
    return letters or "#"


def _rows(boxes: list[_Row], min_confidence: float) -> list[_Row]:
    """Boxes on one row, close enough, joined left to right (the detector splits a line at wide spaces)."""
    rows: list[_Row] = []
    for box in sorted(boxes, key=lambda b: (b.box[0], b.box[1])):
        for row in rows:
            overlap = min(row.box[3], box.box[3]) - max(row.box[1], box.box[1])
            gap = box.box[0] - row.box[2]
            if (
                overlap >= 0.5 * min(row.height, box.height)
                and -0.5 * box.height <= gap <= ROW_GAP * max(row.height, box.height)
                and (row.confidence < min_confidence) == (box.confidence < min_confidence)
            ):
                row.text = f"{row.text} {box.text}"
                row.box = [min(row.box[0], box.box[0]), min(row.box[1], box.box[1]),
                           max(row.box[2], box.box[2]), max(row.box[3], box.box[3])]
                row.confidence = min(row.confidence, box.confidence)
                break
        else:
            rows.append(_Row(box.text, list(box.box), box.confidence))
    return rows


def _body_height(rows: Sequence[_Row]) -> float:
    """The height most of the page's characters are written at (median over characters)."""
    heights = np.repeat([r.height for r in rows], [max(1, len(r.text)) for r in rows])
    return float(np.median(heights))


def _paragraphs(rows: list[_Row], min_confidence: float) -> list[list[_Row]]:
    """Rows stacked closely, of one height, sharing a left edge or most of their width, as paragraphs (top to
    bottom within each)."""
    groups: list[list[_Row]] = []
    for row in sorted(rows, key=lambda r: (r.box[1], r.box[0])):
        best, best_gap = None, None
        for group in groups:
            last = group[-1]
            gap = row.box[1] - last.box[3]
            mean_height = 0.5 * (row.height + last.height)
            overlap = min(row.box[2], last.box[2]) - max(row.box[0], last.box[0])
            if not (-0.5 * mean_height <= gap <= PARAGRAPH_GAP * mean_height):
                continue
            if max(row.height, last.height) > PARAGRAPH_HEIGHT_RATIO * min(row.height, last.height):
                continue
            if overlap < 0.5 * min(row.width, last.width) and abs(row.box[0] - last.box[0]) > mean_height:
                continue
            if (row.confidence < min_confidence) != (last.confidence < min_confidence):
                continue
            if best_gap is None or gap < best_gap:
                best, best_gap = group, gap
        if best is None:
            groups.append([row])
        else:
            best.append(row)
    return groups


def _joined(rows: Sequence[str]) -> str:
    """Rows of a paragraph as one text; a word broken at a row's end by a hyphen is joined again."""
    text = ""
    for row in rows:
        if text.endswith("-") and len(text) > 1 and text[-2].isalpha() and row[:1].islower():
            text = text[:-1] + row
        else:
            text = f"{text} {row}" if text else row
    return text


def _scaled(box: tuple[float, float, float, float]) -> tuple[int, int, int, int]:
    x0, y0, x1, y1 = (int(round(min(max(v, 0.0), BBOX_SCALE))) for v in box)
    return (x0, y0, max(x1, x0), max(y1, y0))


def reading_order(boxes: Sequence[tuple[int, int, int, int]], aspect: float = 1.0) -> list[int]:
    """Indices of the boxes (0-1000 page scale) in reading order by recursive XY-cut: a set of boxes is split at
    its widest empty band, a horizontal one (top part first) or a vertical one (left part first), measured in
    page-height units; a set that no band splits is read top to bottom, left to right. Boxes of zero size (no
    known place) keep their relative order after the others."""
    placed = [i for i, b in enumerate(boxes) if b[2] > b[0] or b[3] > b[1]]
    unplaced = [i for i, b in enumerate(boxes) if not (b[2] > b[0] or b[3] > b[1])]
    scales = (aspect / BBOX_SCALE, 1.0 / BBOX_SCALE)

    def bands(indices: list[int], axis: int) -> tuple[float, list[list[int]]]:
        """The widest gap along `axis` (0: x, 1: y) and the groups it separates (all gaps that wide or wider)."""
        ordered = sorted(indices, key=lambda i: boxes[i][axis])
        groups, gaps, end = [[ordered[0]]], [], boxes[ordered[0]][axis + 2]
        for i in ordered[1:]:
            start = boxes[i][axis]
            if start > end:
                gaps.append((start - end) * scales[axis])
                groups.append([i])
            else:
                groups[-1].append(i)
            end = max(end, boxes[i][axis + 2])
        return (max(gaps) if gaps else 0.0), groups

    def cut(indices: list[int]) -> list[int]:
        if len(indices) <= 1:
            return indices
        x_gap, columns = bands(indices, 0)
        y_gap, stripes = bands(indices, 1)
        if x_gap <= 0 and y_gap <= 0:
            return sorted(indices, key=lambda i: (boxes[i][1], boxes[i][0]))
        groups = columns if x_gap > y_gap else stripes
        return [i for group in groups for i in cut(group)]

    return (cut(placed) if placed else []) + unplaced


def with_figure_text(block: Block, lines: Sequence[TextLine]) -> Block:
    """A figure or chart with the text read inside it (axis labels, legends, values, a slide's words) added to its
    content, in reading order; its confidence is that of its least certain line."""
    if not lines:
        return block
    order = reading_order([_scaled(line.box) for line in lines])
    text = " ".join(lines[i].text for i in order)
    content = f"{block.content}\n{text}".strip() if block.content.strip() else text
    lowest = min(line.confidence for line in lines)
    if block.ocr_confidence is not None:
        lowest = min(lowest, block.ocr_confidence)
    return replace(block, content=content, ocr_confidence=round(lowest, 4))


def contains(box: tuple[int, int, int, int], line: TextLine) -> bool:
    """Whether the line's centre lies inside the box."""
    cx, cy = 0.5 * (line.box[0] + line.box[2]), 0.5 * (line.box[1] + line.box[3])
    return box[0] <= cx <= box[2] and box[1] <= cy <= box[3]
