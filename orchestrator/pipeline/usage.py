"""What a query's model calls consumed, as plain records: the ledger (accounting.py) writes them, the cost
report and the benchmarks read them. Kept free of the Triton client so the bench's arithmetic runs anywhere."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelUsage:
    """Calls of one model in one stage, summed."""

    model: str
    stage: str
    calls: int
    items: int
    tokens_in: int
    tokens_out: int
    model_ms: float


@dataclass(frozen=True)
class CostReport:
    usage: tuple[ModelUsage, ...]
    model_ms: float  # wall time during which at least one model call was in flight
    orchestrator_ms: float  # the rest of the query's wall time: retrieval, fusion, prompts, gRPC
    # orchestrator_ms by stage: each stage's wall time less the time its own model calls were in flight, and
    # "unattributed" for what no stage covers (request handling, events, conversion). Stages that overlap (the
    # page-image branch runs beside text retrieval, the graph beside the passage searches) each count their
    # own, so the parts may sum to more.
    orchestrator_ms_by_stage: dict[str, float] = field(default_factory=dict)

    @property
    def model_calls(self) -> int:
        return sum(u.calls for u in self.usage)

    def tokens(self, *models: str) -> tuple[int, int]:
        chosen = [u for u in self.usage if not models or u.model in models]
        return sum(u.tokens_in for u in chosen), sum(u.tokens_out for u in chosen)
