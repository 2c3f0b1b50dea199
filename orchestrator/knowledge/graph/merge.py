"""The graph made from the documents' records: built from scratch, extended by an appended document's records into a
copy-on-write copy of what the previous graph merged (appended_graph), or cut down when one is deleted or replaced
(graph_without: what no other document names goes, nothing is left orphaned). Either result equals a build from
scratch over the same documents; property tests check it."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

import numpy as np
import scipy.sparse as sp

from ..collector import building_long_lived
from .graph import (
    BELONGS_TO,
    ENTITY,
    IMPLICIT_TYPE,
    RELATED,
    UNIT,
    UNKNOWN_UNIT_TYPE,
    DocumentGraph,
    EdgeTable,
    KnowledgeGraph,
    NodeTable,
)


# Per-key accumulators are plain lists (cheaper than objects at a million records). Documents arrive one at a
# time, so a key's document list stays free of duplicates by comparing with its last element, and one document's
# mentions of a key are one run of the per-mention lists: where each document's run starts is kept (None while a
# single document names the key), so that removing a document cuts its run out. Descriptions and keywords are kept
# per mention ("" where a mention has none) so that they run beside the evidence.
_NAMES, _TYPES, _DESCRIPTIONS, _EVIDENCE, _DOCUMENTS, _STARTS = range(6)  # entity accumulator slots
# relation accumulator slots: the summed weight, descriptions, keywords, then evidence, documents and starts as
# for entities, then the per-mention weights once there are two (after a removal the rest is summed again, in
# the order a build from scratch adds them, so the sum is the same to the last bit)
_WEIGHT, _RELATION_DESCRIPTIONS, _KEYWORDS, _WEIGHTS = 0, 1, 2, 6


def build_graph(
    documents: Iterable[DocumentGraph],
    max_descriptions: int = 8,
    max_description_chars: int = 2000,
    belongs_to_weight: float = 1.0,
) -> KnowledgeGraph:
    """Merge documents' records into one graph (see _Merged); the cyclic garbage collector is paused meanwhile
    and what was built is then kept out of its collections (collector.py).

    Building allocates millions of small containers and no cycles: with the collector running, its repeated
    full scans took half of the build time at a million relations.
    """
    if belongs_to_weight <= 0 or not math.isfinite(belongs_to_weight):
        raise ValueError(f"belongs_to_weight must be a positive number, not {belongs_to_weight}")
    with building_long_lived():
        merged = _Merged(_Limits(max_descriptions, max_description_chars, belongs_to_weight))
        merged.add(documents)
        return merged.graph(None)


def appended_graph(graph: KnowledgeGraph, documents: Iterable[DocumentGraph]) -> KnowledgeGraph:
    """`graph` with `documents` added after its own: equal to build_graph over all of them, in time about
    that of the new documents (their nodes and edges merged, the others' rows shared or copied, not rebuilt).
    `graph` stays as it was (the merged records are copied before they change)."""
    if graph._merged is None:
        raise ValueError("this graph keeps no merged records to append to")
    with building_long_lived():
        merged = graph._merged.copy()
        merged.add(documents)
        return merged.graph(graph)


def graph_without(
    graph: KnowledgeGraph, removed: Sequence[DocumentGraph], document: Callable[[str], DocumentGraph],
    appended: Sequence[DocumentGraph] = (),
) -> Optional[KnowledgeGraph]:
    """`graph` less the `removed` documents (their records as they were added), then with `appended` added: equal
    to build_graph over the documents left and the appended ones, in time about that of their records plus array
    passes over the node and edge tables (what no other document names goes, the rows of the nodes and edges a
    removed document touched are made again, the others keep their rows, renumbered). `document(id)` gives a
    remaining document's records: read for the documents that now name first what a removed one named first
    (their order decides its number). None where that cannot be done exactly (a unit a removed document named
    first and another still names, see removable): build from scratch then. `graph` stays as it was."""
    if not removable(graph, removed):
        return None
    origin, kept = graph.documents, np.arange(graph.node_count)
    position = graph._merged.position
    # the last first: what a removed document named first is then never named first by one still to be removed
    removed = sorted(removed, key=lambda record: position[record.document_id], reverse=True)
    with building_long_lived():
        for removing, records in [*((True, record) for record in removed), *([(False, appended)] if appended else [])]:
            merged = graph._merged.copy()
            if not removing:
                merged.add(records)
            elif not merged.remove(records, document):
                return None
            graph = merged.graph(graph)
            _, step_kept = graph.carried_from
            kept = np.where(step_kept >= 0, kept[np.maximum(step_kept, 0)] if len(kept) else -1, -1)
    graph.carried_from = (origin, kept)
    return graph


def removable(graph: KnowledgeGraph, removed: Sequence[DocumentGraph]) -> bool:
    """Whether graph_without can take these documents out in place: the graph keeps its merged records, and no unit
    a removed document named first is named by a document that stays (a unit keeps the type and description of
    the document that named it first; what the next one gave is not kept)."""
    merged = graph._merged
    if merged is None:
        return False
    gone = {record.document_id for record in removed}
    for record in removed:
        for unit in {unit.unit_id for unit in record.units} | {unit for _, unit in record.belongs_to}:
            named_by = merged.units[unit][2] if unit in merged.units else ()
            if named_by and named_by[0] == record.document_id and any(doc not in gone for doc in named_by):
                return False
    return True


@dataclass(frozen=True)
class _Limits:
    max_descriptions: int
    max_description_chars: int
    belongs_to_weight: float


def _copy_entity(acc: list) -> list:
    names, types, descriptions, evidence, documents, starts = acc
    return [dict(names), dict(types), descriptions[:], evidence[:], documents[:], None if starts is None else starts[:]]


def _copy_relation(acc: list) -> list:
    weight, descriptions, keywords, evidence, documents, starts, weights = acc
    return [weight, descriptions[:], keywords[:], evidence[:], documents[:],
            None if starts is None else starts[:], None if weights is None else weights[:]]


def _copy_unit(record: list) -> list:
    return [record[0], record[1], record[2][:]]


def _enter(acc: list, doc: str) -> None:
    """Count `doc` among the accumulator's documents (if it is not the last one already), its run starting at the
    end of the per-mention lists."""
    documents = acc[_DOCUMENTS]
    if documents and documents[-1] == doc:
        return
    if documents:
        if acc[_STARTS] is None:
            acc[_STARTS] = [0]
        acc[_STARTS].append(len(acc[_EVIDENCE]))
    documents.append(doc)


def _cut(acc: list, doc: str, per_mention: tuple[int, ...]) -> bool:
    """Cut `doc`'s run out of the accumulator's per-mention lists and documents; whether it named the key."""
    documents, starts = acc[_DOCUMENTS], acc[_STARTS]
    try:
        at = documents.index(doc)
    except ValueError:
        return False
    start = starts[at] if starts is not None else 0
    end = starts[at + 1] if starts is not None and at + 1 < len(starts) else len(acc[_EVIDENCE])
    for slot in per_mention:
        if acc[slot] is not None:
            del acc[slot][start:end]
    del documents[at]
    if starts is not None:
        del starts[at]
        for later in range(at, len(starts)):
            starts[later] -= end - start
        if len(documents) < 2:
            acc[_STARTS] = None
    return True


class _Merged:
    """The documents' records merged: the accumulators the node and edge tables are made from. A graph keeps its
    own, so that appending documents merges only theirs and removing one cuts out only its share; a copy shares
    every accumulator until it changes one.

    Entities merge by key: display name = most frequent written form, type = most frequent type other than
    "concept" when there is one (ties: the first in sorted order, so that neither depends on the documents'
    order), descriptions deduplicated in input order (at most `max_descriptions`, `max_description_chars`).
    Relations merge by unordered key pair: weights summed, descriptions and keywords deduplicated. Records are
    taken as stored: a relation or belongs_to link naming an entity no mention names adds that entity ("concept",
    named by its key, its evidence and documents those of its relations); a link to an undeclared unit adds the
    unit ("unknown"); self-relations and empty keys are dropped; weights that are not positive finite numbers
    count as 1.0. Nodes and edges are numbered in the order they are first seen, so appending documents only adds
    rows (each document's first-seen nodes and edges are one range of numbers: `node_starts`, `edge_starts`).
    """

    def __init__(self, limits: _Limits):
        self.limits = limits
        self.entities: dict[str, list] = {}  # key -> [names, types, descriptions, evidence, documents, starts]
        self.relations: dict[tuple[str, str], list] = {}  # (a, b), a < b -> [weight, descriptions, keywords, evidence, documents, starts, weights]
        self.units: dict[str, list] = {}  # unit id -> [type, description, documents]
        self.links: dict[tuple[str, str], list[str]] = {}  # (entity key, unit id) -> documents
        self.incident: dict[str, list[tuple[str, str]]] = {}  # entity key -> its relations' pairs (after a removal, in any order)
        self.entity_index: dict[str, int] = {}  # node ids, in first-seen order across both kinds
        self.unit_index: dict[str, int] = {}
        self.node_keys: list[tuple[str, str]] = []  # (ENTITY | UNIT, key) by node id
        self.edge_keys: list[tuple] = []  # (RELATED, pair) | (BELONGS_TO, link) by edge id
        self.edge_ids: dict[tuple, int] = {}
        self.document_ids: list[str] = []
        self.position: dict[str, int] = {}
        self.node_starts: list[int] = []  # per document: the first node id it added (and edge id)
        self.edge_starts: list[int] = []
        self._owned: Optional[set] = None  # a copy's accumulators it has copied (None: all its own)
        self.touched_nodes: set[int] = set()  # since the copy: nodes and edges whose rows must be made again
        self.touched_edges: set[int] = set()
        # after a removal: for each node and edge, the one of the copied-from graph whose row it keeps
        self.carried: Optional[tuple[np.ndarray, np.ndarray]] = None

    def copy(self) -> "_Merged":
        other = _Merged.__new__(_Merged)
        other.limits = self.limits
        for name in ("entities", "relations", "units", "links", "incident", "entity_index", "unit_index", "edge_ids", "position"):
            setattr(other, name, dict(getattr(self, name)))
        for name in ("node_keys", "edge_keys", "document_ids", "node_starts", "edge_starts"):
            setattr(other, name, list(getattr(self, name)))
        other._owned, other.touched_nodes, other.touched_edges, other.carried = set(), set(), set(), None
        return other

    def _own(self, table: dict, name: str, key, copy, new=None):
        """The accumulator of `key` in `table` (made by `new()` if absent), copied first if a copy still shares it."""
        value = table.get(key)
        if value is None:
            value = table[key] = new()
        elif self._owned is not None and (name, key) not in self._owned:
            value = table[key] = copy(value)
        else:
            return value
        if self._owned is not None:
            self._owned.add((name, key))
        return value

    def _touch_node(self, node: int) -> None:
        if self._owned is not None:  # a first build makes every row anyway
            self.touched_nodes.add(node)

    def _entity(self, key: str, write: bool = True) -> Optional[list]:
        """The entity's accumulator (a node is added for a key seen first); with `write`, one this may change."""
        if key not in self.entity_index:
            self.entity_index[key] = len(self.node_keys)
            self.node_keys.append((ENTITY, key))
        self._touch_node(self.entity_index[key])
        if not write:
            if key not in self.entities:
                self.entities[key] = [{}, {}, [], [], [], None]
            return None
        return self._own(self.entities, "entity", key, _copy_entity, lambda: [{}, {}, [], [], [], None])

    def _unit(self, unit_id: str, unit_type: str, description: str) -> list:
        if unit_id not in self.unit_index:
            self.unit_index[unit_id] = len(self.node_keys)
            self.node_keys.append((UNIT, unit_id))
        self._touch_node(self.unit_index[unit_id])
        return self._own(self.units, "unit", unit_id, _copy_unit, lambda: [unit_type, description, []])

    def _edge(self, kind: str, key: tuple) -> None:
        edge = (kind, key)
        if edge not in self.edge_ids:
            self.edge_ids[edge] = len(self.edge_keys)
            self.edge_keys.append(edge)
        if self._owned is not None:
            self.touched_edges.add(self.edge_ids[edge])

    def add(self, documents: Iterable[DocumentGraph]) -> None:
        for document in documents:
            doc = document.document_id
            if doc in self.position:
                raise ValueError(f"document {doc!r} appears twice in the graph's input")
            self.position[doc] = len(self.document_ids)
            self.document_ids.append(doc)
            self.node_starts.append(len(self.node_keys))
            self.edge_starts.append(len(self.edge_keys))
            for mention in document.entities:
                key, name = mention.key, mention.name
                if not key:
                    continue
                acc = self._entity(key)
                _enter(acc, doc)
                if name:
                    names = acc[_NAMES]
                    names[name] = names.get(name, 0) + 1
                types = acc[_TYPES]
                types[mention.type] = types.get(mention.type, 0) + 1
                acc[_DESCRIPTIONS].append(mention.description)
                acc[_EVIDENCE].append(mention.evidence_id)
            for mention in document.relations:
                a, b = mention.source, mention.target
                if not a or not b or a == b:
                    continue
                pair = (a, b) if a < b else (b, a)
                weight = mention.weight
                if not (type(weight) is float and 0.0 < weight < math.inf):
                    weight = _positive(weight)
                for key in pair:  # an endpoint no mention names is an entity too (see _entity_row)
                    self._entity(key, write=False)
                self._edge(RELATED, pair)
                if pair not in self.relations:
                    self._own(self.relations, "relation", pair, list, lambda: [
                        weight, [mention.description], [mention.keywords], [mention.evidence_id], [doc], None, None,
                    ])
                    for key in pair:
                        self._own(self.incident, "incident", key, list, list).append(pair)
                    continue
                acc = self._own(self.relations, "relation", pair, _copy_relation)
                _enter(acc, doc)
                if acc[_WEIGHTS] is None:
                    acc[_WEIGHTS] = [acc[_WEIGHT]]
                acc[_WEIGHTS].append(weight)
                acc[_WEIGHT] += weight
                acc[_RELATION_DESCRIPTIONS].append(mention.description)
                acc[_KEYWORDS].append(mention.keywords)
                acc[_EVIDENCE].append(mention.evidence_id)
            for unit in document.units:
                record = self._unit(unit.unit_id, unit.type, unit.description)
                if doc not in record[2]:
                    record[2].append(doc)
            for key, unit_id in document.belongs_to:
                if not key or not unit_id:
                    continue
                _enter(self._entity(key), doc)
                record = self._unit(unit_id, UNKNOWN_UNIT_TYPE, "")
                if doc not in record[2]:
                    record[2].append(doc)
                link = (key, unit_id)
                linked = self._own(self.links, "link", link, list, list)
                if doc not in linked:
                    linked.append(doc)
                self._edge(BELONGS_TO, link)

    def remove(self, document: DocumentGraph, remaining: Callable[[str], DocumentGraph]) -> bool:
        """Take out one document's share (its records as they were added), on a copy; False if that cannot be
        done exactly (see graph_without). Nodes and edges no other document names go; those the document named
        first are numbered as the document that now names them first numbers them (`remaining` gives its
        records); the rest keep their order. `carried` and the touched rows tell graph() what to make."""
        doc = document.document_id
        position = self.position.get(doc)
        if position is None:
            raise ValueError(f"document {doc!r} is not in the graph")
        if self._owned is None or self.carried is not None or self.touched_nodes or self.touched_edges:
            raise ValueError("remove works on a fresh copy")
        forms: dict[str, tuple[dict, dict]] = {}  # the document's counts of each entity's names and types
        for mention in document.entities:
            if mention.key:
                names, types = forms.setdefault(mention.key, ({}, {}))
                if mention.name:
                    names[mention.name] = names.get(mention.name, 0) + 1
                types[mention.type] = types.get(mention.type, 0) + 1
        keys, pairs, links = _named_by(document)
        for key in keys:
            acc = self._own(self.entities, "entity", key, _copy_entity)
            if not _cut(acc, doc, (_DESCRIPTIONS, _EVIDENCE)):
                continue
            names, types = forms.get(key, ({}, {}))
            for slot, counts in ((_NAMES, names), (_TYPES, types)):
                table = acc[slot]
                for form, count in counts.items():
                    if table[form] == count:
                        del table[form]
                    else:
                        table[form] -= count
        gone_pairs = []
        for pair in pairs:
            acc = self._own(self.relations, "relation", pair, _copy_relation)
            _cut(acc, doc, (_RELATION_DESCRIPTIONS, _KEYWORDS, _EVIDENCE, _WEIGHTS))
            if not acc[_DOCUMENTS]:
                del self.relations[pair]
                gone_pairs.append(pair)
            elif acc[_WEIGHTS] is not None:
                acc[_WEIGHT] = sum(acc[_WEIGHTS])
        gone_of: dict[str, set] = {}
        for pair in gone_pairs:
            for key in pair:
                gone_of.setdefault(key, set()).add(pair)
        for key, gone in gone_of.items():  # a hub's list is long: one pass over it
            incident = [pair for pair in self.incident[key] if pair not in gone]
            if incident:
                self.incident[key] = incident
            else:
                del self.incident[key]
        units = {unit.unit_id for unit in document.units} | {unit for _, unit in links}
        for unit in units:
            record = self._own(self.units, "unit", unit, _copy_unit)
            if record[2][0] == doc and len(record[2]) > 1:
                return False  # see removable
            record[2].remove(doc)
            if not record[2]:
                del self.units[unit]
        for link in links:
            linked = self._own(self.links, "link", link, list)
            linked.remove(doc)
            if not linked:
                del self.links[link]
        for key in keys:
            acc = self.entities[key]
            if not acc[_DOCUMENTS] and key not in self.incident:
                del self.entities[key]
        self._renumber(position, remaining)
        self.touched_nodes = {self.entity_index[key] for key in keys if key in self.entity_index}
        self.touched_nodes.update(self.unit_index[unit] for unit in units if unit in self.unit_index)
        self.touched_edges = {self.edge_ids[(RELATED, pair)] for pair in pairs if pair in self.relations}
        self.touched_edges.update(self.edge_ids[(BELONGS_TO, link)] for link in links if link in self.links)
        return True

    def _exists(self, item: tuple) -> bool:
        kind, key = item
        table = {ENTITY: self.entities, UNIT: self.units, RELATED: self.relations, BELONGS_TO: self.links}[kind]
        return key in table

    def _first_document(self, item: tuple) -> str:
        """The document that now names first a node or edge (one the removed document named first)."""
        kind, key = item
        if kind == RELATED:
            return self.relations[key][_DOCUMENTS][0]
        if kind == BELONGS_TO:
            return self.links[key][0]
        if kind == UNIT:
            return self.units[key][2][0]
        acc = self.entities[key]
        named_by = acc[_DOCUMENTS][:1] + [self.relations[pair][_DOCUMENTS][0] for pair in self.incident.get(key, ())]
        return min(named_by, key=self.position.__getitem__)

    def _renumber(self, position: int, remaining: Callable[[str], DocumentGraph]) -> None:
        """Drop the removed document (at `position`) and the nodes and edges no other document names; number the
        rest in first-seen order over the documents left (see remove): only the removed document's range and
        the ranges of the documents that now name first what it named first are reordered."""
        scans: dict[int, tuple[dict, dict]] = {}

        def new_order(keys: list, starts: list[int], scanned: int) -> tuple[np.ndarray, list[int], list]:
            """The old numbers of what is left, in its new order; each remaining document's first number; the keys
            that are gone."""
            count = len(keys)
            bounds = [*starts, count]
            document_of = np.repeat(np.arange(len(starts)), np.diff(bounds))
            within = np.arange(count, dtype=np.int64)
            left = np.ones(count, dtype=bool)
            moved: dict[int, list[int]] = {}  # the document now naming them first -> numbers
            gone = []
            for number in range(bounds[position], bounds[position + 1]):
                if self._exists(keys[number]):
                    moved.setdefault(self.position[self._first_document(keys[number])], []).append(number)
                else:
                    left[number] = False
                    gone.append(keys[number])
            for first, numbers in moved.items():
                if first not in scans:
                    scans[first] = _first_seen(remaining(self.document_ids[first]))
                ranks = scans[first][scanned]
                document_of[numbers] = first
                for number in itertools.chain(range(bounds[first], bounds[first + 1]), numbers):
                    within[number] = ranks[keys[number]]
            numbers = np.flatnonzero(left)
            numbers = numbers[np.lexsort((within[numbers], document_of[numbers]))]
            documents = document_of[numbers]
            documents -= documents > position
            return numbers, np.searchsorted(documents, np.arange(len(starts) - 1)).tolist(), gone

        nodes, node_starts, gone_nodes = new_order(self.node_keys, self.node_starts, 0)
        edges, edge_starts, gone_edges = new_order(self.edge_keys, self.edge_starts, 1)
        for kind, key in gone_nodes:
            del (self.entity_index if kind == ENTITY else self.unit_index)[key]
        unchanged = _unmoved(nodes)
        self.node_keys = _taken(self.node_keys, nodes)
        renumbered = list(zip(self.node_keys[unchanged:], range(unchanged, len(self.node_keys))))
        self.entity_index.update((key, number) for (kind, key), number in renumbered if kind == ENTITY)
        self.unit_index.update((key, number) for (kind, key), number in renumbered if kind == UNIT)
        for edge in gone_edges:
            del self.edge_ids[edge]
        unchanged = _unmoved(edges)
        self.edge_keys = _taken(self.edge_keys, edges)
        self.edge_ids.update(zip(self.edge_keys[unchanged:], range(unchanged, len(self.edge_keys))))
        del self.document_ids[position]
        self.position = {doc: number for number, doc in enumerate(self.document_ids)}
        self.node_starts, self.edge_starts = node_starts, edge_starts
        self.carried = (nodes, edges)

    def _entity_row(self, key: str) -> tuple:
        """(name, type, description, documents, evidence) of an entity node. An entity no mention names (only
        relations and belongs_to links do) takes the evidence and documents of its relations."""
        names, types, descriptions, evidence, documents, _ = self.entities[key]
        if names or types:
            limits = self.limits
            return (_most_frequent(names) if names else key, _merged_type(types),
                    _joined(descriptions, limits.max_descriptions, limits.max_description_chars),
                    tuple(documents), _unique(evidence))
        pairs = self.incident.get(key, ())
        if pairs:  # in the order first seen (the edges' order)
            if len(pairs) > 1:
                pairs = sorted(pairs, key=lambda pair: self.edge_ids[(RELATED, pair)])
            evidence = list(evidence)
            named_by = set(documents)
            for pair in pairs:
                relation = self.relations[pair]
                evidence.extend(relation[_EVIDENCE])
                named_by.update(relation[_DOCUMENTS])
            documents = sorted(named_by, key=self.position.__getitem__)
        return key, IMPLICIT_TYPE, "", tuple(documents), _unique(evidence)

    def _node_row(self, node: int) -> tuple:
        kind, key = self.node_keys[node]
        if kind == ENTITY:
            return self._entity_row(key)
        unit_type, description, documents = self.units[key]
        return key, unit_type, description, tuple(documents), (key,)

    def _edge_row(self, edge: int) -> tuple:
        """(src, dst, weight, description, keywords, documents, evidence) of an edge."""
        kind, key = self.edge_keys[edge]
        if kind == RELATED:
            weight, descriptions, keywords, evidence, documents = self.relations[key][:5]
            limits = self.limits
            return (self.entity_index[key[0]], self.entity_index[key[1]], weight,
                    _joined(descriptions, limits.max_descriptions, limits.max_description_chars), _keywords(keywords),
                    tuple(documents), _unique(evidence))
        entity, unit = key
        return (self.entity_index[entity], self.unit_index[unit], self.limits.belongs_to_weight, "", "",
                tuple(self.links[key]), ())

    def graph(self, base: Optional[KnowledgeGraph]) -> KnowledgeGraph:
        """The graph of what is merged: every row made anew, or, with `base` (the graph this was copied from),
        base's rows copied (in their new order after a removal) and the rows of the nodes and edges touched since
        made again."""
        node_count, edge_count = len(self.node_keys), len(self.edge_keys)
        if base is None:
            node_rows, edge_rows = range(node_count), range(edge_count)
            columns: list[list] = [[None] * node_count for _ in range(7)]
            edge_columns: list[list] = [[None] * edge_count for _ in range(5)]
            src, dst, weights = np.zeros(edge_count, np.int64), np.zeros(edge_count, np.int64), np.zeros(edge_count, np.float64)
        else:  # base's rows copied (new rows at the end), the touched ones made again below
            node_rows, edge_rows = sorted(self.touched_nodes), sorted(self.touched_edges)
            n, e = base.nodes, base.edges
            nodes_from, edges_from = self.carried or (np.arange(len(n)), np.arange(len(e)))
            columns = [_taken(c, nodes_from) + [None] * (node_count - len(nodes_from))
                       for c in (n.kind, n.key, n.name, n.type, n.description, n.documents, n.evidence)]
            edge_columns = [_taken(c, edges_from) + [None] * (edge_count - len(edges_from))
                            for c in (e.kind, e.description, e.keywords, e.documents, e.evidence)]
            new_number = np.full(len(n), -1, dtype=np.int64)
            new_number[nodes_from] = np.arange(len(nodes_from))
            src, dst = (np.resize(new_number[ends[edges_from]], edge_count) for ends in (e.src, e.dst))
            weights = np.resize(e.weight[edges_from], edge_count)
            kept = np.full(node_count, -1, dtype=np.int64)
            kept[: len(nodes_from)] = nodes_from
            kept[node_rows] = -1
        for node in node_rows:
            for column, value in zip(columns, (*self.node_keys[node], *self._node_row(node))):
                column[node] = value
        for edge in edge_rows:
            src[edge], dst[edge], weights[edge], description, keywords, documents, evidence = self._edge_row(edge)
            for column, value in zip(edge_columns, (self.edge_keys[edge][0], description, keywords, documents, evidence)):
                column[edge] = value
        kind, key, name, node_type, description, documents, evidence = columns
        nodes = NodeTable(kind, key, name, node_type, description, documents, evidence)
        edge_kind, edge_description, edge_keywords, edge_documents, edge_evidence = edge_columns
        edges = EdgeTable(src, dst, edge_kind, weights, edge_description, edge_keywords, edge_documents, edge_evidence)
        adjacency, edge_of_entry = _adjacency(node_count, src, dst, weights)
        carried_from = (base.documents, kept) if base is not None else None
        self.touched_nodes, self.touched_edges, self.carried = set(), set(), None
        # the indexes are shared: a copy made to append replaces them before it changes them
        return KnowledgeGraph(nodes, edges, adjacency, self.entity_index, self.unit_index, tuple(self.document_ids),
                              edge_of_entry, self, carried_from)


def _first_seen(document: DocumentGraph) -> tuple[dict[tuple, int], dict[tuple, int]]:
    """The nodes and the edges a document names, each numbered in the order _Merged.add first meets them (made in
    comprehensions and dict.fromkeys: a removal may read dozens of documents)."""
    pairs = [(a, b) if a < b else (b, a) for m in document.relations if (a := m.source) and (b := m.target) and a != b]
    links = [(key, unit) for key, unit in document.belongs_to if key and unit]
    met = [(ENTITY, key) for m in document.entities if (key := m.key)]
    met += [(ENTITY, key) for pair in pairs for key in pair]
    met += [(UNIT, unit.unit_id) for unit in document.units]
    met += [node for key, unit in links for node in ((ENTITY, key), (UNIT, unit))]
    edges = [(RELATED, pair) for pair in pairs] + [(BELONGS_TO, link) for link in links]
    return dict(zip(dict.fromkeys(met), itertools.count())), dict(zip(dict.fromkeys(edges), itertools.count()))


def _named_by(document: DocumentGraph) -> tuple[list[str], list[tuple[str, str]], list[tuple[str, str]]]:
    """The entity keys, relation pairs and belongs_to links a document names."""
    nodes, edges = _first_seen(document)
    return ([key for kind, key in nodes if kind == ENTITY], [key for kind, key in edges if kind == RELATED],
            [key for kind, key in edges if kind == BELONGS_TO])


def _unmoved(numbers: np.ndarray) -> int:
    """How many leading entries of a renumbering keep their number."""
    moved = np.flatnonzero(numbers != np.arange(len(numbers)))
    return int(moved[0]) if len(moved) else len(numbers)


def _taken(column: list, numbers: np.ndarray) -> list:
    """column[numbers] for a list (its unmoved prefix copied in one slice)."""
    unchanged = _unmoved(numbers)
    return column[:unchanged] + [column[number] for number in numbers[unchanged:].tolist()]


def _adjacency(n: int, src: np.ndarray, dst: np.ndarray, weights: np.ndarray) -> tuple[sp.csr_matrix, np.ndarray]:
    """Symmetric CSR of the edges, and the edge id of each stored entry (same canonical order)."""
    rows = np.concatenate((src, dst))
    cols = np.concatenate((dst, src))
    ids = np.arange(len(src), dtype=np.int64)
    order = np.lexsort((cols, rows))  # canonical CSR order: by row, then column; pairs are unique
    rows, cols = rows[order], cols[order]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    index_dtype = np.int32 if max(n, len(rows)) < 2**31 else np.int64
    adjacency = sp.csr_matrix(
        (np.concatenate((weights, weights))[order], cols.astype(index_dtype), indptr.astype(index_dtype)), shape=(n, n)
    )
    adjacency.has_sorted_indices = True
    return adjacency, np.concatenate((ids, ids))[order]


def _positive(weight: object) -> float:
    try:
        value = float(weight)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 1.0
    return value if math.isfinite(value) and value > 0 else 1.0


def _most_frequent(counts: dict[str, int]) -> str:
    """Ties go to the first in sorted order: the choice does not depend on the order the documents came in."""
    return min(counts.items(), key=lambda item: (-item[1], item[0]))[0]


def _merged_type(counts: dict[str, int]) -> str:
    specific = {t: c for t, c in counts.items() if t and t != IMPLICIT_TYPE}
    return _most_frequent(specific) if specific else IMPLICIT_TYPE


def _unique(values: list[str]) -> tuple[str, ...]:
    return tuple(values) if len(values) < 2 else tuple(dict.fromkeys(values))


def _joined(descriptions: list[str], limit: int, max_chars: int) -> str:
    if len(descriptions) < 2:
        text = descriptions[0] if descriptions else ""
    else:
        unique = dict.fromkeys(descriptions)
        unique.pop("", None)  # a mention without one
        text = "\n".join(list(unique)[:limit])
    return text if len(text) <= max_chars else text[: max_chars - 1].rstrip() + "…"


def _keywords(lists: list[str]) -> str:
    if not lists:
        return ""
    if len(lists) == 1 and "," not in lists[0]:
        return lists[0].strip()
    return ", ".join(dict.fromkeys(w.strip() for words in lists for w in words.split(",") if w.strip()))

