"""From a cost run's per-query model usage to the shapes of the model calls, and back to seconds per query.

The stand-in cost model (standin_timing.py) times realistic-size models at the shapes the pipeline actually sent;
this module is its arithmetic, kept free of torch so it is unit-tested on synthetic usage:

  shapes      each usage row (calls of one model in one stage, summed: ModelUsage) becomes `calls` calls of
              its mean shape: items per call, tokens per item, images and generated tokens per call
  seconds     a query's model-seconds = sum over its rows of calls x the timed seconds of that shape; at
              concurrency N the shape is timed with N queries' calls merged into one batch, divided by N
  buckets     shapes are rounded up (sequence lengths to multiples of 16, prompts to 64, generated tokens
              kept) so a few dozen timings cover a whole run

Token counts are the deployment's own tokenizers' (the tiny profile's), and the VLM's prompt tokens include
its image positions: `source_image_tokens` per image are taken out and the stand-in's own added back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Optional, Sequence

from orchestrator.pipeline.usage import ModelUsage
from orchestrator.models import contracts
from .stats import saving

ENCODER = "encoder"  # text in, one forward pass: embedder, reranker, page-text towers
IMAGE_ENCODER = "image_encoder"  # page images in, one forward pass
RELEVANCE = "relevance"  # the VLM's yes/no prefill, one per image
PREFILL = "prefill"  # a generator's one-step prefill over text: the router, which asks the LLM in the hf profile
GENERATOR = "generator"  # prefill + decoding, text only (LLM) or with images (VLM)


def call_kind(model: str) -> str:
    if model in (contracts.LLM.name, contracts.VLM.name):
        return GENERATOR
    if model == contracts.VLM_RELEVANCE.name:
        return RELEVANCE
    if model == contracts.ROUTER.name:
        return PREFILL
    if model.startswith("page_image_"):
        return IMAGE_ENCODER
    return ENCODER


@dataclass(frozen=True, order=True)
class CallShape:
    """One model call: `batch` rows of `tokens` text tokens each; generators add images and generated tokens."""

    model: str
    batch: int
    tokens: int  # per row: sequence length (encoders), question tokens (relevance), prompt text tokens (generators)
    images: int = 0  # per row
    new_tokens: int = 0  # generated per row

    def merged(self, queries: int) -> "CallShape":
        """The same call of `queries` concurrent queries, batched together."""
        return CallShape(self.model, self.batch * queries, self.tokens, self.images, self.new_tokens)

    def as_dict(self) -> dict:
        return {"model": self.model, "batch": self.batch, "tokens": self.tokens, "images": self.images,
                "new_tokens": self.new_tokens}


def _round_up(value: float, step: int) -> int:
    return max(step, int(math.ceil(value / step)) * step)


def row_shape(row: ModelUsage, source_image_tokens: int) -> Optional[CallShape]:
    """The mean call of a usage row, bucketed; None for a row with no calls."""
    if row.calls <= 0:
        return None
    kind = call_kind(row.model)
    if kind == GENERATOR:
        # The ledger records 1 + images items per generation call (accounting.StageModels.generate).
        images = max(0, round((row.items - row.calls) / row.calls))
        text = row.tokens_in / row.calls - images * source_image_tokens
        return CallShape(row.model, 1, _round_up(max(1.0, text), 64), images, max(1, round(row.tokens_out / row.calls)))
    batch = max(1, math.ceil(row.items / row.calls))
    if kind == IMAGE_ENCODER:
        return CallShape(row.model, batch, 0, 1)
    per_row = row.tokens_in / max(1, row.items)
    if kind == RELEVANCE:
        return CallShape(row.model, batch, _round_up(per_row, 16), 1)
    if kind == PREFILL:
        return CallShape(row.model, batch, _round_up(per_row, 16))
    return CallShape(row.model, batch, _round_up(per_row, 16))


def query_calls(usage: Iterable[ModelUsage], source_image_tokens: int) -> list[tuple[CallShape, int]]:
    """(shape, number of calls) for every row of one query's usage."""
    out = []
    for row in usage:
        shape = row_shape(row, source_image_tokens)
        if shape is not None:
            out.append((shape, row.calls))
    return out


Timer = Callable[[CallShape], float]  # seconds one call of that shape takes on the stand-in


def query_seconds(calls: Sequence[tuple[CallShape, int]], timer: Timer, concurrency: int = 1) -> dict[str, float]:
    """Model-seconds per model for one query, its calls batched with those of `concurrency - 1` other queries."""
    seconds: dict[str, float] = {}
    for shape, count in calls:
        seconds[shape.model] = seconds.get(shape.model, 0.0) + count * timer(shape.merged(concurrency)) / concurrency
    return seconds


def usage_rows(record: Mapping) -> list[ModelUsage]:
    """A bench record's `usage` list (as written to the cost JSON) as the pipeline's records."""
    return [ModelUsage(u["model"], u["stage"], u["calls"], u["items"], u["tokens_in"], u["tokens_out"], u["model_ms"])
            for u in record.get("usage", [])]


@dataclass(frozen=True)
class SeriesCost:
    """Stand-in model-seconds and $ of one series of queries (routed, always-complex, one route)."""

    queries: int
    seconds_per_query: float
    seconds_by_model: dict[str, float]
    usd_per_1000_queries: float

    def as_dict(self) -> dict:
        return {"queries": self.queries, "model_seconds_per_query": self.seconds_per_query,
                "model_seconds_per_query_by_model": self.seconds_by_model, "usd_per_1000_queries": self.usd_per_1000_queries}


def series_cost(per_query: Sequence[Mapping[str, float]], usd_per_model_second: float) -> SeriesCost:
    """Mean over the queries of a series (raw per-query figures, not averages of averages)."""
    n = len(per_query)
    if n == 0:
        return SeriesCost(0, 0.0, {}, 0.0)
    models = sorted({m for q in per_query for m in q})
    by_model = {m: sum(q.get(m, 0.0) for q in per_query) / n for m in models}
    mean = sum(by_model.values())
    return SeriesCost(n, mean, by_model, mean * usd_per_model_second * 1000.0)


def routed_saving(routed: SeriesCost, complex_: SeriesCost) -> Optional[float]:
    return saving(routed.seconds_per_query, complex_.seconds_per_query) if routed.queries and complex_.queries else None


def distinct_shapes(calls: Iterable[Sequence[tuple[CallShape, int]]], concurrency: Sequence[int]) -> list[CallShape]:
    """Every shape that needs a timing, at every concurrency level, smallest first."""
    return sorted({shape.merged(n) for query in calls for shape, _ in query for n in concurrency})
