"""Graph neighbourhood expansion: from the entities a question matches to the evidence around them.

Seeds (entities matched by name or by embedding, weighted by similarity) -> their k-hop neighbourhood in the
knowledge graph (capped, best-connected nodes first) -> personalized PageRank on that neighbourhood -> each
chunk or unit scores the PageRank mass of the nodes extracted from it (a unit is a node itself). Structure
thus ranks evidence that is central to the question's entities even when it shares no words with it.
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
    evidence_scores: dict[int, float] = field(default_factory=dict)  # evidence row -> structural score


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
    seeds: Mapping[int, float],
    hops: int,
    max_nodes: int,
    damping: float = 0.85,
) -> GraphExpansion:
    if not seeds or graph.node_count == 0:
        return GraphExpansion()
    ordered = sorted(seeds, key=lambda node: (-seeds[node], node))  # the strongest seeds survive a cap
    nodes = np.fromiter((node for node, _ in graph.k_hop(ordered, hops, max_nodes)), dtype=np.int64)
    scores = graph.personalized_pagerank(dict(seeds), damping=damping, restrict_to=nodes)[nodes]
    mass = np.asarray(node_evidence[nodes].T @ scores).ravel()
    rows = np.flatnonzero(mass > 0)
    return GraphExpansion(dict(seeds), nodes, scores, {int(row): float(mass[row]) for row in rows})
