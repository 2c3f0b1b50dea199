"""What one query will do: the request's options, checked, then combined with its route and the server settings.

A stage runs only when the route's policy, the server's switch and the request's switch all allow it, so the
benchmarks can turn any stage off per request (the ablations) without restarting anything. A stage whose result
cannot change the answer (the cross-encoder at rerank_weight 0) runs only when the request asks for it.
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Optional

from ..config import ROUTE_NAMES, Settings
from ..errors import InvalidRequestError

ROUTER_MODES = ("features", "model")
PERCEPTION_MODES = ("dpr", "end_to_end", "off")
ANSWERERS = ("extractive", "llm")


@dataclass(frozen=True)
class QueryOptions:
    """Per-request overrides; None keeps the server's setting."""

    top_k: Optional[int] = None  # evidence items handed to the answerer
    chunk_top_k: Optional[int] = None
    entity_top_k: Optional[int] = None
    graph_hops: Optional[int] = None
    page_top_m: Optional[int] = None
    page_top_k: Optional[int] = None
    route: Optional[str] = None  # a fixed route: the router does not run
    router: Optional[str] = None  # features | model
    dense: Optional[bool] = None
    sparse: Optional[bool] = None
    page_lexical: Optional[bool] = None
    graph: Optional[bool] = None
    rerank: Optional[bool] = None
    page_images: Optional[bool] = None
    perception: Optional[str] = None  # dpr | end_to_end | off
    uncertainty: Optional[bool] = None
    answerer: Optional[str] = None  # extractive | llm
    max_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    seed: Optional[int] = None


@dataclass(frozen=True)
class QueryPlan:
    """The resolved work of one query, once its route is known."""

    route: str
    evidence_k: int
    chunk_top_k: int
    entity_top_k: int
    graph_hops: int
    dense: bool
    sparse: bool
    page_lexical: bool
    page_lexical_top_k: int
    graph: bool
    rerank: bool
    rerank_weight: float
    page_images: bool
    page_top_m: int
    page_top_k: int
    perception: str  # dpr | end_to_end | off
    uncertainty: bool
    decompose: bool
    answerer: str  # extractive | llm
    max_tokens: int
    temperature: float
    top_p: float
    seed: Optional[int]


def validate_options(options: QueryOptions, settings: Settings) -> None:
    """Reject bad options before any work, naming the option and its limit."""
    limit = settings.retrieval.max_top_k
    for name in ("top_k", "chunk_top_k", "entity_top_k"):
        value = getattr(options, name)
        if value is not None and not (0 if name == "entity_top_k" else 1) <= value <= limit:
            raise InvalidRequestError(f"{name} must be in 1..{limit} (retrieval.max_top_k), got {value}")
    if options.graph_hops is not None and not 0 <= options.graph_hops <= 4:
        raise InvalidRequestError(f"graph_hops must be in 0..4, got {options.graph_hops}")
    if options.page_top_m is not None and not 1 <= options.page_top_m <= settings.pages.max_top_m:
        raise InvalidRequestError(f"page_top_m must be in 1..{settings.pages.max_top_m} (pages.max_top_m), got {options.page_top_m}")
    if options.page_top_k is not None and not 0 <= options.page_top_k <= limit:
        raise InvalidRequestError(f"page_top_k must be in 0..{limit} (retrieval.max_top_k), got {options.page_top_k}")
    for name, allowed in (("route", ROUTE_NAMES), ("router", ROUTER_MODES), ("perception", PERCEPTION_MODES), ("answerer", ANSWERERS)):
        value = getattr(options, name)
        if value is not None and value not in allowed:
            raise InvalidRequestError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    generation = settings.generation
    if options.max_tokens is not None and not 0 <= options.max_tokens <= generation.max_tokens_limit:
        raise InvalidRequestError(
            f"max_tokens must be in 0..{generation.max_tokens_limit} (generation.max_tokens_limit), got {options.max_tokens}"
        )
    if options.temperature is not None and not (math.isfinite(options.temperature) and options.temperature >= 0):
        raise InvalidRequestError(f"temperature must be a finite number >= 0, got {options.temperature}")
    if options.top_p is not None and not 0 < options.top_p <= 1:  # NaN fails this too
        raise InvalidRequestError(f"top_p must be in (0, 1], got {options.top_p}")


def router_mode(options: QueryOptions, settings: Settings) -> str:
    """features | model | fixed for this request."""
    if options.route is not None:
        return "fixed"
    return options.router or settings.router.mode or "features"


def make_plan(route: str, options: QueryOptions, settings: Settings) -> QueryPlan:
    policy = settings.routes.policy(route)
    retrieval, pages, generation = settings.retrieval, settings.pages, settings.generation
    answerer = options.answerer or settings.answer.answerer or "extractive"

    def switch(requested: Optional[bool], server: bool, route_allows: bool = True) -> bool:
        return route_allows and server and (requested is None or requested)

    perception = options.perception or settings.perception.mode
    # A cross-encoder with no say (weight 0: the tiny profile's, whose cross-encoder has random weights) cannot
    # change the ranking, so it is not called unless the request asks for it (rerank=true: a benchmark of its cost).
    rerank_weight = retrieval.rerank_weight if retrieval.rerank_weight is not None else 1.0
    if not policy.perception and perception == "dpr":
        perception = "off"
    return QueryPlan(
        route=route,
        evidence_k=options.top_k or policy.evidence_k,
        chunk_top_k=options.chunk_top_k or policy.chunk_top_k,
        entity_top_k=policy.entity_top_k if options.entity_top_k is None else options.entity_top_k,
        graph_hops=policy.graph_hops if options.graph_hops is None else options.graph_hops,
        dense=switch(options.dense, retrieval.dense),
        sparse=switch(options.sparse, retrieval.sparse),
        page_lexical=switch(options.page_lexical, retrieval.page_lexical),
        page_lexical_top_k=retrieval.page_lexical_top_k,
        graph=switch(options.graph, retrieval.graph, policy.graph),
        rerank=switch(options.rerank, retrieval.rerank, policy.rerank) and (rerank_weight > 0 or options.rerank is True),
        rerank_weight=rerank_weight,
        page_images=switch(options.page_images, pages.enabled, policy.page_images),
        page_top_m=options.page_top_m or pages.top_m,
        page_top_k=pages.top_k if options.page_top_k is None else options.page_top_k,
        perception=perception,
        # The judger reads the LLM's token entropies: the loop needs the LLM answerer.
        uncertainty=switch(options.uncertainty, settings.uncertainty.enabled, policy.uncertainty) and answerer == "llm",
        decompose=policy.decompose,
        answerer=answerer,
        max_tokens=generation.max_tokens if options.max_tokens is None else options.max_tokens,
        temperature=generation.temperature if options.temperature is None else options.temperature,
        top_p=generation.top_p if options.top_p is None else options.top_p,
        seed=options.seed,
    )
