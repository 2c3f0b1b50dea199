"""Graph neighbourhood expansion: from the entities a question matches to the evidence around them.

Seeds (entities matched by name or by embedding, weighted by similarity) -> their k-hop neighbourhood in the
knowledge graph (capped, best-connected nodes first) -> personalized PageRank on that neighbourhood -> each
chunk or unit scores the mean PageRank of the nodes extracted from it (a unit is a node itself). Structure
thus ranks evidence that is central to the question's entities even when it shares no words with it; the
mean, not the sum, keeps a table listing forty loosely related names from outranking the one paragraph about
the entity asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
from scipy import sparse

from ..knowledge.graph import KnowledgeGraph


@dataclass(frozen=True)
class GraphExpansion:
    seeds: dict[int, float] = field(default_factory=dict)  # node -> teleport weight
    nodes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # the neighbourhood
    node_scores: np.ndarray = field(default_factory=lambda: np.zeros(0))  # PageRank of each neighbourhood node
    evidence_scores: np.ndarray = field(default_factory=lambda: np.zeros(0))  # structural score per evidence row

    def score(self, row: int) -> float:
        return float(self.evidence_scores[row]) if row < len(self.evidence_scores) else 0.0

    def best(self, k: int) -> list[int]:
        """The k best-scoring evidence rows (ties: lower row first); rows scoring nothing are never returned."""
        rows = np.flatnonzero(self.evidence_scores > 0)
        if k <= 0 or not len(rows):
            return []
        if len(rows) > k:
            rows = rows[np.argpartition(-self.evidence_scores[rows], k - 1)[:k]]
        return [int(r) for r in rows[np.lexsort((rows, -self.evidence_scores[rows]))]]


def seed_nodes(graph: KnowledgeGraph, entity_weights: Mapping[str, float]) -> dict[int, float]:
    """Entity keys -> graph nodes (keys the graph does not hold are dropped); the largest weight wins."""
    seeds: dict[int, float] = {}
    for key, weight in entity_weights.items():
        node = graph.entity_index.get(key)
        if node is not None and weight > 0:
            seeds[node] = max(seeds.get(node, 0.0), float(weight))
    return seeds


def expand(
    graph: KnowledgeGraph,
    node_evidence: sparse.csr_matrix,
    nodes_per_evidence: np.ndarray,
    seeds: Mapping[int, float],
    hops: int,
    max_nodes: int,
    damping: float = 0.85,
    scoring_nodes: int = 0,
) -> GraphExpansion:
    """`nodes_per_evidence`: the column sums of `node_evidence` (the denominator of each evidence's mean).
    `scoring_nodes` > 0: only that many nodes, highest PageRank first, pass their score on to the evidence.
    The tail of a big neighbourhood holds little mass but hub entities named in thousands of chunks, which
    would make this step grow with the collection instead of with the question."""
    if not seeds or graph.node_count == 0:
        return GraphExpansion()
    ordered = sorted(seeds, key=lambda node: (-seeds[node], node))  # the strongest seeds survive a cap
    nodes, _ = graph.neighbourhood(ordered, hops, max_nodes)
    scores = graph.personalized_pagerank(dict(seeds), damping=damping, restrict_to=nodes)[nodes]
    scoring = np.arange(len(nodes))
    if 0 < scoring_nodes < len(nodes):
        scoring = np.argpartition(-scores, scoring_nodes - 1)[:scoring_nodes]
    mass = np.asarray(node_evidence[nodes[scoring]].T @ scores[scoring]).ravel()
    mean = np.divide(mass, nodes_per_evidence, out=np.zeros_like(mass), where=nodes_per_evidence > 0)
    return GraphExpansion(dict(seeds), nodes, scores, mean)
