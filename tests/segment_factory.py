"""Segments built directly (no parser, no models) for store tests and the crash-test subprocess."""

from __future__ import annotations

import hashlib

import numpy as np

from orchestrator.knowledge.parsing.chunking import Span
from orchestrator.knowledge.parsing.documents import Block
from orchestrator.knowledge.storage.segments import DocumentRecord, EntityMention, EvidenceRecord, RelationMention, Segment


def unit_vectors(n: int, dim: int = 8, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def make_segment(
    name: str, texts: list[str], entities: dict[str, list[str]] | None = None, dim: int = 8, seed: int = 0, content: str = "",
    pages: list[int] | None = None,
) -> Segment:
    """One document: a passage per text, on page i (or pages[i]); `entities` maps a text to the entity names in it."""
    document_id = hashlib.sha256((content or name + "|".join(texts)).encode()).hexdigest()[:24]
    pages = list(range(len(texts))) if pages is None else pages
    blocks = [Block("text", text, page=pages[i], bbox=(0, 0, 1000, 100)) for i, text in enumerate(texts)]
    evidence = [
        EvidenceRecord(f"{document_id}:t{i}", document_id, name, "passage", "text", text, "",
                       (Span(i, pages[i], (0, 0, 1000, 100), 0, len(text)),))
        for i, text in enumerate(texts)
    ]
    mentions, relations = [], []
    for i, text in enumerate(texts):
        names = (entities or {}).get(text, [])
        mentions += [EntityMention(n.lower(), n, "concept", f"{n} in {name}", evidence[i].evidence_id) for n in names]
        relations += [
            RelationMention(*sorted((a.lower(), b.lower())), f"{a} with {b}", "", 1.0, evidence[i].evidence_id)
            for j, a in enumerate(names)
            for b in names[j + 1 :]
        ]
    entity_keys = list(dict.fromkeys(m.key for m in mentions))
    relation_keys = list(dict.fromkeys((r.source, r.target) for r in relations))
    document = DocumentRecord(document_id, name, "text/plain", "test", len(set(pages)), len(blocks), len(texts), 0,
                              len(entity_keys), len(relation_keys), sum(map(len, texts)), 0.0, passages=len(texts))
    return Segment(
        document=document,
        blocks=blocks,
        evidence=evidence,
        evidence_vectors=unit_vectors(len(texts), dim, seed),
        entities=mentions,
        entity_keys=entity_keys,
        entity_vectors=unit_vectors(len(entity_keys), dim, seed + 1000) if entity_keys else np.zeros((0, 0), np.float32),
        relations=relations,
        relation_keys=relation_keys,
        relation_vectors=unit_vectors(len(relation_keys), dim, seed + 2000) if relation_keys else np.zeros((0, 0), np.float32),
    )


def commit(collection, segment: Segment):
    staging = collection.staging_folder()
    (staging / "assets").mkdir()
    (staging / "assets" / "note.txt").write_text(segment.document.name)
    return collection.commit(segment, staging)
