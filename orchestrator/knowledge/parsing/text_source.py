"""Plain text and Markdown -> blocks: headings become titles (with their level), paragraphs become text blocks.

Text sources have no pages, so their blocks carry NO_PAGE and no bbox; citations name the heading path instead.
"""

from __future__ import annotations

import re

from ...errors import InvalidRequestError
from .documents import Block, ParsedDocument

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")


def decode_text(data: bytes, filename: str) -> str:
    """UTF-8 (with or without a BOM) or a clear error: guessing an encoding silently corrupts the index."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise InvalidRequestError(
            f"{filename!r} is not UTF-8 text (invalid byte 0x{data[error.start]:02x} at offset {error.start}); "
            "convert it to UTF-8 first"
        ) from None


def parse_text(text: str, markdown: bool) -> ParsedDocument:
    """Blocks in reading order; Markdown headings become titles, list paragraphs become list blocks."""
    blocks: list[Block] = []
    for paragraph in re.split(r"\n\s*\n", text.replace("\r\n", "\n").replace("\r", "\n")):
        lines = [line.rstrip() for line in paragraph.strip("\n").splitlines() if line.strip()]
        while lines and markdown and (heading := _HEADING.match(lines[0].strip())):
            blocks.append(Block("title", heading.group(2), level=len(heading.group(1))))
            lines = lines[1:]
        if not lines:
            continue
        kind = "list" if markdown and all(_LIST_ITEM.match(line) or line.startswith("  ") for line in lines) else "text"
        body = "\n".join(lines) if kind == "list" else " ".join(line.strip() for line in lines)
        blocks.append(Block(kind, body))
    return ParsedDocument(blocks, page_count=0, parser="markdown" if markdown else "text")
