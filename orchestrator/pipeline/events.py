"""What a query streams back, in order: the route, the evidence, answer deltas, one final answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..knowledge.parsing.chunking import Span
from ..knowledge.storage.segments import EvidenceRecord
from .accounting import CostReport
from .router import RouteDecision


@dataclass(frozen=True)
class RouteEvent:
    decision: RouteDecision


@dataclass(frozen=True)
class Signals:
    """Every score behind an evidence item's place (all in [0, 1] except rerank, the cross-encoder's raw score)."""

    semantic: float = 0.0
    lexical: float = 0.0
    structural: float = 0.0
    modality: float = 0.0
    fused: float = 0.0
    page_lexical: float = 0.0
    rerank: Optional[float] = None
    page_similarity: Optional[float] = None  # page evidence: encoder families' averaged similarity
    page_relevance: Optional[float] = None  # page evidence: the VLM filter's P(yes)
    final: float = 0.0
    found_by: tuple[str, ...] = ()  # dense | sparse | page_lexical | graph; page for page-image evidence


@dataclass(frozen=True)
class EvidenceItem:
    rank: int  # 1-based, as cited in the answer ([1], [2], ...)
    score: float  # the final score the ranking used
    record: EvidenceRecord  # kind "passage", "unit", "page" for a page image ("chunk": an older document's text)
    signals: Signals = Signals()
    context: tuple[str, ...] = ()  # adjacent blocks on the page (units)
    perception: str = ""  # the VLM's textual account of the image, table or page (DPR)


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
    regions: tuple[Span, ...] = ()  # the quoted sentence's block, or every block of the cited evidence
    quote: str = ""  # the sentence an extractive answer quotes


@dataclass(frozen=True)
class Usage:
    model_calls: int = 0
    prompt_tokens: int = 0  # of the answering model (LLM or VLM), every call of the query
    completion_tokens: int = 0


@dataclass(frozen=True)
class UncertaintyReport:
    """HKRAG's loop as it ran: the pruner's cut, the judger's entropies, the decoupler's rounds."""

    evidence_used: int  # evidence items the answer reads: the text the pruner kept and the pages the filter kept
    relevance_mass: float  # what they summed to
    entropies: tuple[float, ...]  # each probe answer's measure (nats): mean token entropy, or mean surprisal
    threshold: float  # in nats: the LLM's calibrated threshold for the measure, or uncertainty.threshold_nats
    iterations: int  # decoupler rounds that ran
    uncertain: bool  # still above the threshold at the end
    details: str = ""  # the fine-print notes the decoupler mined
    measure: str = "entropy"  # what `entropies` are: entropy | surprisal (UncertaintySettings.measure)


@dataclass(frozen=True)
class ShortAnswer:
    """The value the question asks for, alone: `text` is cut from the quoted sentence of citation `citation` at
    [start, end) (a yes/no answer spans that whole sentence); citation -1 where no sentence is quoted (the LLM's
    answer, which is its own short answer)."""

    text: str
    answer_type: str  # answer_types.ANSWER_TYPES
    citation: int
    start: int
    end: int


@dataclass(frozen=True)
class AnswerabilityReport:
    """Whether the evidence can answer the question, and what that decision read (pipeline/answerability.py)."""

    answerable: bool
    probability: float  # the model's P(answerable); -1 under the similarity rule
    threshold: float  # what it was compared with (min_answerability, or the similarity rule's floor)
    model: str  # "<file version>/<full|lexical>", or "similarity"
    features: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class FinalAnswerEvent:
    text: str
    citations: tuple[Citation, ...]
    finish_reason: str
    answer_source: str  # llm | extractive | hybrid (the LLM from the extractive sentences) | vlm | refusal
    timings_ms: dict[str, float] = field(default_factory=dict)
    stage_starts_ms: dict[str, float] = field(default_factory=dict)  # when stages began, from the query's start
    usage: Usage = Usage()
    cost: Optional[CostReport] = None
    degraded: bool = False  # a model was down, failed or out of time: its stage was skipped or replaced
    degraded_reason: str = ""  # each skipped or replaced stage with its cause
    uncertainty: Optional[UncertaintyReport] = None
    short_answer: Optional[ShortAnswer] = None
    retrieval_mode: str = "full"  # full | lexical (asked for, or the embedder was unavailable: degraded says so)
    answerability: Optional[AnswerabilityReport] = None


QueryEvent = RouteEvent | EvidenceEvent | AnswerDeltaEvent | FinalAnswerEvent
