"""The evidence a query hands its answerer: ranked passages and units with their signals and adjacent context
("small to big": the blocks around a passage or a unit on its page), then the pages the page-image path kept,
numbered as the answer cites them."""

from __future__ import annotations

from typing import Sequence

from ..knowledge.parsing.chunking import Span
from ..knowledge.storage.segments import EvidenceRecord
from ..knowledge.storage.snapshot import Snapshot
from .context import adjacent_blocks, context_texts
from .events import EvidenceItem, Signals
from .fusion import ScoredCandidate
from .pages import PageHit

WHOLE_PAGE = (0, 0, 1000, 1000)


def evidence_items(
    snapshot: Snapshot, selected: Sequence[ScoredCandidate], pages: Sequence[PageHit], context_blocks: int
) -> list[EvidenceItem]:
    """Ranks 1.. for the selected candidates, best first (passages and units with the blocks next to them on
    their page, leaving out blocks the selection already holds), then the pages."""
    records = [snapshot.evidence[c.row] for c in selected]
    covered: dict[str, set[int]] = {}
    for record in records:
        covered.setdefault(record.document_id, set()).update(span.block for span in record.spans)
    items = []
    for rank, (candidate, record) in enumerate(zip(selected, records), 1):
        context: tuple[str, ...] = ()
        if record.kind in ("passage", "unit") and record.spans:
            blocks = snapshot.segment(record.document_id).blocks
            near = adjacent_blocks(blocks, record.spans[0].block, context_blocks, frozenset(covered[record.document_id]))
            context = context_texts(blocks, near)
        signals = Signals(
            candidate.semantic, candidate.lexical, candidate.structural, candidate.modality, candidate.fused,
            candidate.page_lexical, candidate.rerank, final=candidate.final, found_by=candidate.found_by,
        )
        items.append(EvidenceItem(rank, candidate.final, record, signals, context))
    for rank, hit in enumerate(pages, len(items) + 1):
        segment = snapshot.segment(hit.page.document_id)
        document = segment.document
        record = EvidenceRecord(
            f"{document.document_id}:p{hit.page.page}", document.document_id, document.name, "page", "page", "",
            segment.page_section(hit.page.page),
            (Span(-1, hit.page.page, WHOLE_PAGE),), asset=f"{document.document_id}/{hit.page.image}",
        )
        relevance = hit.relevance or 0.0
        signals = Signals(page_similarity=hit.similarity, page_relevance=hit.relevance, final=relevance, found_by=("page",))
        items.append(EvidenceItem(rank, relevance, record, signals))
    return items


def answering_order(items: Sequence[EvidenceItem]) -> list[EvidenceItem]:
    """The order the answerer reads the evidence in: the best text item, then the pages the page filter kept,
    then the rest of the text. Pages keep reserved places rather than competing on score: their score is the
    VLM filter's P(yes), not comparable with a fused text score, and listed after all text (their rank order) they
    were the first entries a prompt cut to its budget dropped, so V-RAG's evidence rarely reached the answer.
    Ranks, and so citations, do not change."""
    text = [item for item in items if item.record.kind != "page"]
    pages = [item for item in items if item.record.kind == "page"]
    return text[:1] + pages + text[1:]
