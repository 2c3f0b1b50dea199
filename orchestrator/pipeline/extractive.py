"""The extractive answerer: the evidence sentences closest to the question, each cited where it sits, and the value
in them that the question asks for (the short answer).

Sentences (of the evidence text and of the VLM's descriptions) are embedded with the text embedder in one
call and scored by cosine with the question, plus a small bonus for sharing its content words; the best
few above a floor are returned in evidence order. Every sentence is cut from one block of its evidence, so
its citation names that block's page and bbox. The short answer is the value of the type the question asks for
(answer_types.py) in the best-scoring chosen sentence that holds one, closest to the question's words, with its
span in that sentence. It is the tiny profile's answer, and every profile's fallback when the LLM is down or the
deadline is near; without the embedder it ranks by the shared words alone, and says so.

Measured and not kept (benchmarks/results/mmlongbench-dev/document_qa-answers-tried.md): scoring by the
question's words weighted by the collection's idf, its numbers and the asked-for type, keeping the best sentence
and a second only for the missing type. On the dev PDFs the answer then held the expected answer for 0.105 of
the short-answer questions against 0.150, and its first citation was on an evidence page for 0.506 against 0.553.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Collection, Iterable, Mapping, Optional, Sequence

import numpy as np

from ..config import AnswerSettings
from ..errors import ThinkServeError
from ..knowledge.parsing.chunking import Span
from ..knowledge.parsing.text import lexical_terms
from ..knowledge.storage.segments import EvidenceRecord
from ..knowledge.parsing.sentences import NO_SPAN, CutSentence, cut_sentences, located_texts
from ..knowledge.parsing.text import STOP_WORDS
from .accounting import StageModels
from .answer_types import expected_type, polarity, question_numbers, short_value
from .events import Citation, EvidenceItem, ShortAnswer

LEXICAL_BONUS = 0.15  # added for sharing every content word of the question
Idf = Callable[[str], float]


@dataclass(frozen=True)
class Sentence:
    text: str
    rank: int  # evidence rank it comes from
    position: int  # order within that evidence
    span: Optional[Span] = None  # the block of the evidence it is cut from (page, bbox)
    tokens: Optional[int] = field(default=None, compare=False)  # the embedder's tokens, when counted at commit time
    stored_terms: Optional[frozenset[str]] = field(default=None, repr=False, compare=False)  # its terms, when stored

    @functools.cached_property
    def terms(self) -> frozenset[str]:
        """Its words, as BM25 reads them: shortlisting and choosing both compare them with the question's."""
        return self.stored_terms if self.stored_terms is not None else frozenset(lexical_terms(self.text))


@dataclass(frozen=True)
class ExtractiveAnswer:
    text: str
    sentences: tuple[tuple[Sentence, float], ...]  # chosen, with their scores, in answer order
    ranks: tuple[int, ...]  # evidence ranks cited, in order of first mention
    note: str = ""  # set when the embedder could not be used
    short: Optional[ShortAnswer] = None  # the asked-for value in a chosen sentence (citation: its index)


# a rank, its sentences as cut (sentences.py) and the spans their indexes name
RankedSentences = tuple[int, Sequence[CutSentence], Sequence[Span]]


def candidate_sentences(
    items: Sequence[EvidenceItem], headings: Collection[str] = (), stored: Mapping[int, Sequence[CutSentence]] = {},
) -> list[Sentence]:
    """Every sentence of the evidence (and of its visual descriptions) that can answer something: headings
    (the titles the evidence spans, and its section path) and fragments are left out. `stored`: the sentences
    of an item's record cut at commit time, by rank (the others are cut now)."""
    seen = {" ".join(h.split()).casefold() for h in headings}
    seen |= {part.strip().casefold() for item in items for part in item.record.section.split(">")}
    return sentences_of([_item_sentences(item, stored) for item in items], seen)


def _item_sentences(item: EvidenceItem, stored: Mapping[int, Sequence[CutSentence]]) -> RankedSentences:
    """The record's sentences, then the VLM's description's (at the record's first block)."""
    record = item.record
    cut = list(stored[item.rank] if item.rank in stored else cut_sentences(located_texts(record)))
    if item.perception:
        cut += cut_sentences([(item.perception, 0 if record.spans else NO_SPAN)])
    return item.rank, cut, record.spans


def sentences_of(ranked: Iterable[RankedSentences], seen: set[str]) -> list[Sentence]:
    """The sentences of each rank, in order, less anything in `seen` (which grows: a sentence repeated by a
    later item is left to the first)."""
    sentences: list[Sentence] = []
    for rank, cut, spans in ranked:
        position = 0
        for sentence in cut:
            if sentence.key in seen:
                continue
            seen.add(sentence.key)
            span = spans[sentence.span] if sentence.span != NO_SPAN else None
            sentences.append(Sentence(sentence.text, rank, position, span, sentence.tokens, sentence.terms))
            position += 1
    return sentences


def shortlist(question: str, sentences: Sequence[Sentence], limit: int) -> list[Sentence]:
    """The `limit` sentences worth embedding: most shared content words first, then evidence order.

    Embedding every sentence of long evidence costs more than the rest of the query on a CPU; a sentence
    sharing no word with the question rarely answers it, and the best-ranked evidence goes first."""
    wanted = content_terms(question)
    ranked = sorted(sentences, key=lambda s: (-_overlap(wanted, s.terms), s.rank, s.position))
    return sorted(ranked[:limit], key=lambda s: (s.rank, s.position))


def content_terms(question: str) -> frozenset[str]:
    """The question's content words (its terms less the stop words)."""
    return frozenset(t for t in lexical_terms(question) if t not in STOP_WORDS)


def word_overlap(question: str, sentence: str) -> float:
    """Share of the question's content words (not stop words) that the sentence contains."""
    return _overlap(content_terms(question), frozenset(lexical_terms(sentence)))


def _overlap(wanted: frozenset[str], terms: frozenset[str]) -> float:
    return len(wanted & terms) / len(wanted) if wanted else 0.0


def lexical_evidence(wanted: frozenset[str], terms: frozenset[str], idf: Optional[Idf] = None) -> float:
    """Share of the question's content words the sentence holds, each weighted by its rarity (1 each without idf)."""
    if not wanted:
        return 0.0
    weight = idf or (lambda term: 1.0)
    total = sum(weight(term) for term in wanted)
    return sum(weight(term) for term in wanted & terms) / total if total > 0 else _overlap(wanted, terms)


def choose(
    question: str, sentences: Sequence[Sentence], similarities: Optional[np.ndarray], count: int, floor: float, margin: float
) -> list[tuple[Sentence, float]]:
    """The best `count` sentences scoring at least `floor` and within `margin` of the best one, in evidence
    order (rank, then position). Without similarities, sentences sharing no content word are left out."""
    wanted = content_terms(question)
    scored = []
    for i, sentence in enumerate(sentences):
        overlap = _overlap(wanted, sentence.terms)
        if similarities is None and overlap == 0:
            continue
        score = (float(similarities[i]) if similarities is not None else 0.0) + LEXICAL_BONUS * overlap
        scored.append((sentence, score))
    if not scored:
        return []
    scored.sort(key=lambda pair: (-pair[1], pair[0].rank, pair[0].position))
    cut = scored[0][1] - margin
    best = [pair for pair in scored[:count] if pair[1] >= cut and (similarities is None or pair[1] >= floor)]
    best.sort(key=lambda pair: (pair[0].rank, pair[0].position))
    return best


def short_answer(question: str, chosen: Sequence[tuple[Sentence, float]], idf: Optional[Idf] = None) -> Optional[ShortAnswer]:
    """The value the question asks for in the chosen sentences (the best-scoring sentence holding one), with its
    span in that sentence; for a yes/no question the polarity the best sentence states plainly; else None."""
    answer_type = expected_type(question)
    if not chosen or answer_type == "other":
        return None
    wanted = content_terms(question)
    order = sorted(range(len(chosen)), key=lambda i: -chosen[i][1])
    if answer_type == "yes_no":
        index = order[0]
        sentence = chosen[index][0]
        said = polarity(sentence.text, wanted, lexical_evidence(wanted, sentence.terms, idf))
        return ShortAnswer(said.capitalize(), answer_type, index, 0, len(sentence.text)) if said else None
    for index in order:
        value = short_value(chosen[index][0].text, answer_type, wanted | question_numbers(question))
        if value is not None:
            return ShortAnswer(value.text, answer_type, index, value.start, value.end)
    return None


def _token_count(sentences: Sequence[Sentence], count: Callable[[Sequence[str]], int]) -> Callable[[], int]:
    """The embedder's tokens of the sentences: those counted at commit time, the others counted when asked."""
    known = sum(s.tokens for s in sentences if s.tokens is not None)
    return lambda: known + count([s.text for s in sentences if s.tokens is None])


def compose(chosen: Sequence[tuple[Sentence, float]]) -> tuple[str, tuple[int, ...]]:
    text = " ".join(f"{sentence.text} [{sentence.rank}]" for sentence, _ in chosen)
    return text, tuple(dict.fromkeys(sentence.rank for sentence, _ in chosen))


def sentence_citations(chosen: Sequence[tuple[Sentence, float]], records: dict[int, EvidenceRecord]) -> tuple[Citation, ...]:
    """One citation per quoted sentence, in answer order: its evidence, and the page and bbox of its block."""
    citations = []
    for sentence, _ in chosen:
        record = records[sentence.rank]
        regions = (sentence.span,) if sentence.span is not None else record.spans
        page = sentence.span.page if sentence.span is not None else record.page
        citations.append(Citation(sentence.rank, record.evidence_id, record.document_name, page, regions, sentence.text))
    return tuple(citations)


async def extractive_answer(
    models: StageModels,
    question: str,
    question_vector: Optional[np.ndarray],
    items: Sequence[EvidenceItem],
    settings: AnswerSettings,
    timeout_s: float,
    headings: Collection[str] = (),
    stored: Mapping[int, Sequence[CutSentence]] = {},
    idf: Optional[Idf] = None,
    with_short_answer: bool = False,
) -> ExtractiveAnswer:
    """`stored`: the sentences of an item's record cut at commit time, by rank (Segment.answer_sentences); `idf`:
    the collection's rarity of a term (BM25's), which weighs the question's words where a yes/no is read."""
    sentences = shortlist(question, candidate_sentences(items, headings, stored), settings.extractive_candidates)
    if not sentences:
        return ExtractiveAnswer("", (), ())
    similarities, note = None, ""
    if question_vector is not None:
        try:
            texts = [s.text for s in sentences]
            vectors = await models.embed(texts, timeout_s, tokens=_token_count(sentences, models.count_tokens))
            similarities = vectors @ np.asarray(question_vector, dtype=np.float32)
        except ThinkServeError as error:
            note = f"sentences ranked by shared words only (embedder unavailable: {error})"
    else:
        note = "sentences ranked by shared words only (no question embedding)"
    chosen = choose(
        question, sentences, similarities, settings.extractive_sentences, settings.extractive_min_similarity,
        settings.extractive_margin,
    )
    text, ranks = compose(chosen)
    # only when asked: its patterns added about 0.3 ms to a query's own time on the dev PDFs (answer stage p50)
    short = short_answer(question, chosen, idf) if with_short_answer else None
    return ExtractiveAnswer(text, tuple(chosen), ranks, note, short)
