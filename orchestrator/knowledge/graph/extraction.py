"""Entities and relations from one piece of evidence (a text chunk or a multimodal unit's description): what an
extraction is, the key entities merge on, and the description a multimodal unit gets without a VLM.

Two extractors give the same `Extraction`: `cooccurrence.CooccurrenceExtractor` (model-free, GraphRAG's "fast"
indexing) and `llm_extraction.LlmExtractor` (LightRAG-style, an LLM asked for strict JSON, parsed tolerantly).

Names stay as written in the text; `normalize_entity_name` gives the hard-match key entities are merged on,
across chunks and documents (AutoThinkRAG's "hard-matching" entity merge).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from ..parsing.documents import Block

DEFAULT_ENTITY_TYPE = "concept"
ENTITY_TYPES = ("organization", "person", "location", "product", "event", "metric", "concept")
DESCRIPTION_CHARS = 300  # a co-occurrence description is the sentence, cut to about this length


@dataclass(frozen=True)
class Entity:
    name: str  # as written in the text
    type: str
    description: str


@dataclass(frozen=True)
class Relation:
    source: str  # entity names as written in the text
    target: str
    description: str
    keywords: str
    weight: float


@dataclass(frozen=True)
class Extraction:
    entities: list[Entity]
    relations: list[Relation]


# --------------------------------------------------------------------------------------------------------------
# The hard-match key


_ARTICLES = ("the ", "a ", "an ")


def normalize_entity_name(name: str) -> str:
    """The key entities merge on: "The  Bank of England," and "bank of england" are one entity.

    NFKC + casefold (full-width and ligature forms, "Straße" = "STRASSE"), whitespace collapsed, surrounding
    punctuation and quotes stripped, leading English articles dropped. "" means: not a usable name.
    """
    if not isinstance(name, str):
        return ""
    if name.isascii():  # NFKC leaves ASCII as it is and casefold is lower(): the router asks this for every word run
        return _without_articles(" ".join(name.lower().split()).strip(_ASCII_EDGE_JUNK))
    text = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold())
    return _without_articles(_strip_punctuation(" ".join(text.split())))


def _without_articles(text: str) -> str:
    stripped = True
    while stripped:  # all of them, so that a key normalises to itself ("a the b" -> "b")
        stripped = False
        for article in _ARTICLES:
            if text.startswith(article) and len(text) > len(article):
                text, stripped = _strip_punctuation(text[len(article) :]), True
    return text


def _strip_punctuation(text: str) -> str:
    start, end = 0, len(text)
    while start < end and _is_edge_junk(text[start]):
        start += 1
    while end > start and _is_edge_junk(text[end - 1]):
        end -= 1
    return text[start:end]


def _is_edge_junk(char: str) -> bool:
    return char.isspace() or unicodedata.category(char).startswith("P")


_ASCII_EDGE_JUNK = "".join(chr(code) for code in range(128) if _is_edge_junk(chr(code)))


# --------------------------------------------------------------------------------------------------------------
# Multimodal units


_VISUAL_LABELS = {"image": "Image", "table": "Table", "equation": "Equation", "chart": "Chart"}


def describe_fallback(block: Block, max_chars: int = 2000) -> str:
    """The tiny profile's description of a multimodal unit: what the page itself says about it.

    "Table: <caption>\\n<rows>\\n<footnote>" (the content is the table text, the equation's LaTeX, a chart's
    data when the parser gave any; images have none). It anchors the unit in the graph and the vector index
    when no VLM describes it, and the VLM's description is appended to it when one does.
    """
    if block.type not in _VISUAL_LABELS:
        raise ValueError(f"describe_fallback is for image, table, equation and chart blocks, not {block.type!r}")
    caption = " ".join(block.caption.split())
    lines = [f"{_VISUAL_LABELS[block.type]}: {caption}" if caption else _VISUAL_LABELS[block.type]]
    content = block.content.strip()
    if content:
        lines.append(content if len(content) <= max_chars else content[:max_chars].rstrip() + "…")
    footnote = " ".join(block.footnote.split())
    if footnote:
        lines.append(footnote)
    return "\n".join(lines)
