"""Answerability: how likely the retrieved evidence is to answer the question, as a calibrated probability.

A fixed threshold on the best cosine separated the dev PDFs' unanswerable questions no better than chance (AUC
0.50). Here a small logistic model reads what retrieval found: the best and second cosines and lexical matches,
the best page's match, how much of the question's rare words and numbers the best page holds, whether the dense
and lexical top pages agree, whether the evidence holds a value of the type asked for, and the route. It is
fitted offline by `thinkserve-build train-answerability` on labelled questions (collected and cross-validated by
document by `thinkserve-bench answerability`) and shipped as a versioned JSON file (models/answerability.py): one
model per retrieval mode (lexical mode has no cosine).
The same `answerability_features` compute the features here and, through the Retrieve response that reports
them, for the training: what the model was fitted on is what it reads when serving.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence


from ..knowledge.parsing.text import lexical_terms
from ..knowledge.storage.snapshot import Snapshot
from ..knowledge.parsing.text import STOP_WORDS
from ..models.answerability import FEATURES
from .answer_types import expected_type, question_numbers, values
from .fusion import ScoredCandidate

TYPE_WINDOW = 3  # evidence items searched for a value of the asked-for type


def answerability_features(
    question: str, ranked: Sequence[ScoredCandidate], best_semantic: float, snapshot: Snapshot, route: str,
    idf: Callable[[str], float], frequency: Callable[[str], int],
) -> dict[str, float]:
    """Every feature of FEATURES for one query (a lexical-mode query has 0 cosines, and its model ignores them).
    `ranked`: the candidates best first (the ranking's head); `best_semantic`: the best cosine of any candidate;
    `idf` and `frequency`: a term's rarity and the number of the collection's texts holding it (BM25's)."""
    semantic = sorted((c.semantic for c in ranked), reverse=True)
    lexical = sorted((c.lexical for c in ranked), reverse=True)
    features = dict.fromkeys(FEATURES, 0.0)
    features.update(
        best_semantic=best_semantic,
        second_semantic=semantic[1] if len(semantic) > 1 else 0.0,
        best_lexical=lexical[0] if lexical else 0.0,
        second_lexical=lexical[1] if len(lexical) > 1 else 0.0,
        best_page_lexical=max((c.page_lexical for c in ranked), default=0.0),
    )
    features[f"route_{route}"] = 1.0
    wanted = frozenset(term for term in lexical_terms(question) if term not in STOP_WORDS)
    numbers = question_numbers(question)
    # what the collection never says: a name or a year no text of it holds
    features["unseen_terms"] = sum(frequency(term) == 0 for term in wanted) / len(wanted) if wanted else 0.0
    features["numbers_in_collection"] = sum(frequency(n) > 0 for n in numbers) / len(numbers) if numbers else 0.0
    features["numbers_asked"] = float(bool(numbers))
    features["question_terms"] = math.log1p(len(wanted))
    if not ranked:
        features["asked_type_missing"] = float(expected_type(question) not in ("other", "yes_no"))
        return features
    pages = snapshot.page_of_row
    best_page = int(pages[ranked[0].row])
    page_terms = frozenset(term for row in snapshot.page_rows[best_page].tolist()
                           for term in lexical_terms(snapshot.evidence[row].text))
    weights = {term: idf(term) for term in wanted}
    total = sum(weights.values())
    features["rare_terms_on_best_page"] = sum(w for term, w in weights.items() if term in page_terms) / total if total > 0 else 0.0
    features["numbers_on_best_page"] = len(numbers & page_terms) / len(numbers) if numbers else 0.0
    by_semantic = max(ranked, key=lambda c: (c.semantic, -c.row))
    by_lexical = max(ranked, key=lambda c: (c.lexical, -c.row))
    features["top_pages_agree"] = float(pages[by_semantic.row] == pages[by_lexical.row])
    asked = expected_type(question)
    if asked not in ("other", "yes_no"):
        # sentence by sentence, as the short answer reads them (a pattern over a whole table's text costs more)
        found = any(values(sentence.text, asked) for c in ranked[:TYPE_WINDOW]
                    for sentence in snapshot.evidence.answer_sentences(c.row).sentences)
        features["asked_type_missing"] = float(not found)
    return features
