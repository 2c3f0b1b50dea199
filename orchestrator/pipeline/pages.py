"""Page-image retrieval (V-RAG): the question through every page-encoder family's text tower, similarities
averaged across families, the top-m pages, then the VLM's yes/no relevance filter, keeping the top-k.

A page one family did not embed counts 0 for that family (the average is over every family the collection
has), and each family's similarity is computed exactly for every candidate page, not only for the pages that
family itself ranked in its top-m.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..knowledge.storage.segments import PageRecord
from ..knowledge.storage.snapshot import Snapshot
from .accounting import StageModels


@dataclass(frozen=True)
class PageHit:
    row: int  # page row of the snapshot
    page: PageRecord
    similarity: float  # averaged over the encoder families
    per_family: dict[str, float]
    relevance: Optional[float] = None  # the VLM's P(yes), once filtered


def average_similarity(per_family: dict[str, np.ndarray]) -> np.ndarray:
    """Mean over families of row-aligned similarity arrays (V-RAG's Sim_avg)."""
    return np.mean(np.stack(list(per_family.values())), axis=0) if per_family else np.zeros(0)


async def search_pages(
    models: StageModels, snapshot: Snapshot, question: str, top_m: int, timeout_s: float
) -> list[PageHit]:
    families = sorted(snapshot.page_indexes)
    if not families or not snapshot.pages:
        return []
    vectors = await asyncio.gather(*(models.embed_page_text(family, [question], timeout_s) for family in families))
    candidates: set[int] = set()
    for family, vector in zip(families, vectors):
        _, rows = snapshot.page_indexes[family].search(vector, top_m)
        candidates.update(int(row) for row in rows[0] if row >= 0)
    rows = sorted(candidates)
    per_family = {
        family: snapshot.page_vectors(family, rows) @ np.asarray(vector, dtype=np.float32)[0]
        for family, vector in zip(families, vectors)
    }
    average = average_similarity(per_family)
    order = sorted(range(len(rows)), key=lambda i: (-average[i], rows[i]))[:top_m]
    return [
        PageHit(rows[i], snapshot.pages[rows[i]], float(average[i]), {f: float(s[i]) for f, s in per_family.items()})
        for i in order
    ]


async def filter_pages(
    models: StageModels, snapshot: Snapshot, question: str, hits: Sequence[PageHit], top_k: int, min_relevance: float,
    timeout_s: float,
) -> list[PageHit]:
    """The pages the VLM says can answer the question (P(yes) >= min_relevance), most relevant first."""
    if not hits or top_k <= 0:
        return []
    images = await asyncio.to_thread(lambda: [snapshot.page_image(hit.page) for hit in hits])
    relevance = await models.page_relevance(question, images, timeout_s)
    judged = [
        PageHit(hit.row, hit.page, hit.similarity, hit.per_family, float(score)) for hit, score in zip(hits, relevance)
    ]
    kept = [hit for hit in judged if hit.relevance >= min_relevance]
    kept.sort(key=lambda hit: (-hit.relevance, -hit.similarity, hit.row))
    return kept[:top_k]
