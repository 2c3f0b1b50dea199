"""Each evidence record's answer sentences, cut once when its document is committed.

The extractive answer reads the sentences of the evidence a query returns. Splitting them, normalising their
spaces, finding their BM25 terms and counting their embedder tokens depend on the record alone, and took about a
fifth of a Simple query's own time (benchmarks/results/own_time.md), so the ingest cuts them with the segment
(`sentences-v<N>.jsonl`, one line per evidence row) and a query reads the lines of the rows it cites. A segment
written before the file existed, or whose file cannot be read, has its records' sentences cut when a query
reads them, as here but without token counts (counted then, as before).

With them: the titles each record spans (no sentence of the answer is a heading), which a query otherwise
read from the document's blocks. What a query still decides: which sentences it skips as headings or repeats of
a better-ranked item's, and the sentences of the VLM's descriptions, which exist only in that query.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Sequence

from .chunking import Span
from .documents import Block
from .text import lexical_terms, split_sentences

SENTENCES_VERSION = 1  # raise when the cut changes (split_sentences, lexical_terms, the limits): older files are not read
SENTENCES_FILE = f"sentences-v{SENTENCES_VERSION}.jsonl"
MAX_SENTENCE_CHARS = 400
MIN_SENTENCE_WORDS = 4  # shorter "sentences" are labels, not answers
NO_SPAN = -1

TokenCounts = Callable[[Sequence[str]], Sequence[int]]  # the text embedder's token count of each text


class EvidenceText(Protocol):
    """What is cut of an evidence record (segments.EvidenceRecord, which reads and writes the file with this module)."""

    @property
    def text(self) -> str: ...

    @property
    def spans(self) -> Sequence[Span]: ...


@dataclass(frozen=True)
class CutSentence:
    text: str  # spaces normalised, cut to MAX_SENTENCE_CHARS
    key: str  # the whole sentence casefolded (before the cut): headings and repeats are recognised by it
    span: int  # index in the record's spans of the block it is cut from; NO_SPAN: the record has none
    terms: frozenset[str]  # its words, as BM25 reads them (of the cut text)
    tokens: Optional[int] = None  # the text embedder's tokens of `text`; None: not counted


def located_texts(record: EvidenceText) -> list[tuple[str, int]]:
    """The record's text block by block, with each block's index in its spans (a passage records where each of
    its blocks sits in its text; older records do not, and are one text at their first block)."""
    texts = [(record.text[s.start : s.end], i) for i, s in enumerate(record.spans) if s.end > s.start]
    return texts or [(record.text, 0 if record.spans else NO_SPAN)]


def cut_sentences(texts: Sequence[tuple[str, int]]) -> list[CutSentence]:
    """The sentences of the texts, in order: fragments (under MIN_SENTENCE_WORDS words) left out, spaces
    normalised, long sentences cut to MAX_SENTENCE_CHARS. Not counted."""
    sentences = []
    for text, span in texts:
        for sentence in split_sentences(text or ""):
            words = sentence.split()
            if len(words) < MIN_SENTENCE_WORDS:
                continue
            whole = " ".join(words)
            cut = whole if len(whole) <= MAX_SENTENCE_CHARS else whole[: MAX_SENTENCE_CHARS - 1].rstrip() + "…"
            sentences.append(CutSentence(cut, whole.casefold(), span, frozenset(lexical_terms(cut))))
    return sentences


@dataclass(frozen=True)
class RecordSentences:
    """What the extractive answer reads of one evidence record."""

    sentences: tuple[CutSentence, ...]
    titles: tuple[str, ...] = ()  # the title blocks its spans cover: never answer sentences, of this record or another


def record_sentences(
    records: Sequence[EvidenceText], blocks: Sequence[Block], count: Optional[TokenCounts] = None,
) -> list[RecordSentences]:
    """Each record's sentences and titles (`blocks`: its document's), counted by `count` when given (one batch
    for all the records)."""
    cut = [cut_sentences(located_texts(record)) for record in records]
    titles = [_titles(record, blocks) for record in records]
    if count is None:
        return [RecordSentences(tuple(sentences), own) for sentences, own in zip(cut, titles)]
    tokens = iter(count([s.text for sentences in cut for s in sentences]))
    return [
        RecordSentences(tuple(CutSentence(s.text, s.key, s.span, s.terms, next(tokens)) for s in sentences), own)
        for sentences, own in zip(cut, titles)
    ]


def _titles(record: EvidenceText, blocks: Sequence[Block]) -> tuple[str, ...]:
    """The contents of the title blocks the record spans (each block read alone: a stored document's blocks are
    decoded row by row)."""
    spanned = [blocks[s.block] for s in record.spans if 0 <= s.block < len(blocks)]
    return tuple(dict.fromkeys(block.content for block in spanned if block.type == "title"))


def encode_row(row: RecordSentences) -> str:
    """One line of the file: {"s": [[text, key when it is not the text casefolded, span, tokens, terms joined]], "t": titles}."""
    sentences = [[s.text, "" if s.key == s.text.casefold() else s.key, s.span, s.tokens, " ".join(sorted(s.terms))] for s in row.sentences]
    return json.dumps({"s": sentences, "t": list(row.titles)}, ensure_ascii=False)


def decode_row(row: dict[str, Any]) -> RecordSentences:
    return RecordSentences(
        tuple(CutSentence(text, key or text.casefold(), span, frozenset(terms.split()), tokens) for text, key, span, tokens, terms in row["s"]),
        tuple(row["t"]),
    )
