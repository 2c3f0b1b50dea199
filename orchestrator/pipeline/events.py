"""What a query streams back, in order: evidence, answer deltas, one final answer."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..knowledge.segments import EvidenceRecord


@dataclass(frozen=True)
class EvidenceItem:
    rank: int  # 1-based, as cited in the answer ([1], [2], ...)
    score: float
    record: EvidenceRecord


@dataclass(frozen=True)
class EvidenceEvent:
    items: tuple[EvidenceItem, ...]


@dataclass(frozen=True)
class TokenInfo:
    token_id: int
    log_prob: float
    normalized_entropy: float


@dataclass(frozen=True)
class AnswerDeltaEvent:
    text: str
    tokens: tuple[TokenInfo, ...]


@dataclass(frozen=True)
class Citation:
    evidence_rank: int
    passage_id: str
    document_name: str
    page: int


@dataclass(frozen=True)
class Usage:
    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True)
class FinalAnswerEvent:
    text: str
    citations: tuple[Citation, ...]
    finish_reason: str
    answer_source: str
    timings_ms: dict[str, float] = field(default_factory=dict)
    usage: Usage = Usage()


QueryEvent = EvidenceEvent | AnswerDeltaEvent | FinalAnswerEvent
