"""The hybrid answerer: the LLM reads the sentences the extractive answerer chose, not the evidence passages.

A small LLM (the offline profile's SmolLM2-135M) given whole passages (the route's evidence items, 254 tokens each,
with the text around them) lost the question in them and took seconds to read them on a CPU; given the few
sentences the embedder ranked best, each numbered by its evidence, it read the asked-for value off them, in a
prompt of a few hundred tokens (prompts.reader_prompt). The answer is generated; each of its citations quotes the
chosen sentence it rests on: of the evidence it cites ([n]), the sentence sharing most words with the answer, and
where it cites nothing, the chosen sentence sharing most words with it.
"""

from __future__ import annotations

from typing import Sequence

from ..config import AnswerSettings
from ..knowledge.parsing.text import lexical_terms
from ..prompts import cited_ranks
from .extractive import Sentence

Chosen = Sequence[tuple[Sentence, float]]


def candidate_settings(settings: AnswerSettings) -> AnswerSettings:
    """The extractive choice widened to the hybrid's candidates: more sentences, from a wider margin of the best
    (the LLM, not the score, picks among them)."""
    return settings.model_copy(update={
        "extractive_sentences": settings.hybrid_sentences, "extractive_margin": settings.hybrid_margin,
    })


def reader_lines(chosen: Chosen) -> list[tuple[int, str]]:
    """(evidence rank, sentence) in the order the extractive answerer keeps them (evidence order)."""
    return [(sentence.rank, sentence.text) for sentence, _ in chosen]


def grounded(answer: str, chosen: Chosen) -> list[tuple[Sentence, float]]:
    """The chosen sentences the answer rests on, in order of first citation: per cited evidence rank, its
    sentence sharing most words with the answer; with no citation, the one chosen sentence sharing most words
    with it (none when no sentence shares a word)."""
    words = frozenset(lexical_terms(answer))

    def shared(pair: tuple[Sentence, float]) -> tuple[int, float]:
        return len(words & pair[0].terms), pair[1]

    ranks = cited_ranks(answer, {sentence.rank for sentence, _ in chosen})
    if ranks:
        return [max((pair for pair in chosen if pair[0].rank == rank), key=shared) for rank in ranks]
    best = max(chosen, key=shared, default=None)
    return [best] if best is not None and shared(best)[0] > 0 else []
