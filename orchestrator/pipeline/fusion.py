"""Fusion of the retrieval signals into one score per candidate (RAG-Anything's hybrid ranking).

Every signal arrives in [0, 1] with a meaning of its own, not relative to the other candidates: semantic =
cosine (negative clipped to 0), lexical = how much of the question's content a passage matches (BM25 over the
question's IDF mass), page_lexical = the same for the whole page the candidate is on, structural = the mean
PageRank of the graph nodes extracted from it, modality = how much the question prefers its block type.

Two ways to combine them (retrieval.fusion):
- "weighted", the default: the weighted mean of the values, the two lexical ones raised to lexical_exponent
  first (2: a text matching half of the question's content counts a quarter of one matching all of it). A
  paraphrase shares a word or two with many wrong pages; squared, those partial matches stop outvoting the
  cosine, while a page that holds the question's words still counts nearly in full.
- "rrf", reciprocal rank fusion: each signal ranks the candidates it found (a score above 0) and a candidate
  scores the weighted sum of 1 / (rrf_k + rank); modality adds its weight times the preference at rank 1. It
  needs no common scale, but it gives the best of weak matches a full first rank: on the generated corpus a
  paraphrase sharing one word with a wrong page was answered from that page (hybrid Recall@1 0.62 against
  0.89 weighted, benchmarks/results/retrieval_quality-rrf/), while on the real PDFs the two are within noise
  of each other (R@1/R@5 0.416/0.652 against 0.404/0.664, benchmarks/results/mmlongbench-dev/document_qa-rrf.md).
Either way the fused score is divided by the most a candidate could score, so it lies in [0, 1] whatever is
switched off, and the final score blends in the cross-encoder when it ran.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import numpy as np

FUSION_METHODS = ("weighted", "rrf")
LEXICAL_SIGNALS = ("lexical", "page_lexical")
SIGNALS = ("semantic", "lexical", "page_lexical", "structural")


SOURCES = ("dense", "graph", "page_lexical", "sparse")  # what can find a candidate, in sorted order


@dataclass
class CandidateSignals:
    """Raw signals of one evidence record, as the retrieval stages found them."""

    semantic: float = 0.0  # best cosine with the question or a sub-question
    lexical: float = 0.0  # best BM25 score over the question's IDF mass (reported clipped to 1)
    page_lexical: float = 0.0  # the same for the page it is on
    structural: float = 0.0  # mean PageRank of the graph nodes extracted from it
    found_by: set[str] = field(default_factory=set)  # dense | sparse | page_lexical | graph


@dataclass(frozen=True)
class CandidateTable:
    """Every candidate's raw signals as columns, one entry per evidence row: what retrieval builds with numpy
    (no Python object per candidate until the ranked ones are handed out)."""

    rows: np.ndarray  # evidence rows, int64
    semantic: np.ndarray  # float64 columns, as in CandidateSignals
    lexical: np.ndarray
    page_lexical: np.ndarray
    structural: np.ndarray
    found_by: np.ndarray  # bool [rows, len(SOURCES)]: which source found each

    @classmethod
    def of(cls, candidates: Mapping[int, CandidateSignals]) -> "CandidateTable":
        rows = list(candidates)
        column = lambda name: np.asarray([getattr(candidates[row], name) for row in rows], dtype=np.float64)  # noqa: E731
        found = np.asarray([[source in candidates[row].found_by for source in SOURCES] for row in rows], dtype=bool)
        return cls(np.asarray(rows, dtype=np.int64), column("semantic"), column("lexical"), column("page_lexical"),
                   column("structural"), found.reshape(len(rows), len(SOURCES)))

    def __len__(self) -> int:
        return len(self.rows)

    def best_semantic(self) -> float:
        """The best cosine of any candidate (negative ones count as 0, as fusion reports them)."""
        return float(np.clip(self.semantic, 0.0, 1.0).max()) if len(self.rows) else 0.0


# found_by of each combination of SOURCES (bit i set: SOURCES[i] found it), sorted as the sources are
_FOUND_BY = tuple(tuple(source for bit, source in enumerate(SOURCES) if code >> bit & 1) for code in range(1 << len(SOURCES)))


@dataclass(frozen=True)
class FusionWeights:
    semantic: float
    lexical: float
    structural: float
    modality: float
    page_lexical: float = 0.0
    method: str = "weighted"  # weighted | rrf
    rrf_k: float = 60.0
    lexical_exponent: float = 1.0  # weighted: the lexical signals are raised to this power before weighing


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
    page_lexical: float = 0.0


def fuse(
    candidates: Mapping[int, CandidateSignals] | CandidateTable,
    block_types: Mapping[int, str],
    modality_preference: Mapping[str, float],
    weights: FusionWeights,
    limit: Optional[int] = None,
) -> list[ScoredCandidate]:
    """Candidates best first (ties: lower row first, so the order is deterministic); with `limit`, only that
    many. `block_types` (of every candidate) is read only when there is a modality preference."""
    table = candidates if isinstance(candidates, CandidateTable) else CandidateTable.of(candidates)
    if not len(table):
        return []
    if weights.method not in FUSION_METHODS:
        raise ValueError(f"unknown fusion method {weights.method!r} ({', '.join(FUSION_METHODS)})")
    rows = table.rows
    raw = {name: getattr(table, name) for name in SIGNALS}
    values = {name: np.clip(raw[name], 0.0, 1.0) for name in SIGNALS}
    values["modality"] = (
        np.asarray([float(modality_preference.get(block_types[row], 0.0)) for row in rows.tolist()]) if modality_preference
        else np.zeros(len(rows))
    )
    signal_weights = {name: getattr(weights, name) for name in SIGNALS}
    signal_weights["modality"] = weights.modality if modality_preference else 0.0
    total = sum(signal_weights.values())
    if total <= 0:
        fused = np.zeros(len(rows))
    elif weights.method == "rrf":
        # ranks come from the raw values: two passages matching more than the question's IDF mass are both 1.0
        # once clipped, but the one matching more still ranks first
        top = 1.0 / (weights.rrf_k + 1)  # what rank 1 earns
        fused = sum(
            weight * (values[name] * top if name == "modality" else reciprocal_ranks(raw[name], weights.rrf_k))
            for name, weight in signal_weights.items() if weight > 0
        ) / (total * top)
    else:
        fused = sum(
            weight * (values[name] ** weights.lexical_exponent if name in LEXICAL_SIGNALS else values[name])
            for name, weight in signal_weights.items()
        ) / total
    fused = np.broadcast_to(np.asarray(fused, dtype=np.float64), (len(rows),))
    order = np.lexsort((rows, -fused))[:limit]  # best first, ties: lower row first
    semantic, lexical, structural, modality, page_lexical = (
        values[name][order].tolist() for name in ("semantic", "lexical", "structural", "modality", "page_lexical")
    )
    codes = (table.found_by[order] * (1 << np.arange(len(SOURCES)))).sum(axis=1).tolist()
    return [
        ScoredCandidate(row, semantic[i], lexical[i], structural[i], modality[i], score, _FOUND_BY[codes[i]],
                        final=score, page_lexical=page_lexical[i])
        for i, (row, score) in enumerate(zip(rows[order].tolist(), fused[order].tolist()))
    ]


def reciprocal_ranks(scores: np.ndarray, k: float) -> np.ndarray:
    """1 / (k + rank) of every score above 0 (rank 1 the highest; ties share the better rank), 0 for the rest."""
    scores = np.asarray(scores, dtype=np.float64)
    found = scores > 0
    ordered = np.sort(scores[found])[::-1]
    ranks = np.searchsorted(-ordered, -scores, side="left") + 1  # how many score strictly higher, plus one
    return np.where(found, 1.0 / (k + ranks), 0.0)


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def blend_rerank(candidates: Sequence[ScoredCandidate], scores: Sequence[float], weight: float) -> list[ScoredCandidate]:
    """The reranked candidates (scores row-aligned) best first: final = (1 - w) * fused + w * sigmoid(score)."""
    if len(candidates) != len(scores):
        raise ValueError(f"{len(scores)} rerank scores for {len(candidates)} candidates")
    blended = [
        ScoredCandidate(
            c.row, c.semantic, c.lexical, c.structural, c.modality, c.fused, c.found_by, float(score),
            (1.0 - weight) * c.fused + weight * sigmoid(float(score)), c.page_lexical,
        )
        for c, score in zip(candidates, scores)
    ]
    blended.sort(key=lambda c: (-c.final, c.row))
    return blended
