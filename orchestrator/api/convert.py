"""Pipeline events <-> protobuf messages (the only place that knows both)."""

from __future__ import annotations

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
                passage_id=item.passage.passage_id,
                document_id=item.passage.document_id,
                document_name=item.passage.document_name,
                page=item.passage.page,
                block_type=item.passage.block_type,
                section=item.passage.section,
                text=item.passage.text,
                score=item.score,
                rank=item.rank,
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
