"""Document-QA datasets in MMLongBench-Doc's layout, and how their answers and pages are scored.

    <dataset>/documents/<doc_id>      the PDFs
    <dataset>/questions.json          [{doc_id, question, answer, evidence_pages, evidence_sources, answer_format}]

`evidence_pages` and `evidence_sources` are strings holding Python lists, as published; pages are 1-based. A
question whose answer is "Not answerable" has no evidence. Published pages past a document's last page are
kept: they count as misses, never dropped.
"""

from __future__ import annotations

import ast
import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

UNANSWERABLE = "Not answerable"
SHORT_FORMATS = ("Str", "Int", "Float")
SHORT_STRING_WORDS = 5  # a Str answer longer than this is a sentence, not a value to find
KS = (1, 5, 10)


@dataclass(frozen=True)
class Question:
    id: int  # position in questions.json
    document: str  # the doc_id: the PDF's file name
    text: str
    answer: str
    evidence_pages: tuple[int, ...]  # 0-based
    evidence_sources: tuple[str, ...]
    answer_format: str

    @property
    def answerable(self) -> bool:
        return self.answer.strip() != UNANSWERABLE

    @property
    def short_answer(self) -> bool:
        """A value an extractive answer can contain: a number, or a string of a few words."""
        if not self.answerable or self.answer_format not in SHORT_FORMATS:
            return False
        return self.answer_format != "Str" or len(self.answer.split()) <= SHORT_STRING_WORDS


def load_questions(dataset: Path) -> list[Question]:
    rows = json.loads((dataset / "questions.json").read_text(encoding="utf-8"))
    return [
        Question(
            id=number,
            document=row["doc_id"],
            text=" ".join(str(row["question"]).split()),
            answer=str(row["answer"]).strip(),
            evidence_pages=tuple(int(page) - 1 for page in _listed(row.get("evidence_pages", "[]"))),
            evidence_sources=tuple(str(source) for source in _listed(row.get("evidence_sources", "[]"))),
            answer_format=str(row.get("answer_format", "")),
        )
        for number, row in enumerate(rows)
    ]


def _listed(value) -> list:
    if isinstance(value, list):
        return value
    parsed = ast.literal_eval(value) if str(value).strip() else []
    return list(parsed) if isinstance(parsed, (list, tuple)) else [parsed]


def page_hits(ranked_pages: Sequence[int], gold: Iterable[int]) -> dict[str, float]:
    """Recall@1/5/10 (any evidence page among the first k distinct pages) and reciprocal rank within 10."""
    gold = set(gold)
    pages = list(dict.fromkeys(ranked_pages))
    scores = {f"recall@{k}": float(bool(gold & set(pages[:k]))) for k in KS}
    scores["mrr@10"] = next((1.0 / (rank + 1) for rank, page in enumerate(pages[:10]) if page in gold), 0.0)
    return scores


_NUMBER_GROUPING = re.compile(r"(?<=\d),(?=\d{3}\b)")


def normalize_answer(text: str) -> str:
    """What answer containment compares: Unicode NFKC, case folded, thousands separators removed
    ("1,234" -> "1234"), every character that is not a letter, a digit or a decimal point between digits
    replaced by a space (so "$", "%" and punctuation do not matter), runs of spaces collapsed."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = _NUMBER_GROUPING.sub("", text)
    kept = [
        character if character.isalnum() or (character == "." and 0 < i < len(text) - 1 and text[i - 1].isdigit()
                                             and text[i + 1].isdigit()) else " "
        for i, character in enumerate(text)
    ]
    return " ".join("".join(kept).split())


def contains_answer(answer: str, gold: str) -> bool:
    """The normalised gold answer appears in the normalised answer as whole words ("12" is not in "2012")."""
    wanted = normalize_answer(gold)
    if not wanted:
        return False
    return f" {wanted} " in f" {normalize_answer(answer)} "


def refusal_scores(declined: Sequence[bool], unanswerable: Sequence[bool]) -> dict[str, Optional[float]]:
    """Precision, recall and F1 of declining to answer, taking the unanswerable questions as the positives."""
    true_positive = sum(d and u for d, u in zip(declined, unanswerable))
    declined_count, positives = sum(declined), sum(unanswerable)
    precision = true_positive / declined_count if declined_count else None
    recall = true_positive / positives if positives else None
    return {
        "declined": declined_count,
        "unanswerable": positives,
        "precision": precision,
        "recall": recall,
        "f1": 2 * precision * recall / (precision + recall) if precision and recall else (0.0 if positives else None),
    }


def separation_auc(scores: Sequence[float], positive: Sequence[bool]) -> Optional[float]:
    """How well a low score picks out the positives: the chance that a random positive scores below a random
    negative (ties count half). Near 0.5 the two groups' scores overlap: no threshold on them refuses well."""
    low = [s for s, p in zip(scores, positive) if p]
    high = [s for s, p in zip(scores, positive) if not p]
    if not low or not high:
        return None
    wins = sum((a < b) + 0.5 * (a == b) for a in low for b in high)
    return wins / (len(low) * len(high))
