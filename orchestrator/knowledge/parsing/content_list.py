"""MinerU content lists (made by any MinerU version, here or elsewhere) -> ParsedDocument.

Users bring content lists produced by MinerU 1.x to 4.x, so every variant ends here, and MinerU parses run by
this service (mineru.py) come through the same reader:

- V1, `*_content_list.json` (MinerU 1.x-4.x): a flat list of items `{type, text | table_body | list_items |
  code_body | img_path ..., bbox, page_idx}`. MinerU 1.x spelled image captions `img_caption` / `img_footnote`.
- V2, `*_content_list_v2.json` (MinerU 2.5+): one list per page of `{type, content: {...}, bbox}` items whose
  texts are span lists (`[{type: text | equation_inline | code_inline | hyperlink, content}]`).

What is an error and what is a warning:
- the file is unusable (missing, not UTF-8, not JSON, top level not a list, V1 objects mixed with V2 pages,
  a V2 page that is not a list, or most of its items broken): InvalidRequestError naming the file and cause;
- an asset path that is absolute or leaves the content list's folder (`..`, a symlink pointing outside):
  InvalidRequestError naming the item, always, since it is an attempt to read files we must not read;
- one broken item (no `type`, `page_idx` missing or negative, bbox not four numbers, a text field that is not a
  string) while the rest is fine: the item is skipped with a warning naming its index, because one damaged
  item should not cost the user the whole document;
- a missing asset file: a warning, the block is kept with asset "".
Running heads (header, footer, page_number) are dropped, counted in one summary warning, unless they are the
document's only text (a few pages of one short line each): then the headers and footers are kept, and the
warning says so. Bboxes are clamped
into 0..1000 (a warning says how many were out of range).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Optional

from ...errors import InvalidRequestError
from .documents import BBOX_SCALE, Block, ParsedDocument

_DRIVE = re.compile(r"^[A-Za-z]:")  # "C:/..." and "C:\\..." are absolute on the machine that wrote the list
RUNNING_HEADS = frozenset({"header", "footer", "page_number", "page_header", "page_footer"})
MAX_ITEM_WARNINGS = 20  # per-item warnings kept verbatim; the rest are summarised in one line


class _ItemError(Exception):
    """One item cannot be used; it is skipped with a warning unless most items fail like it."""


@dataclass
class _Reader:
    """State of one read: where assets live, and what was skipped or repaired along the way."""

    path: Path
    root: Path
    warnings: list[str] = field(default_factory=list)
    item_problems: list[str] = field(default_factory=list)  # items skipped: they count towards "unusable"
    item_notes: list[str] = field(default_factory=list)  # items kept with something missing
    running_heads: int = 0
    # the running heads' text, in reading order: a document whose only text MinerU marked as headers or
    # footers (a page of one short line each) keeps it rather than being refused as empty
    running_head_blocks: list[Block] = field(default_factory=list)
    unknown_types: Counter[str] = field(default_factory=Counter)
    clamped: int = 0

    # -- assets ------------------------------------------------------------------------------------------
    def asset(self, where: str, raw: Any) -> str:
        """The asset path relative to the content list's folder, "" if absent; refuses paths leaving the folder."""
        if raw is None or raw == "":
            return ""
        if not isinstance(raw, str):
            raise _ItemError(f"{where}: image path is not a string")
        text = raw.strip()
        if not text:
            return ""
        if text.startswith("data:") or "://" in text:
            self.item_notes.append(f"{where}: image {text[:40]!r}... is embedded or remote, not a file; not kept")
            return ""
        posix = text.replace("\\", "/")
        if "\x00" in posix or posix.startswith("/") or _DRIVE.match(posix):
            raise InvalidRequestError(
                f"{self.path.name}: {where}: image path {raw!r} is absolute; asset paths must be relative to the "
                "content list's folder"
            )
        try:
            candidate = (self.root / PurePosixPath(posix)).resolve()
        except (OSError, RuntimeError) as error:  # a symlink loop, a name too long
            raise InvalidRequestError(
                f"{self.path.name}: {where}: image path {raw!r} cannot be resolved ({error})"
            ) from error
        if not candidate.is_relative_to(self.root):
            raise InvalidRequestError(
                f"{self.path.name}: {where}: image path {raw!r} points outside the content list's folder (refused)"
            )
        if not candidate.is_file():
            self.item_notes.append(f"{where}: image file {raw!r} is missing; block kept without its image")
            return ""
        return candidate.relative_to(self.root).as_posix()

    def set_aside(self, kind: str, text: Callable[[], str], page: int, bbox: Callable[[], tuple[int, int, int, int]]) -> None:
        """A running head: dropped, unless the document turns out to have no other text. A malformed one is
        only dropped (running heads were never checked, so they cannot make a document unusable)."""
        self.running_heads += 1
        if kind == "page_number":
            return
        try:
            content, where = text(), bbox()
        except _ItemError:
            return
        if content:
            self.running_head_blocks.append(Block("text", content, page=page, bbox=where))

    # -- geometry ----------------------------------------------------------------------------------------
    def bbox(self, where: str, raw: Any) -> tuple[int, int, int, int]:
        if raw is None:
            return (0, 0, 0, 0)
        if (
            not isinstance(raw, (list, tuple))
            or len(raw) != 4
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in raw)
        ):
            raise _ItemError(f"{where}: bbox {_short(raw)} is not four numbers")
        x0, y0, x1, y1 = (int(round(v)) for v in raw)
        if min(x0, y0, x1, y1) < 0 or max(x0, y0, x1, y1) > BBOX_SCALE:
            self.clamped += 1

        def clamp(v: int) -> int:
            return min(max(v, 0), BBOX_SCALE)

        return (clamp(min(x0, x1)), clamp(min(y0, y1)), clamp(max(x0, x1)), clamp(max(y0, y1)))

    def summary(self, parser: str) -> list[str]:
        out = _capped(self.item_problems, "more items skipped") + _capped(self.item_notes, "more items kept incomplete")
        out += self.warnings
        if self.running_heads and self.running_head_blocks:
            out.append(f"kept {len(self.running_head_blocks)} lines marked as page headers, footers or page numbers "
                       "(running heads): they are the only text of the document")
        elif self.running_heads:
            out.append(f"dropped {self.running_heads} page headers, footers and page numbers (running heads)")
        if self.unknown_types:
            kinds = ", ".join(f"{k} ({n})" for k, n in sorted(self.unknown_types.items()))
            out.append(f"skipped items of types this reader does not know: {kinds}")
        if self.clamped:
            out.append(f"{self.clamped} bboxes were outside the 0-{BBOX_SCALE} scale of {parser} and were clamped")
        return out


def read_content_list(path: Path, *, page_count: Optional[int] = None) -> ParsedDocument:
    """Read a content list of any MinerU version (detected from its shape) into blocks.

    `page_count`, when the caller knows it (the PDF it came from), raises the count derived from the items:
    a content list has no entry for blank last pages.
    """
    path = Path(path)
    data = _load_json(path)
    if not isinstance(data, list):
        raise InvalidRequestError(
            f"{path.name}: not a MinerU content list (top level is a JSON {type(data).__name__}, expected a list)"
        )
    root = path.parent.resolve()
    reader = _Reader(path, root)
    kinds = {isinstance(item, list) for item in data}
    if kinds == {True}:
        parser = "content_list_v2"
        blocks, pages = _read_v2(reader, data)
    else:
        parser = "content_list_v1"
        first_list = next((i for i, item in enumerate(data) if isinstance(item, list)), None)
        if first_list is not None:
            raise InvalidRequestError(
                f"{path.name}: item {first_list} is a list among objects; a content list is either V1 (a list of "
                "objects) or V2 (a list of pages, each a list)"
            )
        blocks, pages = _read_v1(reader, data)
    if any(block.content.strip() or block.caption or block.asset for block in blocks):
        reader.running_head_blocks = []  # the document has content of its own: its running heads stay dropped
    else:
        blocks = sorted(reader.running_head_blocks + blocks, key=lambda block: block.page)
    total = len(data) if parser == "content_list_v1" else sum(len(page) for page in data)
    broken = len(reader.item_problems)
    if total and broken * 2 > total:
        raise InvalidRequestError(
            f"{path.name}: {broken} of {total} items are unusable, so this is not a content list this service can "
            f"read; first problems: {'; '.join(reader.item_problems[:3])}"
        )
    if not total:
        reader.warnings.append("the content list has no items")
    return ParsedDocument(
        blocks=blocks,
        page_count=max(pages, page_count or 0),
        parser=parser,
        asset_root=root,
        warnings=reader.summary(parser),
    )


def _load_json(path: Path) -> Any:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InvalidRequestError(f"{path.name}: content list file not found") from None
    except IsADirectoryError:
        raise InvalidRequestError(f"{path.name}: is a folder, not a content list file") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise InvalidRequestError(
            f"{path.name}: content list is not UTF-8 text (invalid byte at offset {error.start})"
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidRequestError(
            f"{path.name}: content list is not valid JSON ({error.msg} at line {error.lineno} column {error.colno})"
        ) from None
    except RecursionError:
        raise InvalidRequestError(f"{path.name}: content list is nested too deeply to be a MinerU content list") from None


# -- V1 -------------------------------------------------------------------------------------------------------
def _read_v1(reader: _Reader, items: list[Any]) -> tuple[list[Block], int]:
    blocks: list[Block] = []
    pages = 0
    for index, item in enumerate(items):
        where = f"item {index}"
        try:
            if not isinstance(item, dict):
                raise _ItemError(f"{where}: is a JSON {type(item).__name__}, not an object")
            kind = item.get("type")
            if not isinstance(kind, str) or not kind:
                raise _ItemError(f"{where}: has no 'type'")
            page = _page_index(where, item)
            pages = max(pages, page + 1)
            block = _v1_block(reader, where, kind, item, page)
        except _ItemError as problem:
            reader.item_problems.append(f"{problem} (skipped)")
            continue
        if block is not None:
            blocks.append(block)
    return blocks, pages


def _page_index(where: str, item: dict[str, Any]) -> int:
    page = item.get("page_idx")
    if page is None:
        raise _ItemError(f"{where}: has no 'page_idx'")
    if isinstance(page, float) and page.is_integer():
        page = int(page)
    if not isinstance(page, int) or isinstance(page, bool) or page < 0:
        raise _ItemError(f"{where}: page_idx {_short(page)} is not a page index (0-based, non-negative)")
    return page


def _v1_block(reader: _Reader, where: str, kind: str, item: dict[str, Any], page: int) -> Optional[Block]:
    if kind in RUNNING_HEADS:
        reader.set_aside(kind, lambda: _text(where, item.get("text")), page, lambda: reader.bbox(where, item.get("bbox")))
        return None
    bbox = reader.bbox(where, item.get("bbox"))
    common: dict[str, Any] = {"page": page, "bbox": bbox}
    if kind in ("text", "title", "aside_text", "page_footnote"):
        text = _text(where, item.get("text"))
        if not text:
            return None
        if kind == "aside_text":
            return Block("aside", text, **common)
        if kind == "page_footnote":
            return Block("footnote", text, **common)
        level = _level(item.get("text_level"))
        if kind == "title":
            level = level or 1
        return Block("title", text, level=level, **common) if level else Block("text", text, **common)
    if kind in ("list", "index"):
        lines = _strings(item.get("list_items"))
        text = "\n".join(lines) if lines else _text(where, item.get("text"))
        return Block("list", text, **common) if text else None
    if kind == "code":
        body = _text(where, item.get("code_body") if "code_body" in item else item.get("text"))
        if not body:
            return None
        caption, footnote = _joined(item.get("code_caption")), _joined(item.get("code_footnote"))
        return Block("code", body, caption=caption, footnote=footnote, **common)
    if kind in ("equation", "interline_equation"):
        asset = reader.asset(where, item.get("img_path"))
        return Block("equation", _text(where, item.get("text")), asset=asset, **common)
    if kind in ("image", "chart"):
        caption_keys = ("chart_caption", "image_caption", "img_caption")
        footnote_keys = ("chart_footnote", "image_footnote", "img_footnote")
        return Block(
            kind,
            _text(where, item.get("content")),
            asset=reader.asset(where, item.get("img_path")),
            caption=_joined(_first_present(item, caption_keys)),
            footnote=_joined(_first_present(item, footnote_keys)),
            **common,
        )
    if kind == "table":
        html = _text(where, item.get("table_body"))
        return Block(
            "table",
            table_text(html),
            asset=reader.asset(where, item.get("img_path")),
            caption=_joined(item.get("table_caption")),
            footnote=_joined(item.get("table_footnote")),
            table_html=html,
            **common,
        )
    reader.unknown_types[kind] += 1
    return None


# -- V2 -------------------------------------------------------------------------------------------------------
def _read_v2(reader: _Reader, pages: list[list[Any]]) -> tuple[list[Block], int]:
    blocks: list[Block] = []
    for page, items in enumerate(pages):
        for position, item in enumerate(items):
            where = f"page {page} item {position}"
            try:
                if not isinstance(item, dict):
                    raise _ItemError(f"{where}: is a JSON {type(item).__name__}, not an object")
                kind = item.get("type")
                if not isinstance(kind, str) or not kind:
                    raise _ItemError(f"{where}: has no 'type'")
                content = item.get("content", {})
                if not isinstance(content, dict):
                    raise _ItemError(f"{where}: 'content' is not an object")
                block = _v2_block(reader, where, kind, content, item, page)
            except _ItemError as problem:
                reader.item_problems.append(f"{problem} (skipped)")
                continue
            if block is not None:
                blocks.append(block)
    return blocks, len(pages)


def _v2_block(
    reader: _Reader, where: str, kind: str, content: dict[str, Any], item: dict[str, Any], page: int
) -> Optional[Block]:
    if kind in RUNNING_HEADS:
        spans = next((value for key, value in content.items() if key.endswith("_content")), None)
        reader.set_aside(kind, lambda: _spans(where, spans), page, lambda: reader.bbox(where, item.get("bbox")))
        return None
    common: dict[str, Any] = {"page": page, "bbox": reader.bbox(where, item.get("bbox"))}
    if kind == "title":
        text = _spans(where, content.get("title_content"))
        return Block("title", text, level=_level(content.get("level")) or 1, **common) if text else None
    if kind in ("paragraph", "text"):
        text = _spans(where, content.get("paragraph_content"))
        return Block("text", text, **common) if text else None
    if kind in ("page_aside_text", "aside_text"):
        text = _spans(where, content.get(f"{kind}_content"))
        return Block("aside", text, **common) if text else None
    if kind == "page_footnote":
        text = _spans(where, content.get("page_footnote_content"))
        return Block("footnote", text, **common) if text else None
    if kind in ("list", "index"):
        entries = content.get("list_items")
        lines = [
            _spans(where, entry.get("item_content")) if isinstance(entry, dict) else _spans(where, entry)
            for entry in (entries if isinstance(entries, list) else [])
        ]
        text = "\n".join(line for line in lines if line)
        return Block("list", text, **common) if text else None
    if kind in ("code", "algorithm"):
        body = _spans(where, content.get(f"{kind}_content"))
        if not body:
            return None
        caption, footnote = _spans(where, content.get(f"{kind}_caption")), _spans(where, content.get(f"{kind}_footnote"))
        return Block("code", body, caption=caption, footnote=footnote, **common)
    if kind in ("equation_interline", "equation"):
        asset = reader.asset(where, _image_source(content))
        return Block("equation", _text(where, content.get("math_content")), asset=asset, **common)
    if kind in ("image", "chart"):
        return Block(
            kind,
            _text(where, content.get("content")),
            asset=reader.asset(where, _image_source(content)),
            caption=_spans(where, content.get(f"{kind}_caption")),
            footnote=_spans(where, content.get(f"{kind}_footnote")),
            **common,
        )
    if kind == "table":
        html = _text(where, content.get("html"))
        return Block(
            "table",
            table_text(html),
            asset=reader.asset(where, _image_source(content)),
            caption=_spans(where, content.get("table_caption")),
            footnote=_spans(where, content.get("table_footnote")),
            table_html=html,
            **common,
        )
    reader.unknown_types[kind] += 1
    return None


def _image_source(content: dict[str, Any]) -> Any:
    source = content.get("image_source")
    if isinstance(source, dict):
        return source.get("path")
    return source


def _spans(where: str, value: Any) -> str:
    """V2 inline spans -> plain text (inline equations keep their `$...$`, as V1 writes them)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    if not isinstance(value, list):
        raise _ItemError(f"{where}: text spans are a JSON {type(value).__name__}, not a list")
    parts: list[str] = []
    for span in value:
        if isinstance(span, str):
            parts.append(span)
        elif isinstance(span, dict):
            text = span.get("content")
            if isinstance(text, list):
                text = _spans(where, text)
            if not isinstance(text, str):
                continue
            parts.append(f"${text.strip()}$" if span.get("type") == "equation_inline" else text)
    return "".join(parts).strip()


# -- shared helpers ---------------------------------------------------------------------------------------------
def _text(where: str, value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _ItemError(f"{where}: text is a JSON {type(value).__name__}, not a string")
    return value.strip()


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return []
    return [v.strip() for v in value if isinstance(v, str) and v.strip()]


def _joined(value: Any) -> str:
    return "\n".join(_strings(value))


def _first_present(item: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        if item.get(key):
            return item[key]
    return None


def _level(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return 0
    return max(int(value), 0)


def _capped(lines: list[str], rest: str) -> list[str]:
    if len(lines) <= MAX_ITEM_WARNINGS:
        return list(lines)
    return lines[:MAX_ITEM_WARNINGS] + [f"... and {len(lines) - MAX_ITEM_WARNINGS} {rest}"]


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# -- tables -----------------------------------------------------------------------------------------------------
class _TableText(HTMLParser):
    """Collects the outermost table's rows and cells; nested tables' text stays inside their cell."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.rows: list[list[str]] = []
        self.depth = 0
        self.row: Optional[list[str]] = None
        self.cell: Optional[list[str]] = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, Optional[str]]]) -> None:
        if tag == "table":
            self.depth += 1
            if self.depth > 1 and self.cell is not None:
                self.cell.append(" ")
        elif self.depth <= 1 and tag == "tr":
            self._close_row()
            self.row = []
        elif self.depth <= 1 and tag in ("td", "th"):
            self._close_cell()
            if self.row is None:
                self.row = []
            self.cell = []
        elif self.cell is not None and tag in ("br", "p", "div", "li", "tr", "td", "th"):
            self.cell.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self.depth -= 1
            if self.depth <= 0:
                self.depth = 0
                self._close_row()
        elif self.depth <= 1 and tag in ("td", "th"):
            self._close_cell()
        elif self.depth <= 1 and tag == "tr":
            self._close_row()

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)

    def _close_cell(self) -> None:
        if self.cell is not None and self.row is not None:
            self.row.append(" ".join("".join(self.cell).split()))
        self.cell = None

    def _close_row(self) -> None:
        self._close_cell()
        if self.row:
            self.rows.append(self.row)
        self.row = None


def table_text(html: str) -> str:
    """A table's HTML as text: one line per row, cells separated by " | " (what embedders and LLMs read)."""
    if not html:
        return ""
    if "<" not in html:
        return html.strip()  # some producers put Markdown or LaTeX in table_body: keep it as it is
    parser = _TableText()
    parser.feed(html)
    parser.close()
    parser._close_row()
    if not parser.rows:
        return " ".join(_strip_tags(html).split())
    return "\n".join(" | ".join(row) for row in parser.rows)


def _strip_tags(html: str) -> str:
    class _Text(HTMLParser):
        def __init__(self) -> None:
            super().__init__(convert_charrefs=True)
            self.parts: list[str] = []

        def handle_data(self, data: str) -> None:
            self.parts.append(data)

    parser = _Text()
    parser.feed(html)
    parser.close()
    return " ".join(parser.parts)
