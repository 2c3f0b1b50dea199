"""Query Complexity Router (AutoThinkRAG): question features -> Simple / Moderate / Complex, sub-questions and
the route's reasoning instruction.

The features follow the paper's three kinds: semantic (the intent: lookup, comparison, calculation, causal),
element (entities the knowledge graph knows, visual references, constraints) and dependency (cues of
cross-chunk or multi-step reasoning). They decide the route in the tiny profile (its router model has random
weights) and are always reported; with `router.mode = "model"` the router model in Triton decides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Collection, Optional, Sequence

from ..knowledge.graph.extraction import normalize_entity_name
from ..models.contracts import ROUTE_LABELS

# The reasoning path instruction of each route (AutoThinkRAG, section 3.3.2), worded for text and visual evidence.
INSTRUCTIONS = {
    "simple": "Extract the exact value or statement that answers the question from the evidence.",
    "moderate": "Calculate or compare using the evidence, including table and figure descriptions; show the steps.",
    "complex": "Integrate the text, table and figure evidence and reason step by step before giving the answer.",
}

_INTENT_PATTERNS = {
    "causal": r"\bwhy\b|\bcaus\w*|\breasons?\b|\bbecause\b|\blead to\b|\bled to\b|\bresult(?:ed)? in\b|\bdue to\b"
    r"|\bimpact\w*|\beffects?\b|\baffect\w*|\bexplain\w*|\bdrivers?\b",
    # operations, not the quantities a lookup asks for: "What percentage of adults ...?" reads a value
    "calculation": r"\bcalculate\w*|\bcompute\w*|\bsum of\b|\bin total\b|\baverage\b|\bmedian\b|\bratio\b"
    r"|\bgrowth rate\b|\bhow much (?:more|less|higher|lower)\b|\bcombined\b|\bgap\b|\brounded? to\b"
    r"|\bdifference in\b|\bby how much\b|\bchange(?:d)? (?:in|from|between)\b",
    "comparison": r"\bcompar\w*|\bversus\b|\bvs\.?\b|\bdiffer\w*|\b(?:higher|lower|more|less|larger|smaller|better|worse|"
    r"faster|slower) than\b|\b(?:fast|slow|high|low|larg|small|bigg|great|strong|weak|long|short|cheap|"
    r"earli|wid|deep|rich|poor)est\b|\bthe (?:most|least|best|worst)\b|\boutperform\w*|\brank\w*",
}
_INTENT_REGEXES = {name: re.compile(pattern) for name, pattern in _INTENT_PATTERNS.items()}  # compiled at import
_INTENT_WEIGHT = {"lookup": 0.0, "comparison": 1.5, "calculation": 1.5, "causal": 2.0}

# Words naming visual evidence, and the block types each one prefers (MinerU may file a chart as an image).
_VISUAL_WORDS = {
    "table": {"table": 1.0},
    "tables": {"table": 1.0},
    "row": {"table": 0.5},
    "column": {"table": 0.5},
    "chart": {"chart": 1.0, "image": 0.8},
    "charts": {"chart": 1.0, "image": 0.8},
    "graph": {"chart": 1.0, "image": 0.8},
    "plot": {"chart": 1.0, "image": 0.8},
    "figure": {"image": 1.0, "chart": 1.0},
    "figures": {"image": 1.0, "chart": 1.0},
    "fig": {"image": 1.0, "chart": 1.0},
    "diagram": {"image": 1.0, "chart": 0.8},
    "image": {"image": 1.0, "chart": 0.5},
    "picture": {"image": 1.0},
    "photo": {"image": 1.0},
    "illustration": {"image": 1.0},
    "map": {"image": 1.0},
    "equation": {"equation": 1.0},
    "formula": {"equation": 1.0},
}
_CONSTRAINTS = re.compile(
    r"\b(?:19|20)\d{2}\b|\b\d+(?:[.,]\d+)?%?|\bonly\b|\bat (?:least|most)\b|\bexcept\b|\bexcluding\b|\bincluding\b"
    r"|\bper\b|\beach\b|\bbefore\b|\bafter\b|\bduring\b|\bbetween\b|\bwithin\b|\bunder\b|\bover\b",
    re.I,
)
_DEPENDENCY = re.compile(
    r"\band (?:then|also)\b|\bthen\b|\bboth\b|\brespectively\b|\bacross\b|\bover time\b|\btrends?\b|\brelationship\b"
    r"|\bin relation to\b|\bcompared (?:with|to)\b|\bas well as\b|\bsince\b|\bwhich in turn\b",
    re.I,
)
_WH = re.compile(r"\b(?:what|who|whom|whose|when|where|which|why|how)\b", re.I)
# Clause boundaries a question can be split at: "...? ...", "..., and why ...", "... and when did ...".
_SPLIT = re.compile(r"\?\s+|;\s+|,?\s+and\s+(?=(?:what|who|whom|whose|when|where|which|why|how)\b)", re.I)
_WORD = re.compile(r"[\w][\w.&'-]*", re.UNICODE)
_POSSESSIVE = re.compile(r"['’]s$", re.I)
_MAX_ENTITY_WORDS = 5


@dataclass(frozen=True)
class QueryFeatures:
    intent: str  # lookup | comparison | calculation | causal (the heaviest one present)
    intents: tuple[str, ...]  # every intent whose cues are present
    entities: tuple[str, ...]  # knowledge-graph entity keys named in the question
    visual_references: int
    constraints: int
    dependency_cues: int
    questions: int  # wh-words: a question asking several things is several questions
    modalities: dict[str, float]  # preferred block type -> strength in [0, 1]; empty: no preference
    score: float  # the complexity score the feature route thresholds


@dataclass(frozen=True)
class RouteDecision:
    label: str  # simple | moderate | complex
    source: str  # features | model | fixed
    probabilities: tuple[float, float, float]  # over (simple, moderate, complex); one-hot unless from the model
    features: QueryFeatures
    sub_questions: tuple[str, ...]
    instruction: str


def query_features(question: str, entity_keys: Collection[str] = frozenset()) -> QueryFeatures:
    text = " ".join(question.split())
    lowered = text.casefold()
    intents = tuple(name for name, pattern in _INTENT_REGEXES.items() if pattern.search(lowered))
    intent = max(intents, key=_INTENT_WEIGHT.__getitem__) if intents else "lookup"
    words = [w.strip(".").casefold() for w in _WORD.findall(text)]
    modalities: dict[str, float] = {}
    visual = 0
    for word in words:
        preference = _VISUAL_WORDS.get(word)
        if preference:
            visual += 1
            for block_type, strength in preference.items():
                modalities[block_type] = max(modalities.get(block_type, 0.0), strength)
    entities = matched_entities(text, entity_keys)
    constraints = len(_CONSTRAINTS.findall(text))
    dependency = len(_DEPENDENCY.findall(text))
    questions = max(1, len(_WH.findall(text)))
    reasoning = (
        _INTENT_WEIGHT[intent]
        + 0.5 * max(0, len(intents) - 1)
        + 1.0 * min(dependency, 2)
        + 2.0 * min(questions - 1, 2)
    )
    elements = (
        0.5 * max(0, len(entities) - 1)
        + 0.75 * min(visual, 2)
        + 0.5 * min(constraints, 2)
        + (1.0 if len(words) > 25 else 0.0)
    )
    # What a question names (entities, a date, a number, a chart) says how precisely it must match, not how much
    # it must reason: it raises the route of a question that compares, calculates, explains or asks several
    # things, and leaves a lookup Simple ("What was the total of X as of December 31, 2022?").
    score = reasoning + (elements if reasoning > 0 else 0.0)
    return QueryFeatures(intent, intents, entities, visual, constraints, dependency, questions, modalities, score)


def matched_entities(text: str, entity_keys: Collection[str]) -> tuple[str, ...]:
    """Entity keys named in the text: longest word runs first, never overlapping (hard match, as at ingest)."""
    if not entity_keys:
        return ()
    words = [_POSSESSIVE.sub("", word) for word in _WORD.findall(text)]
    found: list[str] = []
    start = 0
    while start < len(words):
        for length in range(min(_MAX_ENTITY_WORDS, len(words) - start), 0, -1):
            key = normalize_entity_name(" ".join(words[start : start + length]))
            if key and key in entity_keys:
                if key not in found:
                    found.append(key)
                start += length
                break
        else:
            start += 1
    return tuple(found)


def label_from_score(score: float, moderate_at: float, complex_at: float) -> str:
    if score >= complex_at:
        return "complex"
    return "moderate" if score >= moderate_at else "simple"


def sub_questions(question: str, limit: int) -> tuple[str, ...]:
    """The question's clauses as questions of their own, when it asks several things; () otherwise."""
    if limit <= 0:
        return ()
    parts = [p.strip(" ,;?") for p in _SPLIT.split(" ".join(question.split()))]
    parts = [p for p in parts if len(p.split()) >= 2]
    if len(parts) < 2:
        return ()
    return tuple(f"{p[0].upper()}{p[1:]}?" for p in parts[:limit])


def decide(
    question: str,
    features: QueryFeatures,
    mode: str,
    *,
    fixed_route: str = "complex",
    moderate_at: float = 2.0,
    complex_at: float = 4.0,
    model_probabilities: Optional[Sequence[float]] = None,
    max_sub_questions: int = 3,
    decompose: Optional[dict[str, bool]] = None,
) -> RouteDecision:
    """The route from the features (mode "features"), the router model's probabilities ("model"), or fixed."""
    labels = ROUTE_LABELS
    if mode == "model":
        if model_probabilities is None or len(model_probabilities) != 3:
            raise ValueError("the model route needs the router's three probabilities")
        probabilities = tuple(float(p) for p in model_probabilities)
        label = labels[max(range(3), key=lambda i: (probabilities[i], -i))]
    else:
        label = fixed_route if mode == "fixed" else label_from_score(features.score, moderate_at, complex_at)
        probabilities = tuple(1.0 if name == label else 0.0 for name in labels)
    splits = sub_questions(question, max_sub_questions) if (decompose or {}).get(label, label != "simple") else ()
    return RouteDecision(label, mode, probabilities, features, splits, INSTRUCTIONS[label])  # type: ignore[arg-type]
