"""The answerability model as the service ships and reads it: the features it reads, a logistic regression per
retrieval mode with its refusal threshold, and the versioned JSON file it travels in (answerability-v1.json beside
this module). Serving computes the features (pipeline/answerability.py); the training that writes the file is the
model compiler's (`thinkserve-build train-answerability`)."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

import numpy as np

from ..config import ROUTE_NAMES

MODEL_FILE = Path(__file__).with_name("answerability-v1.json")
SEMANTIC_FEATURES = ("best_semantic", "second_semantic", "top_pages_agree")
FEATURES = (
    "best_semantic", "second_semantic", "best_lexical", "second_lexical", "best_page_lexical", "rare_terms_on_best_page",
    "numbers_asked", "numbers_on_best_page", "numbers_in_collection", "unseen_terms", "question_terms", "top_pages_agree",
    "asked_type_missing",
    *(f"route_{route}" for route in ROUTE_NAMES),
)
LEXICAL_FEATURES = tuple(name for name in FEATURES if name not in SEMANTIC_FEATURES)


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
