"""A large synthetic collection built straight into segments (no parser, no models): for measuring retrieval,
graph expansion and fusion at sizes the generated PDFs cannot reach on a CPU in minutes.

Its structure mimics an ingested corpus: words drawn from a Zipf law over a vocabulary, a few entities per
chunk (also Zipf: a few hub entities, a long tail), relations between the entities of a chunk. Vectors are
random but consistent with the text: an entity's vector is random, a chunk's vector is the normalised mean
of its entities' vectors plus noise, a relation's is the mean of its endpoints'. A question made from a
chunk (its vector plus noise, some of its words) therefore has near neighbours in every index, as a real
question does, so every stage does its real amount of work.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

import numpy as np

from orchestrator.knowledge.parsing.chunking import Span
from orchestrator.knowledge.parsing.documents import Block
from orchestrator.knowledge.storage.segments import DocumentRecord, EntityMention, EvidenceRecord, RelationMention, Segment
from orchestrator.knowledge.parsing.sentences import TokenCounts
from orchestrator.knowledge.storage.manifest import ManifestEntry, write_manifest


@dataclass(frozen=True)
class CollectionShape:
    documents: int = 100
    chunks_per_document: int = 1000
    words_per_chunk: int = 120
    vocabulary: int = 20_000
    entity_pool: int = 20_000
    entities_per_chunk: int = 3
    dimension: int = 384
    seed: int = 0

    @property
    def chunks(self) -> int:
        return self.documents * self.chunks_per_document


@dataclass(frozen=True)
class SyntheticQuestion:
    text: str
    vector: np.ndarray  # [1, dimension], normalised
    source_chunk: int  # global chunk row it was made from


def _normalised(vectors: np.ndarray) -> np.ndarray:
    return (vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)).astype(np.float32)


def _zipf_choice(rng: np.random.Generator, size: int, count: tuple[int, ...], exponent: float = 1.1) -> np.ndarray:
    ranks = np.arange(1, size + 1, dtype=np.float64)
    weights = ranks ** -exponent
    return rng.choice(size, size=count, p=weights / weights.sum())


class SyntheticCorpus:
    def __init__(self, shape: CollectionShape):
        self.shape = shape
        rng = np.random.default_rng(shape.seed)
        self.entity_vectors = _normalised(rng.normal(size=(shape.entity_pool, shape.dimension)))
        self.chunk_entities = _zipf_choice(rng, shape.entity_pool, (shape.chunks, shape.entities_per_chunk))
        self.chunk_words = _zipf_choice(rng, shape.vocabulary, (shape.chunks, shape.words_per_chunk))
        noise = rng.normal(scale=0.02, size=(shape.chunks, shape.dimension))
        self.chunk_vectors = _normalised(self.entity_vectors[self.chunk_entities].mean(axis=1) + noise)
        self._rng = rng

    def segments(self) -> list[Segment]:
        shape = self.shape
        out = []
        for number in range(shape.documents):
            first = number * shape.chunks_per_document
            rows = range(first, first + shape.chunks_per_document)
            out.append(self._segment(number, rows))
        return out

    def document(self, number: int, chunks: int) -> Segment:
        """Document `number` with only its first `chunks` chunks (a small document to add to the others)."""
        first = number * self.shape.chunks_per_document
        return self._segment(number, range(first, first + min(chunks, self.shape.chunks_per_document)))

    def _segment(self, number: int, rows: range) -> Segment:
        name = f"synthetic-{number:04d}.pdf"
        document_id = hashlib.sha256(name.encode()).hexdigest()[:24]
        blocks, evidence, mentions, relations = [], [], [], []
        for local, row in enumerate(rows):
            text = " ".join(f"w{w}" for w in self.chunk_words[row])
            page = local // 4
            blocks.append(Block("text", text, page=page, bbox=(80, 100 + 200 * (local % 4), 920, 280 + 200 * (local % 4))))
            evidence_id = f"{document_id}:c{local}"
            evidence.append(EvidenceRecord(evidence_id, document_id, name, "chunk", "text", text, "",
                                           (Span(local, page, blocks[-1].bbox),), tokens=len(self.chunk_words[row])))
            keys = [f"entity {e}" for e in dict.fromkeys(self.chunk_entities[row].tolist())]
            mentions += [EntityMention(key, key.title(), "concept", "", evidence_id) for key in keys]
            relations += [RelationMention(*sorted((a, b)), "", "", 1.0, evidence_id) for i, a in enumerate(keys) for b in keys[i + 1 :]]
        entity_keys = list(dict.fromkeys(m.key for m in mentions))
        relation_keys = list(dict.fromkeys((r.source, r.target) for r in relations))
        entity_rows = [int(key.split()[1]) for key in entity_keys]
        relation_vectors = _normalised(np.stack([
            self.entity_vectors[int(a.split()[1])] + self.entity_vectors[int(b.split()[1])] for a, b in relation_keys
        ])) if relation_keys else np.zeros((0, self.shape.dimension), np.float32)
        document = DocumentRecord(document_id, name, "application/pdf", "synthetic", len(rows) // 4 + 1, len(blocks), len(rows), 0,
                                  len(entity_keys), len(relation_keys), 0, 0.0)
        return Segment(
            document=document, blocks=blocks, evidence=evidence, evidence_vectors=self.chunk_vectors[rows.start : rows.stop],
            entities=mentions, entity_keys=entity_keys, entity_vectors=self.entity_vectors[entity_rows],
            relations=relations, relation_keys=relation_keys, relation_vectors=relation_vectors,
        )

    def questions(self, count: int, words: int = 6, noise: float = 0.5, common: int = 100) -> list[SyntheticQuestion]:
        """Questions made from random chunks: some of the chunk's content words, its vector plus noise.

        The `common` most frequent words of the Zipf vocabulary play the part of stop words (each is in most
        chunks) and are never asked for, as BM25 drops real stop words from real questions."""
        rng = np.random.default_rng(self.shape.seed + 1)
        out = []
        for row in rng.choice(self.shape.chunks, size=count, replace=False):
            content = np.unique(self.chunk_words[row][self.chunk_words[row] >= common])
            picked = rng.choice(content, size=min(words, len(content)), replace=False)
            vector = _normalised(self.chunk_vectors[row] + noise * _normalised(rng.normal(size=self.shape.dimension)))
            out.append(SyntheticQuestion(" ".join(f"w{w}" for w in picked), vector[None, :], int(row)))
        return out


def write_collection(segments: Iterable[Segment], data_dir: Path, name: str, count_tokens: Optional[TokenCounts] = None) -> Path:
    """Segments and a manifest on disk as commits would leave them (no index files, no assets): a collection
    of any size without committing it document by document. With `count_tokens` (the embedder's) each
    segment's answer sentences are cut and stored as the ingest does. Returns its folder."""
    root = data_dir / "collections" / name
    root.mkdir(parents=True)
    entries = []
    for segment in segments:
        folder = root / f"seg-{segment.document.document_id}"
        (folder / "assets").mkdir(parents=True)
        (folder / "pages").mkdir()
        if count_tokens is not None:
            segment.cut_sentences(count_tokens)
        segment.write(folder)
        entries.append(ManifestEntry(segment.document.name, folder.name))
    write_manifest(root, len(entries), entries)
    return root
