"""Pipeline events <-> protobuf messages (the only place that knows both)."""

from __future__ import annotations

import logging
from typing import Sequence

from ..knowledge.parsing.chunking import Span
from ..knowledge.ingest import IngestResult
from ..knowledge.ingest_progress import DocumentFigures, ProgressFigures
from ..knowledge.storage.segments import DocumentRecord
from ..pipeline.accounting import CostReport
from ..pipeline.events import (
    AnswerDeltaEvent,
    EvidenceEvent,
    EvidenceItem,
    FinalAnswerEvent,
    QueryEvent,
    RouteEvent,
    Signals,
    UncertaintyReport,
)
from ..pipeline.plan import QueryOptions
from ..pipeline.query import QueryInput
from ..models.protocol import ModelStatistics
from ..pipeline.router import RouteDecision
from .protos import pb


log = logging.getLogger("thinkserve.api")


def query_input(request: "pb.QueryRequest") -> QueryInput:
    options = request.options
    values = {name: getattr(options, name) for name in QueryOptions.model_fields if options.HasField(name)}
    return QueryInput(collection=request.collection, question=request.question, options=QueryOptions.parse(values))


def route_decision(decision: RouteDecision) -> "pb.RouteDecision":
    features = decision.features
    return pb.RouteDecision(
        label=decision.label,
        source=decision.source,
        probabilities=list(decision.probabilities),
        sub_questions=list(decision.sub_questions),
        instruction=decision.instruction,
        intent=features.intent,
        entities=list(features.entities),
        visual_references=features.visual_references,
        constraints=features.constraints,
        dependency_cues=features.dependency_cues,
        complexity_score=features.score,
        modalities=features.modalities,
    )


def signals(value: Signals) -> "pb.Signals":
    optional = {
        name: getattr(value, name) for name in ("rerank", "page_similarity", "page_relevance") if getattr(value, name) is not None
    }
    return pb.Signals(
        semantic=value.semantic, lexical=value.lexical, structural=value.structural, modality=value.modality,
        fused=value.fused, final=value.final, found_by=list(value.found_by), page_lexical=value.page_lexical, **optional,
    )


def evidence_item(item: EvidenceItem) -> "pb.EvidenceItem":
    record = item.record
    return pb.EvidenceItem(
        passage_id=record.evidence_id,
        document_id=record.document_id,
        document_name=record.document_name,
        page=record.page,
        block_type=record.block_type,
        section=record.section,
        text=record.text,
        score=item.score,
        rank=item.rank,
        regions=regions(record.spans),
        asset=record.asset,
        kind=record.kind,
        signals=signals(item.signals),
        context=list(item.context),
        perception=item.perception,
    )


def regions(spans: Sequence[Span]) -> list["pb.Region"]:
    """The page regions of spans (sources without pages have none); an unknown bbox is sent empty."""
    return [
        pb.Region(page=s.page, bbox=list(s.bbox) if any(s.bbox) else [], ocr_confidence=s.ocr_confidence)
        for s in spans if s.page >= 0
    ]


def cost(report: CostReport) -> "pb.Cost":
    return pb.Cost(
        models=[
            pb.ModelUsage(
                model=u.model, stage=u.stage, calls=u.calls, items=u.items, tokens_in=u.tokens_in, tokens_out=u.tokens_out,
                model_ms=u.model_ms,
            )
            for u in report.usage
        ],
        model_ms=report.model_ms,
        orchestrator_ms=report.orchestrator_ms,
        orchestrator_ms_by_stage=report.orchestrator_ms_by_stage,
    )


def uncertainty(report: UncertaintyReport) -> "pb.Uncertainty":
    return pb.Uncertainty(
        evidence_used=report.evidence_used, relevance_mass=report.relevance_mass, entropies=list(report.entropies),
        threshold=report.threshold, iterations=report.iterations, uncertain=report.uncertain, details=report.details,
        measure=report.measure,
    )


def final_answer(event: FinalAnswerEvent) -> "pb.FinalAnswer":
    final = pb.FinalAnswer(
        text=event.text,
        citations=[
            pb.Citation(
                evidence_rank=c.evidence_rank, passage_id=c.passage_id, document_name=c.document_name, page=c.page,
                regions=regions(c.regions), quote=c.quote,
            )
            for c in event.citations
        ],
        finish_reason=event.finish_reason,
        answer_source=event.answer_source,
        timings=[pb.StageTiming(stage=name, milliseconds=ms, start_ms=event.stage_starts_ms.get(name))
                 for name, ms in event.timings_ms.items()],
        usage=pb.Usage(
            model_calls=event.usage.model_calls,
            prompt_tokens=event.usage.prompt_tokens,
            completion_tokens=event.usage.completion_tokens,
        ),
        degraded=event.degraded,
        degraded_reason=event.degraded_reason,
        retrieval_mode=event.retrieval_mode,
    )
    if event.cost is not None:
        final.cost.CopyFrom(cost(event.cost))
    if event.uncertainty is not None:
        final.uncertainty.CopyFrom(uncertainty(event.uncertainty))
    if event.answerability is not None:
        a = event.answerability
        final.answerability.CopyFrom(pb.Answerability(answerable=a.answerable, probability=a.probability, threshold=a.threshold,
                                                      model=a.model, features=a.features))
    if event.short_answer is not None:
        short = event.short_answer
        final.short_answer.CopyFrom(pb.ShortAnswer(text=short.text, answer_type=short.answer_type, citation=short.citation,
                                                   start=short.start, end=short.end))
    return final


def query_event(event: QueryEvent, request_id: str) -> "pb.QueryEvent":
    if isinstance(event, RouteEvent):
        return pb.QueryEvent(request_id=request_id, route=route_decision(event.decision))
    if isinstance(event, EvidenceEvent):
        return pb.QueryEvent(request_id=request_id, evidence=pb.Evidence(items=[evidence_item(i) for i in event.items]))
    if isinstance(event, AnswerDeltaEvent):
        tokens = [pb.TokenInfo(token_id=t.token_id, log_prob=t.log_prob, normalized_entropy=t.normalized_entropy) for t in event.tokens]
        return pb.QueryEvent(request_id=request_id, delta=pb.AnswerDelta(text=event.text, tokens=tokens))
    if isinstance(event, FinalAnswerEvent):
        return pb.QueryEvent(request_id=request_id, final=final_answer(event))
    raise TypeError(f"unknown event {type(event).__name__}")


def document_info(document: DocumentRecord) -> "pb.DocumentInfo":
    return pb.DocumentInfo(
        document_id=document.document_id,
        name=document.name,
        media_type=document.media_type,
        parser=document.parser,
        pages=document.pages,
        blocks=document.blocks,
        chunks=document.chunks,
        units=document.units,
        entities=document.entities,
        relations=document.relations,
        bytes=document.bytes,
        added_at=document.added_at,
        warnings=list(document.warnings),
        passages=document.passages,
        ocr_pages=document.ocr_pages,
        ocr_figures=document.ocr_figures,
        ocr_lines=document.ocr_lines,
        ocr_low_confidence_lines=document.ocr_low_confidence_lines,
        unparsed_pages=list(document.unparsed_pages),
    )


def ingest_report(result: IngestResult) -> "pb.IngestReport":
    return pb.IngestReport(
        collection=result.collection,
        document_id=result.document.document_id,
        passages=indexed_text(result.document) + result.document.units,
        already_present=result.already_present,
        seconds=result.seconds,
        document=document_info(result.document),
        replaced=result.replaced is not None,
        stages=[pb.StageTiming(stage=name, milliseconds=seconds * 1000) for name, seconds in result.stage_seconds.items()],
        visible=result.visible,
        pages_per_s=result.document.pages / result.seconds if result.seconds > 0 and not result.already_present else 0.0,
        progress=ingest_progress(result.progress) if result.progress is not None else None,
    )


def ingest_progress(figures: ProgressFigures) -> "pb.IngestProgress":
    return pb.IngestProgress(
        pages_done=figures.pages_done, pages_total=figures.pages_total, documents_done=figures.documents_done,
        documents_in_flight=figures.documents_in_flight, documents_failed=figures.documents_failed,
        ocr_pages=figures.ocr_pages, pages_per_s=figures.pages_per_s, seconds=figures.seconds,
        current_document=figures.current_document,
    )


def ingesting_document(figures: DocumentFigures) -> "pb.IngestingDocument":
    return pb.IngestingDocument(
        name=figures.name, stage=figures.stage, pages_total=figures.pages_total, pages_parsed=figures.pages_parsed,
        ocr_pages=figures.ocr_pages, ocr_pages_planned=figures.ocr_pages_planned, pages_read=figures.pages_read,
        pages_per_s=figures.pages_per_s, seconds=figures.seconds, warnings=list(figures.warnings),
    )


def indexed_text(document: DocumentRecord) -> int:
    """Text evidence records of a document: its passages (its chunks, if ingested before passages existed)."""
    return document.passages or document.chunks


def log_ingest(request_id: str, collection: str, result: IngestResult) -> None:
    document = result.document
    log.info(
        "ingest %s: %s into %s: %s, %d pages, %d passages, %d units, %d entities in %.2f s",
        request_id, document.name, collection,
        "already present" if result.already_present else ("replaced" if result.replaced else "added"),
        document.pages, indexed_text(document), document.units, document.entities, result.seconds,
    )


def retrieve_response(events: Sequence[QueryEvent], request_id: str) -> "pb.RetrieveResponse":
    """Retrieve's one message, from the events of a query stopped after its evidence."""
    response = pb.RetrieveResponse(request_id=request_id)
    for event in events:
        if isinstance(event, RouteEvent):
            response.route.CopyFrom(route_decision(event.decision))
        elif isinstance(event, EvidenceEvent):
            response.evidence.items.extend(evidence_item(i) for i in event.items)
        elif isinstance(event, FinalAnswerEvent):
            final = final_answer(event)
            response.timings.extend(final.timings)
            response.cost.CopyFrom(final.cost)
            response.degraded, response.degraded_reason = final.degraded, final.degraded_reason
            response.retrieval_mode = final.retrieval_mode
            if final.HasField("answerability"):
                response.answerability.CopyFrom(final.answerability)
    return response


def model_stats(stats: ModelStatistics) -> "pb.ModelStats":
    return pb.ModelStats(
        name=stats.name, inference_count=stats.inference_count, execution_count=stats.execution_count,
        queue_ms=stats.queue_ms, compute_ms=stats.compute_ms, failures=stats.failures,
        batch_executions=stats.batch_executions,
    )
