"""What one query will do: the request's options, checked, then combined with its route and the server settings.

A stage runs only when the route's policy, the server's switch and the request's switch all allow it, so the
benchmarks can turn any stage off per request (the ablations) without restarting anything. A stage whose result
cannot change the answer (the cross-encoder at rerank_weight 0) runs only when the request asks for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..config import ROUTE_NAMES, Settings
from ..errors import InvalidOptionError

ROUTER_MODES = ("features", "model")
PERCEPTION_MODES = ("dpr", "end_to_end", "off")
ANSWERERS = ("extractive", "llm", "hybrid")
# the values a text option takes: what `check` accepts and the CLI offers
OPTION_CHOICES = {"route": ROUTE_NAMES, "router": ROUTER_MODES, "perception": PERCEPTION_MODES, "answerer": ANSWERERS}
_TYPE_NAMES = {"int_type": "an integer", "float_type": "a number", "bool_type": "true or false", "string_type": "a string"}


class QueryOptions(BaseModel):
    """Per-request overrides; None keeps the server's setting.

    One validated model for every API (gRPC and the HTTP endpoints): `parse` takes a request's values and
    rejects unknown names and wrong types (strictly: "5" is not an integer, true is not a number), `check` the
    values against the limits of the server's settings. Both raise InvalidOptionError naming the option."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    top_k: Optional[int] = Field(None, description="evidence items handed to the answerer (default: the route's)")
    chunk_top_k: Optional[int] = Field(None, description="dense and sparse hits per (sub-)question")
    entity_top_k: Optional[int] = Field(None, description="entities and relations matched per (sub-)question (graph seeds)")
    graph_hops: Optional[int] = Field(None, description="graph expansion depth, 0..4")
    page_top_m: Optional[int] = Field(None, description="pages the VLM relevance filter judges")
    page_top_k: Optional[int] = Field(None, description="pages kept")
    route: Optional[str] = Field(None, description="take this route: the router does not run")
    router: Optional[str] = Field(None, description="how the route is decided")
    dense: Optional[bool] = Field(None, description="FAISS over passages and units (off: the cosine is not weighed)")
    sparse: Optional[bool] = Field(None, description="BM25 over passages and units")
    page_lexical: Optional[bool] = Field(None, description="BM25 over whole pages (candidates and a signal)")
    graph: Optional[bool] = Field(None, description="graph expansion and personalized PageRank")
    rerank: Optional[bool] = Field(None, description="the cross-encoder")
    page_images: Optional[bool] = Field(None, description="page-image retrieval and the VLM relevance filter")
    perception: Optional[str] = Field(None, description="the VLM describes visual evidence (dpr), answers (end_to_end), or not")
    uncertainty: Optional[bool] = Field(None, description="the pruner / judger / decoupler loop (LLM answerer only)")
    answerer: Optional[str] = Field(None, description="who writes the answer")
    max_tokens: Optional[int] = Field(None, description="the answer's length limit in tokens")
    temperature: Optional[float] = Field(None, description="sampling temperature; 0 is greedy decoding")
    top_p: Optional[float] = Field(None, description="nucleus sampling mass, in (0, 1]")
    seed: Optional[int] = Field(None, description="sampling seed, for reproducible answers")
    # The server falls back to lexical mode by itself while the text embedder is unavailable.
    lexical: Optional[bool] = Field(
        None, description="lexical mode: BM25 and named entities, sentences by shared words; no model is called")

    @classmethod
    def parse(cls, values: Mapping[str, Any]) -> "QueryOptions":
        """The options of a request (JSON values or a proto's set fields)."""
        try:
            return cls.model_validate(dict(values))
        except ValidationError as error:
            first = error.errors()[0]
            name = ".".join(str(part) for part in first["loc"]) or "options"
            if first["type"] == "extra_forbidden":
                raise InvalidOptionError(name, f"unknown option {name}; known: {', '.join(cls.model_fields)}") from None
            kind = _TYPE_NAMES.get(first["type"], f"valid ({first['msg']})")
            raise InvalidOptionError(name, f"option {name} must be {kind}, got {first.get('input')!r}") from None

    def check(self, settings: Settings) -> None:
        """Reject values out of their limits before any work, naming the option and its limit."""
        limit = settings.retrieval.max_top_k
        for name in ("top_k", "chunk_top_k", "entity_top_k"):
            value = getattr(self, name)
            if value is not None and not (0 if name == "entity_top_k" else 1) <= value <= limit:
                raise InvalidOptionError(name, f"{name} must be in 1..{limit} (retrieval.max_top_k), got {value}")
        if self.graph_hops is not None and not 0 <= self.graph_hops <= 4:
            raise InvalidOptionError("graph_hops", f"graph_hops must be in 0..4, got {self.graph_hops}")
        if self.page_top_m is not None and not 1 <= self.page_top_m <= settings.pages.max_top_m:
            raise InvalidOptionError(
                "page_top_m", f"page_top_m must be in 1..{settings.pages.max_top_m} (pages.max_top_m), got {self.page_top_m}"
            )
        if self.page_top_k is not None and not 0 <= self.page_top_k <= limit:
            raise InvalidOptionError("page_top_k", f"page_top_k must be in 0..{limit} (retrieval.max_top_k), got {self.page_top_k}")
        for name, allowed in OPTION_CHOICES.items():
            value = getattr(self, name)
            if value is not None and value not in allowed:
                raise InvalidOptionError(name, f"{name} must be one of {', '.join(allowed)}, got {value!r}")
        generation = settings.generation
        if self.max_tokens is not None and not 0 <= self.max_tokens <= generation.max_tokens_limit:
            raise InvalidOptionError(
                "max_tokens",
                f"max_tokens must be in 0..{generation.max_tokens_limit} (generation.max_tokens_limit), got {self.max_tokens}",
            )
        if self.temperature is not None and not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise InvalidOptionError("temperature", f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:  # NaN fails this too
            raise InvalidOptionError("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        if self.lexical:
            asked = {"dense": self.dense is True, "rerank": self.rerank is True, "page_images": self.page_images is True,
                     "uncertainty": self.uncertainty is True, "router": self.router == "model",
                     "answerer": self.answerer in ("llm", "hybrid"), "perception": self.perception not in (None, "off")}
            for name, conflicts in asked.items():
                if conflicts:
                    raise InvalidOptionError(name, f"lexical mode calls no model: {name}={getattr(self, name)!r} asks for one")


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
    perception_items: int  # visual items described (or shown end to end)
    uncertainty: bool
    decompose: bool
    answerer: str  # extractive | llm | hybrid
    max_tokens: int
    temperature: float
    top_p: float
    seed: Optional[int]
    lexical: bool = False  # no model call for retrieval (the question is not embedded): see QueryOptions.lexical


def router_mode(options: QueryOptions, settings: Settings) -> str:
    """features | model | fixed for this request."""
    if options.route is not None:
        return "fixed"
    if options.lexical:
        return "features"  # no model call
    return options.router or settings.router.mode or "features"


def lexical_plan(plan: QueryPlan) -> QueryPlan:
    """The plan in lexical mode: its retrieval needs no embedding (BM25 and named entities); the other stages
    are as planned (each optional one is skipped by itself if its model is down too)."""
    return replace(plan, dense=False, lexical=True)


def make_plan(route: str, options: QueryOptions, settings: Settings) -> QueryPlan:
    if options.lexical:
        return _model_free(route, options, settings)
    policy = settings.routes.policy(route)
    retrieval, pages, generation = settings.retrieval, settings.pages, settings.generation
    answerer = options.answerer or settings.answer.answerer or "extractive"

    def switch(requested: Optional[bool], server: bool, route_allows: bool = True) -> bool:
        return route_allows and server and (requested is None or requested)

    perception = options.perception or settings.perception.mode or "off"
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
        # a stage whose models have no say in this profile (pages.run_by_default false) runs only when asked
        page_images=switch(options.page_images if options.page_images is not None else pages.run_by_default,
                           pages.enabled, policy.page_images),
        page_top_m=options.page_top_m or pages.top_m,
        page_top_k=pages.top_k if options.page_top_k is None else options.page_top_k,
        perception=perception,
        perception_items=policy.perception_items,
        # The judger reads the LLM's token entropies: the loop needs the LLM answerer.
        uncertainty=switch(options.uncertainty, settings.uncertainty.enabled, policy.uncertainty) and answerer == "llm",
        decompose=policy.decompose,
        answerer=answerer,
        max_tokens=generation.max_tokens if options.max_tokens is None else options.max_tokens,
        temperature=generation.temperature if options.temperature is None else options.temperature,
        top_p=generation.top_p if options.top_p is None else options.top_p,
        seed=options.seed,
    )


def _model_free(route: str, options: QueryOptions, settings: Settings) -> QueryPlan:
    """Lexical mode asked for by the request: no model call at all (no reranker, page images, perception or
    generator; the extractive answer, its sentences chosen by shared words)."""
    full = make_plan(route, options.model_copy(update={"lexical": None}), settings)
    return replace(lexical_plan(full), rerank=False, page_images=False, perception="off", uncertainty=False,
                   answerer="extractive")
