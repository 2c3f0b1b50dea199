"""Cost per query from what the models measurably consumed, priced by the price table.

Model-seconds per model come from Triton's server-side compute time (the compute delta of the model's leaf
steps between two statistics snapshots) where Triton measures it, and from the orchestrator's measured call
time (the final event's per-model `model_ms`, queueing included) for decoupled streaming models, whose
Triton compute time stops when their generation thread starts, or when no Triton statistics are at hand.
Each figure says which source it came from.

  hardware $  = sum over models of model-seconds x (price per unit-hour x units per model) / 3600
  hosted $    = sum over models of tokens_in x input $/1M + tokens_out x output $/1M (a hosted-API comparison)
  tokens      = every model's tokens in and out (encoders included); generative tokens = those of the LLM
                and the VLM alone (contracts.GENERATIVE_MODELS), the figure papers and API bills count
  $ at a rate = deployment $/hour / queries per hour at that throughput; at the best closed-loop level of
                the load benchmark (saturation), the capacity cost per query
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional, Sequence

import numpy as np

from orchestrator.pipeline.usage import ModelUsage as Usage
from orchestrator.models.contracts import GENERATIVE_MODELS  # one row of a query's cost: the pipeline's own record
from .prices import PriceTable
from .stats import percentile, saving
from .triton_stats import ModelCounters

TRITON = "triton_compute"
ORCHESTRATOR = "orchestrator_wall"


def usage_from_proto(message) -> Usage:
    """One row of the final event's cost.models (ModelUsage in the proto) as the pipeline's own record."""
    return Usage(message.model, message.stage, message.calls, message.items, message.tokens_in, message.tokens_out,
                 message.model_ms)


@dataclass(frozen=True)
class QueryCost:
    model_seconds: dict[str, float]
    sources: dict[str, str]  # model -> TRITON | ORCHESTRATOR
    hardware_usd: float
    hosted_usd: float
    tokens_in: int
    tokens_out: int
    generative_tokens: int = 0  # tokens in + out of the LLM and the VLM alone
    unpriced_models: tuple[str, ...] = ()  # models with tokens but no hosted price

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out

    @property
    def seconds(self) -> float:
        return sum(self.model_seconds.values())

    def as_dict(self) -> dict:
        return {
            "model_seconds": self.model_seconds, "sources": self.sources, "hardware_usd": self.hardware_usd,
            "hosted_usd": self.hosted_usd, "tokens_in": self.tokens_in, "tokens_out": self.tokens_out,
            "generative_tokens": self.generative_tokens, "unpriced_models": list(self.unpriced_models),
        }


def model_seconds(
    usage: Sequence[Usage],
    server: Optional[Mapping[str, ModelCounters]] = None,
    decoupled: Iterable[str] = (),
) -> tuple[dict[str, float], dict[str, str]]:
    """Seconds each public model computed for the usage given, and the source of each figure.

    `server`: Triton counters per public model (Topology.by_public_model of a snapshot delta) for the same
    window, or None when Triton's statistics are not available."""
    streaming = set(decoupled)
    wall: dict[str, float] = {}
    for row in usage:
        wall[row.model] = wall.get(row.model, 0.0) + row.model_ms / 1000.0
    seconds: dict[str, float] = {}
    sources: dict[str, str] = {}
    models = set(wall) | (set(server) if server is not None else set())
    for model in sorted(models):
        if server is not None and model not in streaming and model in server:
            seconds[model], sources[model] = server[model].compute_ns / 1e9, TRITON
        elif model in wall:
            seconds[model], sources[model] = wall[model], ORCHESTRATOR
    return seconds, sources


def price(seconds: Mapping[str, float], sources: Mapping[str, str], usage: Sequence[Usage], prices: PriceTable) -> QueryCost:
    per_second = prices.hardware.usd_per_model_second
    hosted, unpriced = 0.0, set()
    for row in usage:
        token_price = prices.hosted.get(row.model)
        if token_price is None:
            if row.tokens_in or row.tokens_out:
                unpriced.add(row.model)
            continue
        hosted += row.tokens_in * token_price.input_usd_per_million / 1e6
        hosted += row.tokens_out * token_price.output_usd_per_million / 1e6
    return QueryCost(
        dict(seconds), dict(sources), sum(seconds.values()) * per_second, hosted,
        sum(row.tokens_in for row in usage), sum(row.tokens_out for row in usage),
        sum(row.tokens_in + row.tokens_out for row in usage if row.model in GENERATIVE_MODELS), tuple(sorted(unpriced)),
    )


def query_cost(
    usage: Sequence[Usage],
    prices: PriceTable,
    server: Optional[Mapping[str, ModelCounters]] = None,
    decoupled: Iterable[str] = (),
) -> QueryCost:
    seconds, sources = model_seconds(usage, server, decoupled)
    return price(seconds, sources, usage, prices)


def summarize_costs(costs: Sequence[QueryCost]) -> dict:
    """Per query (mean of the raw per-query costs, and p50/p95) and per 1,000 queries, with model-seconds per model."""
    if not costs:
        return {"queries": 0}
    hardware = np.array([c.hardware_usd for c in costs])
    hosted = np.array([c.hosted_usd for c in costs])
    models = sorted({m for c in costs for m in c.model_seconds})
    sources = sorted({f"{m}:{s}" for c in costs for m, s in c.sources.items()})
    return {
        "queries": len(costs),
        "hardware_usd_per_query": float(hardware.mean()),
        "hardware_usd_per_query_p50": percentile(hardware, 50),
        "hardware_usd_per_query_p95": percentile(hardware, 95),
        "hardware_usd_per_1000_queries": float(hardware.mean() * 1000),
        "hosted_usd_per_query": float(hosted.mean()),
        "hosted_usd_per_1000_queries": float(hosted.mean() * 1000),
        "model_seconds_per_query": float(np.mean([c.seconds for c in costs])),
        "model_seconds_per_query_by_model": {m: float(np.mean([c.model_seconds.get(m, 0.0) for c in costs])) for m in models},
        "tokens_in_per_query": float(np.mean([c.tokens_in for c in costs])),
        "tokens_out_per_query": float(np.mean([c.tokens_out for c in costs])),
        "tokens_per_query": float(np.mean([c.tokens for c in costs])),
        "generative_tokens_per_query": float(np.mean([c.generative_tokens for c in costs])),
        "sources": sources,
        "unpriced_models": sorted({m for c in costs for m in c.unpriced_models}),
    }


def savings(candidate: dict, baseline: dict) -> dict:
    """Relative savings of one cost summary against another on the same questions (0.4 = 40% cheaper)."""
    keys = ("hardware_usd_per_query", "hosted_usd_per_query", "model_seconds_per_query", "tokens_per_query",
            "generative_tokens_per_query")
    return {key: saving(candidate[key], baseline[key]) for key in keys if candidate.get(key) is not None and baseline.get(key) is not None}


def usd_per_query_at_rate(prices: PriceTable, queries_per_second: float) -> Optional[float]:
    """The deployment's hourly price spread over the queries it answers per hour at that throughput."""
    if queries_per_second <= 0:
        return None
    return prices.hardware.usd_per_deployment_hour / (queries_per_second * 3600.0)


@dataclass
class CostBook:
    """Per-query costs grouped by a label (route, configuration) as they are measured."""

    costs: dict[str, list[QueryCost]] = field(default_factory=dict)

    def add(self, label: str, cost: QueryCost) -> None:
        self.costs.setdefault(label, []).append(cost)

    def summary(self) -> dict:
        return {label: summarize_costs(costs) for label, costs in sorted(self.costs.items())}
