"""The collection's knowledge graph: entities merged across documents, multimodal units as anchor nodes.

RAG-Anything's dual graph in one structure: entity nodes joined by "related" edges (from text chunks and unit
descriptions alike) and unit nodes (images, tables, equations, charts) joined to the entities extracted from
their descriptions by "belongs_to" edges. Entities merge on the hard-match key (`normalize_entity_name`).

This module is the graph as queries read it: node and edge tables plus a symmetric weighted scipy.sparse CSR
adjacency, the source of truth for traversal and personalized PageRank (its engines: pagerank.py). It is
derived data, made in memory from the per-document records by merge.py: built when a collection is opened,
extended when a commit appends a document, cut down when one is deleted or replaced.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Iterable, Literal, Mapping, Optional, Protocol, Sequence

import numpy as np
import scipy.sparse as sp

from . import pagerank as engines
from ..sparse_kernels import induced_submatrix, row_entries, row_sums

log = logging.getLogger(__name__)

ENTITY = "entity"
UNIT = "unit"
RELATED = "related"
BELONGS_TO = "belongs_to"
IMPLICIT_TYPE = "concept"  # entities only named by a relation or a belongs_to link
UNKNOWN_UNIT_TYPE = "unknown"  # units only named by a belongs_to link


class EntityMentionRecord(Protocol):
    """What the graph reads of an entity mention (segments.EntityMention has these fields)."""

    key: str  # normalised name
    name: str  # as written
    type: str
    description: str
    evidence_id: str  # the chunk or unit it was extracted from


class RelationMentionRecord(Protocol):
    """What the graph reads of a relation mention (segments.RelationMention has these fields)."""

    source: str  # entity keys
    target: str
    description: str
    keywords: str
    weight: float
    evidence_id: str


@dataclass(frozen=True)
class MultimodalUnit:
    unit_id: str  # the unit's evidence id, e.g. "<document id>:u3"
    type: str  # image, table, equation, chart
    description: str = ""


@dataclass(frozen=True)
class DocumentGraph:
    """One document's contribution to the graph, as stored with the document."""

    document_id: str
    entities: Sequence[EntityMentionRecord] = ()
    relations: Sequence[RelationMentionRecord] = ()
    units: Sequence[MultimodalUnit] = ()
    belongs_to: Sequence[tuple[str, str]] = ()  # (entity key, unit id)

    @classmethod
    def from_mentions(
        cls,
        document_id: str,
        entities: Sequence[EntityMentionRecord],
        relations: Sequence[RelationMentionRecord],
        units: Sequence[MultimodalUnit],
    ) -> "DocumentGraph":
        """belongs_to links derived as RAG-Anything does: the entities extracted from a unit's description."""
        unit_ids = {u.unit_id for u in units}
        links = list(dict.fromkeys((m.key, m.evidence_id) for m in entities if m.evidence_id in unit_ids and m.key))
        return cls(document_id, entities, relations, units, links)


@dataclass(frozen=True)
class NodeTable:
    """Columns of the nodes; a node's id is its row, in the order the documents first named them (entities and
    units alike), so that appending a document only adds rows."""

    kind: list[str]  # ENTITY | UNIT
    key: list[str]  # entity key, or unit id
    name: list[str]  # most frequent written form; the unit id for units
    type: list[str]
    description: list[str]
    documents: list[tuple[str, ...]]  # documents mentioning it, in input order
    evidence: list[tuple[str, ...]]  # chunks / units it was extracted from (for units: the unit itself)

    def __len__(self) -> int:
        return len(self.key)


@dataclass(frozen=True)
class EdgeTable:
    """Columns of the undirected edges, in the order first seen: "related" (src and dst the pair's keys in sorted
    order) and belongs_to (entity, unit)."""

    src: np.ndarray  # int64 node ids
    dst: np.ndarray
    kind: list[str]  # RELATED | BELONGS_TO
    weight: np.ndarray  # float64: summed relation weights; belongs_to_weight for belongs_to edges
    description: list[str]
    keywords: list[str]
    documents: list[tuple[str, ...]]
    evidence: list[tuple[str, ...]]

    def __len__(self) -> int:
        return len(self.src)


@dataclass
class KnowledgeGraph:
    nodes: NodeTable
    edges: EdgeTable
    adjacency: sp.csr_matrix  # symmetric, weighted, sorted indices
    entity_index: dict[str, int]  # entity key -> node id
    unit_index: dict[str, int]  # unit id -> node id
    documents: tuple[str, ...]
    _edge_of_entry: np.ndarray = field(repr=False)  # edge id of each stored entry of `adjacency`
    # merge.py's merged tables, which appended_graph extends (typed loosely: merge.py imports this module)
    _merged: Optional[object] = field(default=None, repr=False)
    # made by appended_graph or graph_without: the documents of the graph it was made from, and for each node the
    # node of that graph whose row it kept (-1: made again), what a node x evidence table of that graph can reuse
    carried_from: Optional[tuple[tuple[str, ...], np.ndarray]] = field(default=None, repr=False)

    @property
    def node_count(self) -> int:
        return len(self.nodes)

    @functools.cached_property
    def degree(self) -> np.ndarray:
        """Distinct neighbours per node: structural importance (LightRAG's node rank)."""
        return np.diff(self.adjacency.indptr).astype(np.int64)

    @functools.cached_property
    def weighted_degree(self) -> np.ndarray:
        return np.asarray(self.adjacency.sum(axis=1)).ravel()

    def node(self, key: str) -> Optional[int]:
        """The node of an entity key or, failing that, of a unit id."""
        found = self.entity_index.get(key)
        return found if found is not None else self.unit_index.get(key)

    def neighbors(self, node: int) -> np.ndarray:
        """Neighbouring node ids, ascending."""
        self._check(node)
        return self.adjacency.indices[self.adjacency.indptr[node] : self.adjacency.indptr[node + 1]].astype(np.int64)

    def incident_edges(self, node: int) -> np.ndarray:
        """Edge ids (rows of `edges`) touching `node`, in the order of `neighbors(node)`."""
        self._check(node)
        return self._edge_of_entry[self.adjacency.indptr[node] : self.adjacency.indptr[node + 1]]

    def edge_between(self, a: int, b: int) -> Optional[int]:
        neighbours = self.neighbors(a)
        at = int(np.searchsorted(neighbours, b))
        if at < len(neighbours) and neighbours[at] == b:
            return int(self._edge_of_entry[self.adjacency.indptr[a] + at])
        return None

    def k_hop(self, seed_nodes: Iterable[int], hops: int, max_nodes: Optional[int] = None) -> list[tuple[int, int]]:
        """(node, hop distance) within `hops` of the seeds, by breadth-first search on the CSR rows.

        Seeds come first in the order given (hop 0); each further hop lists its new nodes by the total weight
        of their edges to the previous hop, heaviest first, then by node id: the order is deterministic and the
        best-connected nodes survive a `max_nodes` cut.
        """
        nodes, distances = self.neighbourhood(seed_nodes, hops, max_nodes)
        return list(zip(nodes.tolist(), distances.tolist()))

    def neighbourhood(
        self, seed_nodes: Iterable[int], hops: int, max_nodes: Optional[int] = None, blocked: Optional[np.ndarray] = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """k_hop as two arrays (nodes, hop distances): no Python object per node, for the query path.

        `blocked` (a mask over the nodes) names nodes the search neither enters nor leaves: a blocked seed is
        kept, but nothing is reached through it."""
        seeds = np.asarray(list(dict.fromkeys(int(s) for s in seed_nodes)), dtype=np.int64)
        if len(seeds) and (seeds.min() < 0 or seeds.max() >= self.node_count):
            self._check(int(seeds.min()) if seeds.min() < 0 else int(seeds.max()))
        limit = self.node_count if max_nodes is None else max(0, max_nodes)
        kept = seeds[:limit]
        found, distances = [kept], [np.zeros(len(kept), dtype=np.int64)]
        total = len(kept)
        visited = np.zeros(self.node_count, dtype=bool) if blocked is None else blocked.copy()
        frontier = kept if blocked is None else kept[~blocked[kept]]
        visited[kept] = True
        indptr, indices, data = self.adjacency.indptr, self.adjacency.indices, self.adjacency.data
        for hop in range(1, hops + 1):
            if total >= limit or not len(frontier):
                break
            entries = row_entries(indptr, frontier)
            if not len(entries):
                break
            # per node, the weight of its edges to the frontier (summed in entry order, as np.unique's inverse
            # would sum them): dense over the graph's nodes, cheaper than sorting a two-hop frontier's entries
            reached = indices[entries]
            strength = np.bincount(reached, weights=data[entries], minlength=self.node_count)
            new = np.zeros(self.node_count, dtype=bool)
            new[reached] = True
            candidates = np.flatnonzero(new & ~visited)
            strength = strength[candidates]
            order = np.lexsort((candidates, -strength))[: limit - total]
            frontier = candidates[order].astype(np.int64)
            visited[frontier] = True
            found.append(frontier)
            distances.append(np.full(len(frontier), hop, dtype=np.int64))
            total += len(frontier)
        return np.concatenate(found), np.concatenate(distances)

    def personalized_pagerank(
        self,
        seeds: Optional[Mapping[int, float]],
        damping: float = 0.85,
        max_iter: int = 100,
        tol: float = 1e-6,
        restrict_to: Optional[Iterable[int]] = None,
        backend: Literal["auto", "cpu", "gpu"] = "auto",
    ) -> np.ndarray:
        """PageRank teleporting to the seeds (weights normalised), one score per node of the graph.

        networkx.pagerank's iteration exactly: start uniform, x <- d (x P + dangling mass * p) + (1 - d) p with
        P the row-normalised adjacency, stop when the L1 change is below n * tol (or after max_iter, keeping
        the last iterate). Dangling nodes teleport to the seed distribution. No seeds (or all zero): global
        PageRank. `restrict_to`: the same on the induced subgraph (e.g. a k-hop neighbourhood); nodes outside
        it score 0 and seeds outside it are ignored. On the CPU a neighbourhood's runs compiled (engines.compiled_kernels(),
        where numba is installed: 0.7 against 1.25 ms on a 500-node one), with bit-identical scores.
        """
        if not 0 <= damping < 1:
            raise ValueError(f"damping must be in [0, 1), not {damping}")
        n = self.node_count
        if restrict_to is None:
            members: Optional[np.ndarray] = None
            size = n
        else:
            members = np.unique(np.asarray(restrict_to if isinstance(restrict_to, np.ndarray) else list(restrict_to), dtype=np.int64))
            if len(members) and (members[0] < 0 or members[-1] >= n):
                raise IndexError(f"restrict_to names nodes outside 0..{n - 1}")
            size = len(members)
        scores = np.zeros(n)
        if size == 0:
            return scores

        teleport = np.zeros(size)
        seed_ids = np.fromiter((int(node) for node in seeds or {}), dtype=np.int64, count=len(seeds or {}))
        weights = np.fromiter((float(weight) for weight in (seeds or {}).values()), dtype=np.float64, count=len(seed_ids))
        bad = ~np.isfinite(weights) | (weights < 0)
        if bad.any():
            at = int(np.flatnonzero(bad)[0])
            raise ValueError(f"seed weights must be finite and non-negative, not {weights[at]} (node {seed_ids[at]})")
        outside = (seed_ids < 0) | (seed_ids >= n)
        if outside.any():
            self._check(int(seed_ids[outside][0]))
        if members is None:
            teleport[seed_ids] += weights  # a mapping names each node once
        else:
            at = np.minimum(np.searchsorted(members, seed_ids), size - 1)
            inside = members[at] == seed_ids
            teleport[at[inside]] += weights[inside]
        total = teleport.sum()
        teleport = teleport / total if total > 0 else np.full(size, 1.0 / size)

        if backend == "gpu" or (backend == "auto" and size >= engines.GPU_MIN_NODES and engines.gpu_available()):
            engine = engines.gpu_engine()
            if engine is None:
                raise RuntimeError("backend='gpu' needs a visible GPU with cuGraph or CuPy")
            if engine == "cugraph":
                result = engines.pagerank_cugraph(self._matrix(members)[0], teleport, damping, max_iter, tol)
            else:
                # the whole graph's adjacency is copied to the GPU once; a subgraph is copied per call
                on_gpu = self._gpu_adjacency if members is None else engines.to_gpu(*self._matrix(members))
                result = engines.pagerank_cupy(*on_gpu, teleport, damping, max_iter, tol)
        elif members is not None and self.adjacency.dtype == np.float64 and (kernels := engines.compiled_kernels()) is not None:
            adjacency = self.adjacency
            result = kernels.neighbourhood_pagerank(adjacency.indptr, adjacency.indices, adjacency.data, members, teleport,
                                                    damping, max_iter, tol)
        else:
            result = engines.pagerank_scipy(*self._matrix(members), teleport, damping, max_iter, tol)
        if members is None:
            return result
        scores[members] = result
        return scores

    def _matrix(self, members: Optional[np.ndarray]) -> tuple[sp.csr_matrix, np.ndarray]:
        """The adjacency and the weighted degrees of the subgraph induced by `members` (the whole graph for None)."""
        if members is None:
            return self.adjacency, self.weighted_degree
        matrix = induced_submatrix(self.adjacency, members)
        return matrix, row_sums(matrix)

    @functools.cached_property
    def _gpu_adjacency(self):
        return engines.to_gpu(self.adjacency, self.weighted_degree)

    def _check(self, node: int) -> None:
        if not 0 <= node < self.node_count:
            raise IndexError(f"node {node} is not in the graph (0..{self.node_count - 1})")
