"""What every parser produces: a document as an ordered list of blocks with exact provenance.

Parsers (MinerU on a PDF, a content list made elsewhere, plain text / Markdown) all end here, so chunking,
extraction, description and indexing never care where a document came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

# Block types after normalisation. MinerU's own names map onto these (see content_list.py).
TEXT_TYPES = frozenset({"text", "title", "list", "code", "footnote", "aside"})
VISUAL_TYPES = frozenset({"image", "table", "equation", "chart"})  # multimodal units: anchors in the graph
BLOCK_TYPES = TEXT_TYPES | VISUAL_TYPES

BBOX_SCALE = 1000  # bboxes are integers on a 0-1000 page scale, as MinerU writes them

NO_PAGE = -1  # page index of blocks from sources without pages (plain text, Markdown)

# A page at least this much wider than tall is a slide (16:9 is 1.78, 4:3 is 1.33): a section of its own, filed
# under its own title (sections.py), which OCR finds by its place on the page (ocr_layout). In the dev set the 6
# slide decks have only such pages, and the 30 other documents 1 of their 1,242.
SLIDE_ASPECT = 1.2


@dataclass(frozen=True)
class Block:
    """One unit of a parsed page: a paragraph, a title, a table, an image, an equation...

    `content` is the block's text: the paragraph, the table as text (HTML cells flattened), the LaTeX of an
    equation; for images it is empty and `caption` / `footnote` carry what the page says about them.
    """

    type: str  # one of BLOCK_TYPES
    content: str
    page: int = NO_PAGE  # 0-based
    bbox: tuple[int, int, int, int] = (0, 0, 0, 0)  # x0, y0, x1, y1 on the 0-1000 page scale; zeros: unknown
    asset: str = ""  # path of the block's image, relative to ParsedDocument.asset_root; "" when none
    caption: str = ""
    footnote: str = ""
    level: int = 0  # heading level for titles (1 = top), 0 otherwise
    table_html: str = ""  # the table as the parser gave it, when it is a table
    # Text read from the page's image by OCR (a page without a text layer, or a figure's words): the recogniser's
    # confidence in its least certain line; None when all of the text came from the document itself.
    ocr_confidence: Optional[float] = None

    @property
    def is_visual(self) -> bool:
        return self.type in VISUAL_TYPES


@dataclass
class ParsedDocument:
    """A parsed document before it is chunked, described and indexed."""

    blocks: list[Block]
    page_count: int  # 0 for sources without pages
    parser: str  # e.g. "mineru-4.0.12/flash", "content_list_v1", "markdown"
    asset_root: Optional[Path] = None  # folder the blocks' asset paths are relative to
    page_images: list[Path] = field(default_factory=list)  # one render per page (PNG), in page order
    warnings: list[str] = field(default_factory=list)  # things skipped or repaired, reported to the user
    unparsed_pages: list[int] = field(default_factory=list)  # pages the parser failed on or was not given (page_ranges)
    page_aspects: list[float] = field(default_factory=list)  # each page's width / height, where known (a PDF's)

    def slides(self) -> frozenset[int]:
        """The pages that are slides (SLIDE_ASPECT)."""
        return frozenset(page for page, aspect in enumerate(self.page_aspects) if aspect >= SLIDE_ASPECT)
