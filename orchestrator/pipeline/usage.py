"""What a query's model calls consumed, as plain records: the ledger (accounting.py) writes them, the cost
report and the benchmarks read them. Kept free of the Triton client so the bench's arithmetic runs anywhere."""

from __future__ import annotations

from dataclasses import dataclass


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

    @property
    def model_calls(self) -> int:
        return sum(u.calls for u in self.usage)

    def tokens(self, *models: str) -> tuple[int, int]:
        chosen = [u for u in self.usage if not models or u.model in models]
        return sum(u.tokens_in for u in chosen), sum(u.tokens_out for u in chosen)
