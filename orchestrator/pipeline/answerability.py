"""Answerability: how likely the retrieved evidence is to answer the question, as a calibrated probability.

A fixed threshold on the best cosine separated the dev PDFs' unanswerable questions no better than chance (AUC
0.50). Here a small logistic model reads what retrieval found: the best and second cosines and lexical matches,
the best page's match, how much of the question's rare words and numbers the best page holds, whether the dense
and lexical top pages agree, whether the evidence holds a value of the type asked for, and the route. It is
fitted offline by `python -m thinkserve_bench.scripts.answerability` on labelled questions (cross-validated by document) and
shipped beside this module as a versioned JSON file: one model per retrieval mode (lexical mode has no cosine).
The same `answerability_features` compute the features here and, through the Retrieve response that reports
them, for the training: what the model was fitted on is what it reads when serving.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from ..config import ROUTE_NAMES
from ..knowledge.parsing.text import lexical_terms
from ..knowledge.storage.snapshot import Snapshot
from ..knowledge.parsing.text import STOP_WORDS
from .answer_types import expected_type, question_numbers, values
from .fusion import ScoredCandidate

MODEL_FILE = Path(__file__).with_name("answerability-v1.json")
SEMANTIC_FEATURES = ("best_semantic", "second_semantic", "top_pages_agree")
FEATURES = (
    "best_semantic", "second_semantic", "best_lexical", "second_lexical", "best_page_lexical", "rare_terms_on_best_page",
    "numbers_asked", "numbers_on_best_page", "numbers_in_collection", "unseen_terms", "question_terms", "top_pages_agree",
    "asked_type_missing",
    *(f"route_{route}" for route in ROUTE_NAMES),
)
LEXICAL_FEATURES = tuple(name for name in FEATURES if name not in SEMANTIC_FEATURES)
TYPE_WINDOW = 3  # evidence items searched for a value of the asked-for type


@dataclass(frozen=True, eq=False)
class AnswerabilityModel:
    """Logistic regression over standardised features: P(answerable) = sigmoid(coef . (x - mean) / scale + b), and
    the threshold fitted with it (refused below)."""

    features: tuple[str, ...]
    mean: np.ndarray
    scale: np.ndarray
    coefficients: np.ndarray
    intercept: float
    threshold: float = 0.5

    def probability(self, features: Mapping[str, float]) -> float:
        x = np.asarray([features[name] for name in self.features], dtype=np.float64)
        z = float(self.coefficients @ ((x - self.mean) / self.scale)) + self.intercept
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))

    def to_json(self) -> dict:
        return {"features": list(self.features), "mean": self.mean.tolist(), "scale": self.scale.tolist(),
                "coefficients": self.coefficients.tolist(), "intercept": self.intercept, "threshold": self.threshold}

    @classmethod
    def from_json(cls, data: Mapping) -> "AnswerabilityModel":
        features = tuple(data["features"])
        unknown = set(features) - set(FEATURES)
        if unknown:
            raise ValueError(f"answerability model reads unknown features {sorted(unknown)}")
        arrays = [np.asarray(data[key], dtype=np.float64) for key in ("mean", "scale", "coefficients")]
        if any(array.shape != (len(features),) for array in arrays) or not (arrays[1] > 0).all():
            raise ValueError("answerability model: mean, scale and coefficients must have one positive-scale entry per feature")
        threshold = float(data["threshold"])
        if not 0 <= threshold <= 1:
            raise ValueError(f"answerability model: threshold {threshold} is not a probability")
        return cls(features, *arrays, float(data["intercept"]), threshold)


@dataclass(frozen=True)
class AnswerabilityModels:
    """The shipped file: its version and one model per retrieval mode."""

    version: str
    models: Mapping[str, AnswerabilityModel]  # full | lexical

    def model(self, mode: str) -> AnswerabilityModel:
        return self.models[mode]


@functools.lru_cache(maxsize=4)
def load_models(path: Optional[Path] = None) -> AnswerabilityModels:
    """The models of an answerability file (None: the one shipped with the code), read once."""
    path = path or MODEL_FILE
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    models = {mode: AnswerabilityModel.from_json(entry) for mode, entry in data["models"].items()}
    if set(models) != {"full", "lexical"}:
        raise ValueError(f"{path}: an answerability file holds a full and a lexical model, not {sorted(models)}")
    if any(name in SEMANTIC_FEATURES for name in models["lexical"].features):
        raise ValueError(f"{path}: the lexical model cannot read cosines (lexical mode has none)")
    return AnswerabilityModels(str(data["version"]), models)


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
