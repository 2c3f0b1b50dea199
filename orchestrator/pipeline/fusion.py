"""Fusion of the retrieval signals into one score per candidate (RAG-Anything's hybrid ranking).

Every signal arrives in [0, 1] with a meaning of its own, not relative to the other candidates: semantic =
cosine (negative clipped to 0), lexical = how much of the question's content a text matches (BM25 over the
question's IDF mass), structural = the mean PageRank of the graph nodes extracted from it, modality = how much
the question prefers its block type. Scaling by the best candidate instead would give a weak signal's best hit
full marks (a text sharing one word with a paraphrased question, a table with many loosely related entities),
which the retrieval-quality benchmark showed costs more than it brings. The fused score is their weighted mean
over the signals that ran, so it stays in [0, 1] whatever is switched off, and the final score blends in the
cross-encoder when it ran.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence


@dataclass
class CandidateSignals:
    """Raw signals of one evidence record, as the retrieval stages found them."""

    semantic: float = 0.0  # best cosine with the question or a sub-question
    lexical: float = 0.0  # best BM25 score over the question's IDF mass, at most 1
    structural: float = 0.0  # mean PageRank of the graph nodes extracted from it
    found_by: set[str] = field(default_factory=set)  # dense | sparse | graph


@dataclass(frozen=True)
class FusionWeights:
    semantic: float
    lexical: float
    structural: float
    modality: float


@dataclass(frozen=True)
class ScoredCandidate:
    row: int  # evidence row of the snapshot
    semantic: float
    lexical: float
    structural: float
    modality: float
    fused: float
    found_by: tuple[str, ...]
    rerank: Optional[float] = None  # the cross-encoder's raw score, when it ran
    final: float = 0.0  # what the ranking uses: fused, blended with sigmoid(rerank) when it ran


def fuse(
    candidates: Mapping[int, CandidateSignals],
    block_types: Mapping[int, str],
    modality_preference: Mapping[str, float],
    weights: FusionWeights,
) -> list[ScoredCandidate]:
    """Candidates best first (ties: lower row first, so the order is deterministic)."""
    if not candidates:
        return []
    total = weights.semantic + weights.lexical + weights.structural + (weights.modality if modality_preference else 0.0)
    scored = []
    for row, signals in candidates.items():
        semantic = min(1.0, max(0.0, signals.semantic))
        lexical = min(1.0, max(0.0, signals.lexical))
        structural = min(1.0, max(0.0, signals.structural))
        modality = float(modality_preference.get(block_types[row], 0.0))
        weighted = (
            weights.semantic * semantic
            + weights.lexical * lexical
            + weights.structural * structural
            + (weights.modality * modality if modality_preference else 0.0)
        )
        fused = weighted / total if total > 0 else 0.0
        scored.append(ScoredCandidate(row, semantic, lexical, structural, modality, fused, tuple(sorted(signals.found_by)), final=fused))
    scored.sort(key=lambda c: (-c.final, c.row))
    return scored


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def blend_rerank(candidates: Sequence[ScoredCandidate], scores: Sequence[float], weight: float) -> list[ScoredCandidate]:
    """The reranked candidates (scores row-aligned) best first: final = (1 - w) * fused + w * sigmoid(score)."""
    if len(candidates) != len(scores):
        raise ValueError(f"{len(scores)} rerank scores for {len(candidates)} candidates")
    blended = [
        ScoredCandidate(
            c.row, c.semantic, c.lexical, c.structural, c.modality, c.fused, c.found_by, float(score),
            (1.0 - weight) * c.fused + weight * sigmoid(float(score)),
        )
        for c, score in zip(candidates, scores)
    ]
    blended.sort(key=lambda c: (-c.final, c.row))
    return blended
