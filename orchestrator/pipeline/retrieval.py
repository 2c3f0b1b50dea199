"""Hybrid retrieval over one collection snapshot: dense + sparse + page + graph candidates, fused.

Per question and sub-question: dense FAISS search over passages and units (chunk_top_k) and over entities
(entity_top_k: the graph's seeds, with the entities the question names outright), BM25 over passages and
units (chunk_top_k; its score divided by the question's own weight, so a text matching one of five words is
not a full match), BM25 over whole pages (page_lexical_top_k pages, whose passages and units all join), then
graph expansion from the seeds, which adds its best evidence (graph_top_k). Every candidate gets every
signal: a candidate only BM25 or the graph found still gets its exact cosine from the stored vectors, and its
BM25 score and its page's, so fusion compares like with like. Pure CPU work on the snapshot: run it in a
thread; no model is called here (the question vectors come in: with start_retrieval they may come later, and
the BM25 searches run while the embedder works).

Without vectors (None: lexical mode, asked for or because the embedder is unavailable) retrieval is BM25 over
passages and pages and the graph from the entities the question names; the semantic signal is 0 and not weighed.
"""

from __future__ import annotations

import contextvars
import functools
import threading
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence, TypeVar

import numpy as np

from ..config import RetrievalSettings
from ..knowledge.storage.snapshot import GraphView, Snapshot
from .fusion import SOURCES, CandidateTable, FusionWeights, ScoredCandidate, fuse
from .graph_search import GraphExpansion, expand, hubs, mean_divisors, seed_nodes
from .plan import QueryPlan
from .timing import StageTimer

T = TypeVar("T")


@dataclass
class Retrieval:
    candidates: list[ScoredCandidate]  # fused, best first
    entity_seeds: dict[str, float] = field(default_factory=dict)  # entity key -> seed weight
    expansion: GraphExpansion = field(default_factory=GraphExpansion)
    timings_ms: dict[str, float] = field(default_factory=dict)  # dense, sparse, graph, fusion
    starts: dict[str, float] = field(default_factory=dict)  # when each of those first began (monotonic clock)
    best_semantic: float = 0.0  # the best cosine of any candidate, handed out or not (0 for none or negative)
    skipped: list[str] = field(default_factory=list)  # signals left out of this retrieval, and why


def fusion_weights(settings: RetrievalSettings, plan: QueryPlan, embedded: bool = True) -> FusionWeights:
    """`embedded`: whether the questions' vectors came (without them there is no semantic signal to weigh)."""
    return FusionWeights(
        semantic=settings.semantic_weight if plan.dense and embedded else 0.0,
        lexical=settings.lexical_weight if plan.sparse else 0.0,
        structural=settings.structural_weight if plan.graph else 0.0,
        modality=settings.modality_weight,
        page_lexical=settings.page_lexical_weight if plan.page_lexical else 0.0,
        method=settings.fusion,
        rrf_k=settings.rrf_k,
        lexical_exponent=settings.lexical_exponent,
    )


def retrieve(
    snapshot: Snapshot,
    questions: Sequence[str],
    vectors: Optional[np.ndarray],
    plan: QueryPlan,
    settings: RetrievalSettings,
    named_entities: Sequence[str] = (),
    modality_preference: Mapping[str, float] = {},
    pool: Optional[Executor] = None,
    limit: Optional[int] = None,
) -> Retrieval:
    """`vectors` [len(questions), d]: the embedded question and sub-questions (row-aligned); None in lexical
    mode. `limit`: hand out
    only the best that many candidates (all are fused; `Retrieval.best_semantic` is over all of them).

    With a `pool`, the graph's side (entity search, then the expansion) runs in it while this thread searches
    passages by BM25 and densely: FAISS and numpy release the interpreter, so on two cores a query waits for the
    longer of the two, not their sum. The candidates and their order are the same either way; the stage timings
    of the two sides overlap then."""
    graph_side = _GraphSide.of(snapshot, plan)
    graph_started = graph_side.start(_set(vectors), pool, snapshot, plan, settings, named_entities) if pool and graph_side.view else None
    lexical = _lexical_side(snapshot, questions, plan)
    dense = _dense_side(snapshot, vectors, plan)
    graph = graph_started.result() if graph_started is not None else graph_side.search(vectors, snapshot, plan, settings, named_entities)
    return _fused(snapshot, plan, settings, modality_preference, limit, lexical, dense, graph, graph_side.skipped)


def start_retrieval(
    snapshot: Snapshot,
    questions: Sequence[str],
    embedded: "Future[Optional[np.ndarray]]",
    plan: QueryPlan,
    settings: RetrievalSettings,
    named_entities: Sequence[str],
    modality_preference: Mapping[str, float],
    pool: Executor,
    search_pool: Executor,
    limit: Optional[int] = None,
) -> "Future[Retrieval]":
    """retrieve(), started before the question's vectors exist (`embedded`: set when the embedder answers, set to
    None to go on in lexical mode when it cannot, or cancelled to drop the retrieval). The BM25 searches over
    passages and pages need only the text: they run in `pool` at once, while the embedder works. The dense
    passage search (in `pool`) and the graph's side (in `search_pool`) start the moment the vectors are set,
    beside whatever BM25 still has to do. Fusion runs in the thread that finishes last: no thread waits idle for
    another. The candidates and their order are retrieve()'s. Each part runs in a copy of the caller's context (the request id of its log lines).

    Against retrieve() in a worker once the vectors are there: Simple 5.04 against 6.56 ms p50 own time, models
    at 1 ms (alternating in one process, 100,000 chunks, the 2-vCPU VM). The dense search beside BM25's tail,
    rather than after it, measured equal there (4.30 against 4.28 ms): two cores are both busy then; it is for
    hosts with cores to spare."""
    retrieval: Future = Future()
    retrieval.set_running_or_notify_cancel()  # a caller's cancel() cannot end it: its outcome is set once, below
    graph_side = _GraphSide.of(snapshot, plan)
    context = contextvars.copy_context()  # the BM25 side's, then fusion's (one after the other)
    lexical = pool.submit(context.run, _lexical_side, snapshot, questions, plan)
    dense = _when_set(embedded, pool, functools.partial(contextvars.copy_context().run, _dense_side, snapshot), plan)
    graph = (graph_side.start(embedded, search_pool, snapshot, plan, settings, named_entities) if graph_side.view is not None
             else _set(_no_graph()))

    def fuse_sides(lexical: Future, dense: Future, graph: Future) -> None:
        try:
            retrieval.set_result(context.run(_fused, snapshot, plan, settings, modality_preference, limit,
                                             lexical.result(), dense.result(), graph.result(), graph_side.skipped))
        except BaseException as error:  # the embedder failed (cancelled), or retrieval did: the caller hears why
            retrieval.set_exception(error)

    _when_all((lexical, dense, graph), fuse_sides)  # the futures as arguments: closures over them make cycles
    return retrieval


def _set(value) -> Future:
    done: Future = Future()
    done.set_result(value)
    return done


def _when_set(embedded: Future, pool: Executor, work: Callable[..., T], *args) -> "Future[T]":
    """work(the vectors, *args) submitted to `pool` once `embedded` is set; the future of its outcome (the
    embedder's failure, or the pool's refusal, if that is what came), always set in the pool's thread, so that
    what waits on it never runs in the thread that set the vectors (the event loop's)."""
    outcome: Future = Future()

    def submit(embedded: Future) -> None:  # the future comes as an argument: a closure over it would be a cycle
        try:
            pool.submit(_into, outcome, work, embedded.result(), *args)
        except BaseException as error:  # no vectors (the embedder failed), or the pool is shut down
            outcome.set_exception(error)

    embedded.add_done_callback(submit)
    return outcome


def _into(outcome: Future, work: Callable[..., T], *args) -> None:
    try:
        outcome.set_result(work(*args))
    except BaseException as error:
        outcome.set_exception(error)


def _when_all(futures: Sequence[Future], then: Callable[..., None]) -> None:
    """then(*futures) once every one is done, in the thread that completed the last. The callbacks hold the
    futures only until then: a future keeps its callbacks, and a cycle through them would leave each query's
    retrieval to the garbage collector (which collector.py's freezing would then keep for good)."""
    pending: dict = {"futures": tuple(futures), "left": len(futures)}
    lock = threading.Lock()

    def arrived(_: Future) -> None:
        with lock:
            pending["left"] -= 1
            every = pending.pop("futures") if pending["left"] == 0 else None
        if every is not None:
            then(*every)

    for future in futures:
        future.add_done_callback(arrived)


@dataclass
class _Lexical:
    """What the BM25 searches found (they need only the questions' text)."""

    found: dict[str, np.ndarray]  # sparse, page_lexical: the rows each found, in its order
    fractions: list[np.ndarray]  # each question's BM25 fraction of every row
    page_fractions: np.ndarray  # the questions' best BM25 fraction of every page
    timer: StageTimer


def _lexical_side(snapshot: Snapshot, questions: Sequence[str], plan: QueryPlan) -> _Lexical:
    timer = StageTimer()
    found: dict[str, np.ndarray] = {}
    lexical: list[np.ndarray] = []
    if plan.sparse:
        with timer.stage("sparse"):
            lexical = [snapshot.lexical.fractions(question) for question in questions]
            best = [row for fractions in lexical for row, _ in snapshot.lexical.best(fractions, plan.chunk_top_k)]
            found["sparse"] = np.asarray(best, dtype=np.int64)
    page_fractions = np.zeros(0)
    if plan.page_lexical:
        with timer.stage("page_lexical"):
            page_fractions = _best_of([snapshot.page_lexical.fractions(question) for question in questions])
            page_rows = snapshot.page_rows
            pages = [page_rows[page] for page, _ in snapshot.page_lexical.best(page_fractions, plan.page_lexical_top_k)]
            found["page_lexical"] = np.concatenate(pages).astype(np.int64) if pages else np.zeros(0, np.int64)
    return _Lexical(found, lexical, page_fractions, timer)


@dataclass
class _Dense:
    """What the dense passage search found: rows in its order, with their cosines (and the vectors it had)."""

    vectors: Optional[np.ndarray]  # the questions' [len(questions), d]; None in lexical mode
    rows: Optional[np.ndarray]  # None: no dense search in this plan
    scores: np.ndarray
    timer: StageTimer


def _dense_side(snapshot: Snapshot, vectors: Optional[np.ndarray], plan: QueryPlan) -> _Dense:
    timer = StageTimer()
    if not plan.dense or vectors is None:
        return _Dense(vectors, None, np.zeros(0, dtype=np.float32), timer)
    with timer.stage("dense"):
        scores, rows = snapshot.evidence_index.search(vectors, plan.chunk_top_k)
        hits = rows.ravel() >= 0
        return _Dense(vectors, rows.ravel()[hits].astype(np.int64), scores.ravel()[hits], timer)


_Graph = tuple[dict[str, float], GraphExpansion, StageTimer]  # seeds, expansion, timings


def _no_graph() -> _Graph:
    return {}, GraphExpansion(), StageTimer()


@dataclass
class _GraphSide:
    """Whether the graph takes part in a retrieval, on which view of it, and why not (skipped)."""

    view: Optional[GraphView]
    skipped: list[str]

    @classmethod
    def of(cls, snapshot: Snapshot, plan: QueryPlan) -> "_GraphSide":
        if not (plan.graph and plan.entity_top_k > 0):
            return cls(None, [])
        view = snapshot.graph_view()
        if view is None:
            # after a restart the graph of a large collection takes a while to build (a minute at a million
            # chunks): queries go without its candidates rather than wait for it
            return cls(None, ["graph skipped: the collection's graph is still being built"])
        if view.generation != snapshot.generation:
            return cls(view, [f"graph partial: the documents committed after generation {view.generation} are not in it "
                              "yet (their graph is being built)"])
        return cls(view, [])

    def start(
        self, embedded: Future, pool: Executor, snapshot: Snapshot, plan: QueryPlan, settings: RetrievalSettings,
        named_entities: Sequence[str],
    ) -> "Future[_Graph]":
        """The graph's side, submitted to `pool` once the vectors are set."""
        return _when_set(embedded, pool, self.search, snapshot, plan, settings, named_entities)

    def search(
        self, vectors: Optional[np.ndarray], snapshot: Snapshot, plan: QueryPlan, settings: RetrievalSettings,
        named_entities: Sequence[str],
    ) -> _Graph:
        """The seeds and the expansion from them (none without a graph); the vectors first, as _when_set gives them."""
        if self.view is None:
            return _no_graph()
        return _graph_side(snapshot, self.view, vectors, plan, settings, named_entities)


def _fused(
    snapshot: Snapshot, plan: QueryPlan, settings: RetrievalSettings,
    modality_preference: Mapping[str, float], limit: Optional[int], lexical: _Lexical, dense: _Dense, graph: _Graph,
    skipped: Sequence[str],
) -> Retrieval:
    """Every source's candidates, with every signal, fused; the sides' timings merged."""
    seeds, expansion, graph_timer = graph
    timer = StageTimer()
    for part in (dense.timer, lexical.timer, graph_timer):
        for stage, milliseconds in part.stages.items():
            timer.stages[stage] = timer.stages.get(stage, 0.0) + milliseconds
            timer.intervals.setdefault(stage, []).extend(part.intervals[stage])
    found = {"dense": dense.rows} if dense.rows is not None else {}
    found.update(lexical.found)
    if len(expansion.nodes):
        with timer.stage("graph"):
            found["graph"] = np.asarray(expansion.best(settings.graph_top_k), dtype=np.int64)
    with timer.stage("fusion"):
        table = _candidate_table(snapshot, dense.vectors, found, dense.scores, lexical.fractions, lexical.page_fractions, expansion)
        evidence = snapshot.evidence
        block_types = {row: evidence[row].block_type for row in table.rows.tolist()} if modality_preference else {}
        fused = fuse(table, block_types, modality_preference, fusion_weights(settings, plan, dense.vectors is not None), limit)
    starts = {stage: min(start for start, _ in spans) for stage, spans in timer.intervals.items()}
    return Retrieval(fused, seeds, expansion, timer.stages, starts, table.best_semantic(), list(skipped))


def _candidate_table(
    snapshot: Snapshot, vectors: Optional[np.ndarray], found: dict[str, np.ndarray], dense_scores: np.ndarray,
    lexical: list[np.ndarray], page_fractions: np.ndarray, expansion: GraphExpansion,
) -> CandidateTable:
    """Every row some source found, in the order first found (dense, sparse, pages, graph), with every signal:
    a row dense search did not find gets its exact cosine from the stored vectors, every row its BM25 score,
    its page's, and its graph score, so fusion compares like with like. Without vectors every cosine is 0."""
    sources = [source for source in ("dense", "sparse", "page_lexical", "graph") if source in found]
    every = np.concatenate([found[source] for source in sources]) if sources else np.zeros(0, np.int64)
    _, first = np.unique(every, return_index=True)
    rows = every[np.sort(first)]  # first-found order
    sorter = np.argsort(rows, kind="stable")

    def positions(of: np.ndarray) -> np.ndarray:
        return sorter[np.searchsorted(rows, of, sorter=sorter)]

    flags = np.zeros((len(rows), len(SOURCES)), dtype=bool)
    for source in sources:
        flags[positions(found[source]), SOURCES.index(source)] = True
    semantic = np.full(len(rows), -np.inf)
    if "dense" in found:
        np.maximum.at(semantic, positions(found["dense"]), dense_scores.astype(np.float64))
    missing = np.flatnonzero(~flags[:, SOURCES.index("dense")])  # in first-found order
    if vectors is None:
        semantic[:] = 0.0
    elif len(missing):
        similarities = snapshot.evidence_vectors(rows[missing].tolist()) @ np.asarray(vectors, dtype=np.float32).T
        semantic[missing] = similarities.max(axis=1).astype(np.float64)
    lexical_column = _best_of(lexical)[rows].astype(np.float64) if lexical else np.zeros(len(rows))
    page_column = page_fractions[snapshot.page_of_row[rows]].astype(np.float64) if len(page_fractions) else np.zeros(len(rows))
    structural = np.zeros(len(rows))
    if len(expansion.nodes):
        scored = rows < len(expansion.evidence_scores)
        structural[scored] = expansion.evidence_scores[rows[scored]]
    return CandidateTable(rows, semantic, lexical_column, page_column, structural, flags)


def _graph_side(
    snapshot: Snapshot, view: GraphView, vectors: Optional[np.ndarray], plan: QueryPlan, settings: RetrievalSettings,
    named_entities: Sequence[str],
) -> tuple[dict[str, float], GraphExpansion, StageTimer]:
    """The seeds (entities similar to the questions, and those they name) and the graph expansion from them,
    with when each ran ("seeds" is dense search: it is reported under "dense")."""
    seeds: dict[str, float] = {}
    expansion = GraphExpansion()
    timer = StageTimer()
    if not (plan.graph and plan.entity_top_k > 0):
        return seeds, expansion, timer
    if vectors is not None:
        with timer.stage("dense"):
            seeds = _entity_seeds(snapshot, vectors, plan.entity_top_k, settings.min_seed_similarity, settings.relation_seeds)
    for key in named_entities:
        seeds[key] = 1.0  # named outright: the strongest seed there is
    if seeds:
        with timer.stage("graph"):
            graph, fraction, least = view.graph, settings.graph_hub_fraction, settings.graph_hub_min_chunks
            expansion = expand(
                graph, view.node_evidence, view.nodes_per_evidence, seed_nodes(graph, seeds), plan.graph_hops,
                settings.graph_max_nodes, settings.pagerank_damping, settings.graph_scoring_nodes,
                view.derived(("hubs", fraction, least), lambda: hubs(view.node_evidence, fraction, least)),
                view.derived("mean divisors", lambda: mean_divisors(view.nodes_per_evidence)),
            )
    return seeds, expansion, timer


def _best_of(scores: list[np.ndarray]) -> np.ndarray:
    """The element-wise best of the questions' scores; one question's as they are (no copy of every row's)."""
    return scores[0] if len(scores) == 1 else np.max(scores, axis=0)


def _entity_seeds(snapshot: Snapshot, vectors: np.ndarray, k: int, min_similarity: float, relations: bool) -> dict[str, float]:
    """Entities (and, with `relations`, the endpoints of relations) similar to a question, with their best similarity."""
    seeds: dict[str, float] = {}

    def add(key: str, similarity: float) -> None:
        if similarity >= min_similarity and similarity > seeds.get(key, float("-inf")):
            seeds[key] = similarity

    scores, rows = snapshot.entity_index.search(vectors, k)
    for score, row in zip(scores.ravel(), rows.ravel()):
        if row >= 0:
            add(snapshot.entity_keys[row], float(score))
    if relations:
        scores, rows = snapshot.relation_index.search(vectors, k)
        for score, row in zip(scores.ravel(), rows.ravel()):
            if row >= 0:
                for key in snapshot.relation_keys[row]:
                    add(key, float(score))
    return seeds
