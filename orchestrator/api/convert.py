"""Pipeline events <-> protobuf messages (the only place that knows both)."""

from __future__ import annotations

from ..knowledge.ingest import IngestResult
from ..knowledge.segments import DocumentRecord
from ..pipeline.events import AnswerDeltaEvent, EvidenceEvent, FinalAnswerEvent, QueryEvent
from ..pipeline.query import QueryInput
from .protos import pb


def query_input(request: "pb.QueryRequest") -> QueryInput:
    options = request.options

    def optional(name: str):
        return getattr(options, name) if options.HasField(name) else None

    return QueryInput(
        collection=request.collection,
        question=request.question,
        top_k=optional("top_k"),
        max_tokens=optional("max_tokens"),
        temperature=optional("temperature"),
        top_p=optional("top_p"),
        seed=optional("seed"),
    )


def query_event(event: QueryEvent, request_id: str) -> "pb.QueryEvent":
    if isinstance(event, EvidenceEvent):
        items = [
            pb.EvidenceItem(
                passage_id=item.record.evidence_id,
                document_id=item.record.document_id,
                document_name=item.record.document_name,
                page=item.record.page,
                block_type=item.record.block_type,
                section=item.record.section,
                text=item.record.text,
                score=item.score,
                rank=item.rank,
                regions=[pb.Region(page=s.page, bbox=list(s.bbox) if any(s.bbox) else []) for s in item.record.spans if s.page >= 0],
                asset=item.record.asset,
            )
            for item in event.items
        ]
        return pb.QueryEvent(request_id=request_id, evidence=pb.Evidence(items=items))
    if isinstance(event, AnswerDeltaEvent):
        tokens = [pb.TokenInfo(token_id=t.token_id, log_prob=t.log_prob, normalized_entropy=t.normalized_entropy) for t in event.tokens]
        return pb.QueryEvent(request_id=request_id, delta=pb.AnswerDelta(text=event.text, tokens=tokens))
    if isinstance(event, FinalAnswerEvent):
        final = pb.FinalAnswer(
            text=event.text,
            citations=[
                pb.Citation(evidence_rank=c.evidence_rank, passage_id=c.passage_id, document_name=c.document_name, page=c.page)
                for c in event.citations
            ],
            finish_reason=event.finish_reason,
            answer_source=event.answer_source,
            timings=[pb.StageTiming(stage=name, milliseconds=ms) for name, ms in event.timings_ms.items()],
            usage=pb.Usage(
                model_calls=event.usage.model_calls,
                prompt_tokens=event.usage.prompt_tokens,
                completion_tokens=event.usage.completion_tokens,
            ),
        )
        return pb.QueryEvent(request_id=request_id, final=final)
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
    )


def ingest_report(result: IngestResult) -> "pb.IngestReport":
    return pb.IngestReport(
        collection=result.collection,
        document_id=result.document.document_id,
        passages=result.document.chunks + result.document.units,
        already_present=result.already_present,
        seconds=result.seconds,
        document=document_info(result.document),
        replaced=result.replaced is not None,
        stages=[pb.StageTiming(stage=name, milliseconds=seconds * 1000) for name, seconds in result.stage_seconds.items()],
    )
