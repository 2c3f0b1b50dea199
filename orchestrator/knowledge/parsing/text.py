"""Text utilities the knowledge base and the pipeline share: the BM25 vocabulary, the stop-word list and the
sentence splitter.

Kept apart from the entity extractor that first needed them, so the extractive answerer and the lexical
indexes do not depend on graph extraction.
"""

from __future__ import annotations

import re
from typing import Iterator

LEXICAL_TERMS_VERSION = 1  # raise when lexical_terms changes: stored term counts of another version are not used
_WORD = re.compile(r"[0-9]+(?:[.,][0-9]+)*%?|[^\W_]+", re.UNICODE)


def lexical_terms(text: str) -> list[str]:
    """Lower-cased words and numbers (1,200 and 4.5% stay whole): the BM25 vocabulary, and the words the
    extractive answer and answerability compare with the question's."""
    return [match.group(0).casefold() for match in _WORD.finditer(text)]


# A compact English stop-word list (the usual NLTK/sklearn core) plus words that start sentences in reports.
STOP_WORDS = frozenset(
    """
    a about above across after afterwards again against all almost alone along already also although always am
    among amongst an and another any anyhow anyone anything anyway anywhere are around as at back be became
    because become becomes been before beforehand behind being below beside besides between beyond both but by
    can cannot could did do does doing done down due during each either else elsewhere enough etc even ever
    every everyone everything everywhere except few for former formerly from further furthermore had has have
    having he hence her here hereafter hereby herein hers herself him himself his how however i if in indeed
    instead into is it its itself just last latter least less many may me meanwhile might mine more moreover
    most mostly much must my myself namely neither never nevertheless next no nobody none nor not nothing now
    nowhere of off often on once one only onto or other others otherwise our ours ourselves out over overall
    own per perhaps please rather same several she should since so some somehow someone something sometimes
    somewhere still such than that the their theirs them themselves then thence there thereafter thereby
    therefore therein these they this those though through throughout thus to together too toward towards
    under until up upon us very via was we well were what whatever when whenever where whereas wherever whether
    which while who whoever whole whom whose why will with within without would yet you your yours yourself
    yourselves additionally accordingly consequently finally firstly secondly similarly specifically notably
    importantly here today yesterday tomorrow yes let lets total overall based according following including
    """.split()
)

# Abbreviations whose period never ends a sentence (titles, initials-like) or ends one only before "The" etc.
_NEVER_FINAL = frozenset("mr mrs ms dr prof sr jr st vs e.g i.e cf approx no fig".split())
_MAYBE_FINAL = frozenset("inc ltd co corp plc llc etc".split())

_SENTENCE_END = re.compile(r"[.!?]+[\"'”’)\]]*\s+")
_LINE_MARKER = re.compile(r"^\s*(?:[-*+•]|\d+[.)]|#{1,6}|>|\|)\s*")


def split_sentences(text: str) -> list[str]:
    """Sentences of a chunk: paragraphs, list items and table rows, then sentence ends within each.

    A period after a title ("Dr.") or an initial never ends a sentence; after "Inc." or "Ltd." only when a
    capitalised stop word follows ("... Contoso Inc. The deal ...").
    """
    sentences: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text.replace("\r\n", "\n").replace("\r", "\n")):
        for unit in _paragraph_units(paragraph):
            start = 0
            for match in _SENTENCE_END.finditer(unit):
                if _ends_sentence(unit, match):
                    sentences.append(unit[start : match.end()].strip())
                    start = match.end()
            sentences.append(unit[start:].strip())
    return [s for s in sentences if s]


def _paragraph_units(paragraph: str) -> Iterator[str]:
    """Lines of a paragraph joined back into prose, except list items, headings and table rows."""
    current: list[str] = []
    for line in paragraph.split("\n"):
        if not line.strip():
            continue
        marker = _LINE_MARKER.match(line)
        if marker:
            if current:
                yield " ".join(current)
            current = [line[marker.end() :].strip(" |")]
        else:
            current.append(line.strip())
    if current:
        yield " ".join(current)


def _ends_sentence(unit: str, match: re.Match) -> bool:
    rest = unit[match.end() :]
    if not rest or rest[0].islower():
        return False
    if "." not in match.group():
        return True  # ! or ?
    before = unit[: match.start()].rsplit(None, 1)
    word = before[-1].lstrip("([\"'“‘").casefold() if before else ""
    if word in _NEVER_FINAL or (len(word) == 1 and word.isalpha()):
        return False
    if word in _MAYBE_FINAL:
        next_word = rest.split(None, 1)[0].strip(".,;:\"'").casefold()
        return next_word in STOP_WORDS
    return True
