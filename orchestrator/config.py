"""Typed settings, loaded once (TOML file, then explicit overrides) and passed down; nothing reads the environment.

Relative paths are resolved against the folder the server is started from, so a checkout works as is.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal, Mapping, Optional, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import ConfigurationError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TritonSettings(_Section):
    # An already-running Triton to use (gRPC "host:port"). Empty: `serve` launches and supervises its own.
    url: str = ""
    model_repository: Path = Path("model_repository/tiny")  # in Settings: model_repository/<profile> unless set
    # Python environment the python-backend stubs run in (numpy<2, onnxruntime, thinkserve-backend).
    model_environment: Path = Path(".venv-triton")
    # Folder holding bin/tritonserver and backends/; empty: the nvidia-pytriton wheel, then /opt/tritonserver.
    install_root: Optional[Path] = None
    # Ports on 127.0.0.1 (Triton never binds other interfaces); 0 picks a free port.
    grpc_port: int = Field(0, ge=0, le=65535)
    http_port: int = Field(0, ge=0, le=65535)
    metrics_port: int = Field(0, ge=0, le=65535)
    startup_timeout_s: float = Field(240.0, gt=0)
    exit_timeout_s: int = Field(10, ge=2)  # below 2 s Triton always leaks its /dev/shm regions
    log_dir: Path = Path(".thinkserve/logs")
    log_verbose: int = Field(0, ge=0)
    call_timeout_s: float = Field(60.0, gt=0)  # deadline of one Triton call when the request sets none
    # Survival of Triton failures (orchestrator/triton/supervisor.py, breaker.py, client.py).
    # supervise: restart our own Triton when it dies and reload a model whose python stub died (a dead stub
    # leaves the model READY while every request fails); with `url` set, Triton's readiness is only watched.
    supervise: bool = True
    supervise_interval_s: float = Field(1.0, gt=0)  # a dead server or stub is noticed within this
    restart_backoff_s: float = Field(1.0, ge=0)  # pause after a failed restart, doubled each time ...
    restart_backoff_max_s: float = Field(30.0, ge=0)  # ... up to this (a broken install must not spin the CPU)
    # A model's reload (unload + load) not done by then: Triton's model repository is taken as stuck and the
    # server is restarted (2.51 never answers a load whose python stub fails to start when an ensemble uses it).
    reload_timeout_s: float = Field(120.0, gt=0)
    # Circuit breaker per model: after this many consecutive unavailability failures, calls fail fast ...
    breaker_threshold: int = Field(5, ge=1)
    breaker_cooldown_s: float = Field(2.0, gt=0)  # ... until one trial call is let through after this
    # Idempotent unary calls (infer, config, statistics; never a stream, which may have produced output) are
    # retried on UNAVAILABLE: attempts in all, pauses from retry_backoff_s doubling, never past their deadline.
    retry_attempts: int = Field(3, ge=1)
    retry_backoff_s: float = Field(0.05, ge=0)
    # gRPC's own reconnect backoff grows to 120 s by default: a restarted Triton would then wait tens of
    # seconds for the orchestrator's channel to come back (measured: 7.6 s after a 15 s outage). Capped here.
    reconnect_backoff_max_s: float = Field(0.5, ge=0.1)


class ServerSettings(_Section):
    # Any address but loopback requires auth.tokens: the server refuses to start open to the network.
    host: str = "127.0.0.1"
    port: int = Field(50051, ge=0, le=65535)  # 0 picks a free port
    max_message_bytes: int = Field(64 * 1024 * 1024, gt=0)
    max_question_chars: int = Field(4000, gt=0)
    max_upload_bytes: int = Field(50 * 1024 * 1024, gt=0)
    default_deadline_s: float = Field(120.0, gt=0)  # when the client sends no deadline
    shutdown_grace_s: float = Field(10.0, ge=0)
    # how often the standard grpc.health.v1 status is checked against Triton (probes read the last verdict)
    health_interval_s: float = Field(2.0, gt=0)
    # Admission (backpressure): this many queries (and retrievals) run at once, this many more wait; past
    # that a request is refused at once with RESOURCE_EXHAUSTED instead of growing everyone's latency.
    max_concurrent_queries: int = Field(4, ge=1)
    max_queued_queries: int = Field(16, ge=0)
    max_concurrent_ingests: int = Field(2, ge=1)
    max_queued_ingests: int = Field(8, ge=0)
    # Folders whose files Ingest may name by server-side path (resolved, symlinks included); empty: none.
    ingest_roots: tuple[Path, ...] = ()
    # TLS: a certificate and its key switch it on; a client CA as well requires client certificates (mTLS).
    tls_cert_file: Optional[Path] = None
    tls_key_file: Optional[Path] = None
    tls_client_ca_file: Optional[Path] = None
    # The interpreter's thread switch interval (sys.setswitchinterval) in a serving process. A thread that holds
    # the interpreter keeps it this long before another may run: while a snapshot's graph is built in the
    # background (pure Python), a query, which gives the interpreter up at every numpy and FAISS call, waits up
    # to this long each time it wants it back. Measured at 40,000 chunks on 2 cores: queries during a graph build
    # took 116 ms at Python's 5 ms, 48 ms at 1 ms, 33 ms at 0.5 ms (13 ms steady); the build itself no slower.
    switch_interval_ms: float = Field(0.5, gt=0)

    @model_validator(mode="after")
    def _tls_pair(self) -> "ServerSettings":
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("server.tls_cert_file and server.tls_key_file go together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("server.tls_client_ca_file (mTLS) needs server.tls_cert_file and tls_key_file")
        return self

    @property
    def loopback(self) -> bool:
        return self.host in LOOPBACK_HOSTS


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


class HttpSettings(_Section):
    """The HTTP side: the OpenAI-compatible endpoint (/v1/chat/completions, /v1/models), the JSON API and web
    console (/api/v1, /console/) and /metrics."""

    enabled: bool = True
    host: str = "127.0.0.1"  # not loopback: auth.tokens required, as for the gRPC server
    port: int = Field(50052, ge=0, le=65535)  # 0 picks a free port
    console: bool = True  # the web console at /console/ (its JSON API, /api/v1, is served either way)


class TokenGrant(_Section):
    """One bearer token: who holds it, which collections it may touch and how much it may run at once."""

    name: str = Field(min_length=1)  # appears in logs and metrics, never the token itself
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")  # hex digest of the token (`thinkserve token` makes both)
    collections: tuple[str, ...] = ("*",)  # names, or "*" for every collection
    write: bool = False  # may ingest, delete documents and create or delete collections
    max_concurrent: int = Field(8, ge=1)  # requests of this token in flight (queued ones included)


class AuthSettings(_Section):
    # Tokens are required for every call once any is configured (and always off loopback). Only digests are
    # stored: a leaked settings file leaks no token.
    tokens: tuple[TokenGrant, ...] = ()
    # A TOML file of more grants ([[tokens]] tables, as above), read at start: a secret a container mounts
    # (THINKSERVE_AUTH__TOKENS_FILE=/run/secrets/thinkserve-tokens.toml) instead of a config file to edit.
    tokens_file: Optional[Path] = None

    @field_validator("tokens_file", mode="before")
    @classmethod
    def _no_file(cls, value: Any) -> Any:
        """An empty value (THINKSERVE_AUTH__TOKENS_FILE=) names no file: how the environment drops a configured one."""
        return None if value == "" else value

    @model_validator(mode="after")
    def _unique(self) -> "AuthSettings":
        digests = [grant.sha256 for grant in self.tokens]
        if len(set(digests)) != len(digests):
            raise ValueError("auth.tokens: two grants have the same token")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.tokens)


class ObservabilitySettings(_Section):
    log_format: Literal["text", "json"] = "text"  # json: one object per line, with the request id
    # OpenTelemetry spans per request and stage: off, console (stdout), or otlp (the `otlp` extra; endpoint
    # below, e.g. "http://collector:4317", or the exporter's own default). An incoming W3C traceparent continues.
    tracing: Literal["off", "console", "otlp"] = "off"
    otlp_endpoint: str = ""
    service_name: str = "thinkserve"


class StorageSettings(_Section):
    data_dir: Path = Path(".thinkserve/data")
    # On: a commit's snapshot is published to queries once its BM25 indexes (and graph, see below) are built (queries read
    # the previous one meanwhile; an ingest answers once its document is visible), and at start every
    # collection is opened, built and retrieved from once in the background. Off: a commit is visible at once
    # and the first query after it builds what it needs.
    warm_snapshots: bool = True
    # A read replica (`serve --read-only`): serves queries over a data folder another process writes, takes no
    # lock, never removes anything, refuses writes (FAILED_PRECONDITION), and follows the writer's new
    # manifest generations every follow_interval_s. Without it the server is the folder's one writer.
    read_only: bool = False
    follow_interval_s: float = Field(1.0, gt=0)
    # The writer removes a dropped document's segment (and old stored indexes) only after this long, so a
    # replica still serving the previous generation can read its page images and assets: keep it above
    # follow_interval_s plus the longest query (server.default_deadline_s).
    retain_dropped_s: float = Field(180.0, ge=0)
    # HNSW / IVF indexes are stored (so a restart need not build them) once the documents appended since the last
    # write hold this many vectors, and after a delete or replacement: at a million vectors a write is 3 GB, and a
    # restart adds what was appended since (about 4 s for 20,000 HNSW vectors on 2 cores, estimated from the
    # build rate of benchmarks/results/collection_restart.md). 0: at every commit.
    index_write_vectors: int = Field(20_000, ge=0)
    # With warm_snapshots, a snapshot holding at least this many passages and units whose graph is built from
    # every document (where it cannot be made from the previous graph: an append extends it and a delete cuts it
    # down, at about the cost of the document) is published before its graph is built (3.9 s at 100,000 chunks,
    # benchmarks/results/incremental_commit.md); until it is there its queries go without the graph, saying so
    # in degraded_reason. Smaller collections build it first: it takes well under a second there. 0: always
    # publish first.
    publish_before_graph_rows: int = Field(20_000, ge=0)


RouteName = Literal["simple", "moderate", "complex"]
# The router model's labels, in its output order (orchestrator.models.contracts.ROUTE_LABELS, which sits above
# the settings and may not be imported here; tests/orchestrator/test_config.py keeps the two equal).
ROUTE_NAMES: tuple[str, ...] = get_args(RouteName)


class RoutePolicy(_Section):
    """How much work a route buys (AutoThinkRAG: the route decides retrieval depth and which stages run).

    A stage runs when its route policy, the server switch (retrieval.rerank, pages.enabled, ...) and the
    request's own switch all allow it."""

    # text evidence items handed to the answerer (the pruner's capacity); the pages the page filter keeps
    # (pages.top_k) come in addition (pipeline/evidence.py, answering_order)
    evidence_k: int = Field(ge=1)
    chunk_top_k: int = Field(ge=1)  # dense and sparse hits per (sub-)question
    entity_top_k: int = Field(ge=0)  # entities (and relations) matched per (sub-)question: the graph's seeds
    graph_hops: int = Field(ge=0)
    # expand the knowledge graph from the question's entities (its candidates join the fusion). Off on the
    # Simple route: a single-fact lookup gains nothing from it in any measured setting (docs/measured/),
    # and it is the largest part of that route's own time
    graph: bool = True
    rerank: bool
    page_images: bool
    perception: bool
    # visual evidence items (units with an image, pages) the VLM describes (or is shown end to end) per query:
    # each is a VLM generation, the costliest call a route makes, so the deeper routes buy more (the defaults
    # below: 2, 4, 6); 4, the former global setting, for a route section that does not say
    perception_items: int = Field(4, ge=0)
    uncertainty: bool
    decompose: bool  # split the question into sub-questions, each retrieved for


class RouteSettings(_Section):
    simple: RoutePolicy = RoutePolicy(
        evidence_k=3, chunk_top_k=10, entity_top_k=20, graph_hops=1, graph=False, rerank=True, page_images=False,
        perception=True, perception_items=2, uncertainty=False, decompose=False,
    )
    moderate: RoutePolicy = RoutePolicy(
        evidence_k=5, chunk_top_k=20, entity_top_k=40, graph_hops=1, rerank=True, page_images=True,
        perception=True, perception_items=4, uncertainty=False, decompose=True,
    )
    complex: RoutePolicy = RoutePolicy(
        evidence_k=8, chunk_top_k=20, entity_top_k=40, graph_hops=2, rerank=True, page_images=True,
        perception=True, perception_items=6, uncertainty=True, decompose=True,
    )

    def policy(self, route: str) -> RoutePolicy:
        return getattr(self, route)


class RouterSettings(_Section):
    # features: the question's intent, entities, visual references, constraints and dependency cues decide;
    # model: the router model in Triton decides (features are still computed and reported);
    # fixed: every question takes `fixed_route`. None: the profile's default (tiny: features, since its router
    # model has random weights; otherwise model).
    mode: Optional[Literal["features", "model", "fixed"]] = None
    fixed_route: RouteName = "complex"
    moderate_at: float = Field(2.0, ge=0)  # feature complexity score at which a question is Moderate
    complex_at: float = Field(4.0, ge=0)  # ... and Complex
    max_sub_questions: int = Field(3, ge=0)


class RetrievalSettings(_Section):
    """Hybrid retrieval: dense + sparse + graph candidates, fused, then reranked."""

    max_top_k: int = Field(50, ge=1)  # upper limit of every top-K a request may ask for
    dense: bool = True  # FAISS over passages and units (off: the semantic signal is reported but not weighed)
    sparse: bool = True  # BM25 over passages and units
    # BM25 over whole pages: the best page_lexical_top_k pages bring all their passages and units in as
    # candidates, and every candidate carries its page's score. Questions spread their words over the page
    # that answers them: on real documents the page is the strongest lexical unit there is.
    page_lexical: bool = True
    page_lexical_top_k: int = Field(10, ge=0)
    graph: bool = True  # neighbourhood expansion + personalized PageRank from the matched entities
    rerank: bool = True  # cross-encoder through Triton (where the route allows it)
    # Fusion (pipeline/fusion.py): "weighted" is the weighted mean of the signals' values (the lexical ones raised
    # to lexical_exponent); "rrf" sums weight / (rrf_k + rank) over the signals that found a candidate. Every signal
    # is in [0, 1] and reported either way. The weights and exponent were chosen on the dev PDFs and the generated
    # corpus together (benchmarks/results/mmlongbench-dev/document_qa.md, retrieval_quality.md): the lexical signals together weigh
    # as much as the semantic one; squared, a partial match counts little.
    fusion: Literal["weighted", "rrf"] = "weighted"
    rrf_k: float = Field(60.0, gt=0)  # the usual constant of reciprocal rank fusion: a top rank is not a landslide
    lexical_exponent: float = Field(2.0, gt=0)
    semantic_weight: float = Field(1.0, ge=0)  # cosine of the question and the evidence
    lexical_weight: float = Field(0.5, ge=0)  # BM25 over the question's IDF mass (how much of it a passage matches)
    page_lexical_weight: float = Field(0.5, ge=0)  # the same for the candidate's whole page
    # Graph score (mean PageRank of the entities extracted from it). 0: on the real-document benchmark a weight of
    # 0.5 gave page R@1/R@5 0.400/0.664 against 0.404/0.664 at 0 (benchmarks/results/mmlongbench-dev/document_qa-structural.md);
    # the graph still runs, brings candidates and is reported.
    structural_weight: float = Field(0.0, ge=0)
    modality_weight: float = Field(0.2, ge=0)  # match with the question's preferred block types
    # Final score = (1 - w) * fused + w * sigmoid(rerank score). None: the profile's default (tiny: 0, since
    # its cross-encoder has random weights and would scramble the real embedder's ranking; otherwise 1). At 0 the
    # cross-encoder is not called unless a request sets rerank=true: it could not change the ranking.
    rerank_weight: Optional[float] = Field(None, ge=0, le=1)
    rerank_candidates: int = Field(20, ge=1)  # fused candidates the cross-encoder scores
    graph_top_k: int = Field(20, ge=0)  # evidence records the graph adds as candidates
    graph_max_nodes: int = Field(500, ge=1)  # neighbourhood size cap: keeps PageRank cheap on big graphs
    graph_scoring_nodes: int = Field(256, ge=0)  # highest-PageRank nodes that score evidence (0: all)
    # Hubs: entities named in at least this share of the chunks and units, and in at least graph_hub_min_chunks
    # of them; expansion neither passes through them nor scores by them (the graph's stop words).
    graph_hub_fraction: float = Field(0.01, gt=0, le=1)
    graph_hub_min_chunks: int = Field(100, ge=1)
    pagerank_damping: float = Field(0.85, ge=0, lt=1)
    min_seed_similarity: float = Field(0.3, ge=-1, le=1)  # entities less similar than this seed nothing
    # Where whole-graph PageRank runs on a GPU (CuPy): the most its memory pool keeps (CuPy's is unbounded).
    pagerank_gpu_memory_mb: int = Field(1024, ge=1)
    # Relations similar to the question seed their two entities too. Off: on the retrieval-quality corpora it
    # changed no result and cost a third vector search per question.
    relation_seeds: bool = False
    # Refusal (pipeline/answerability.py): "model" refuses when the answerability model's probability is below
    # min_answerability; "similarity" when no candidate is at least min_similarity similar to the question
    # (cosine; in lexical mode, no candidate matches min_lexical_match of the question's BM25 weight).
    answerability: Literal["model", "similarity"] = "model"
    answerability_file: Optional[Path] = None  # None: the model shipped with the code (answerability-v1.json)
    min_answerability: Optional[float] = Field(None, ge=0, le=1)  # None: the threshold each model was fitted with
    min_similarity: float = Field(0.2, ge=-1, le=1)
    # Lexical mode (pipeline/plan.py): while the text embedder is unavailable, retrieval goes on with BM25 and the
    # entities the question names, and the answer is flagged degraded (False: such queries fail with UNAVAILABLE).
    lexical_fallback: bool = True
    # Refusal in lexical mode, where there is no cosine: no candidate matches this share of the question's BM25
    # weight (the lexical signal).
    min_lexical_match: float = Field(0.3, ge=0, le=1)
    context_blocks: int = Field(1, ge=0)  # adjacent blocks fetched on each side of a selected unit


class PageSettings(_Section):
    """Page-image retrieval (V-RAG): every encoder family's similarities averaged, then the VLM filter."""

    enabled: bool = True  # the server switch: off, no request can run the stage
    # Whether a request that does not say runs it. None: the profile's default (tiny: no, since its page encoders
    # and VLM have random weights: on real PDFs they added random pages and a second of VLM calls to every Moderate
    # and Complex question; otherwise yes). A request can still ask (page_images=true), to measure the stage's cost.
    run_by_default: Optional[bool] = None
    top_m: int = Field(60, ge=1)  # pages the VLM relevance filter looks at
    top_k: int = Field(5, ge=0)  # pages kept
    max_top_m: int = Field(200, ge=1)  # upper limit of top_m a request may ask for
    min_relevance: float = Field(0.5, ge=0, le=1)  # P(yes) the VLM must give a page


class PerceptionSettings(_Section):
    """Decomposition of perception and reasoning (DPR): the VLM turns visual evidence into text."""

    # dpr: the VLM describes each selected image, table and page, the answerer reasons over text;
    # end_to_end: the VLM answers from the images itself (the paper's baseline, for comparison); off.
    # None: the profile's default (tiny: off, since its VLM has random weights: its descriptions took 0.98 s of a
    # 1.01 s Retrieve on real PDFs and said nothing; otherwise dpr). A request can still ask for a mode.
    mode: Optional[Literal["dpr", "end_to_end", "off"]] = None
    max_tokens: int = Field(96, ge=1)


class UncertaintySettings(_Section):
    """Uncertainty-guided answering (HKRAG): pruner, judger, decoupler, summarizer (LLM answerer only)."""

    enabled: bool = True
    # What the judger reads of a probe answer (orchestrator/pipeline/uncertainty.py): "entropy", the mean token
    # entropy of a greedy probe (the paper's; on the gpu target the probe alone streams the logits it needs);
    # "surprisal", the mean -log p of a probe sampled at temperature 1, which needs only the chosen tokens'
    # log-probabilities (never any logits), at the cost of decisions that differ (benchmarks/results/judger_measures.md).
    measure: Literal["entropy", "surprisal"] = "entropy"
    probe_seed: int = 0  # the surprisal probe's sampling seed: one question, one decision
    # The measure's value (nats) above which a probe answer is uncertain; None: the LLM's own threshold for the
    # measure, calibrated by the build on answerable questions and declared in its config (thinkserve_build.calibration).
    threshold_nats: Optional[float] = Field(None, ge=0)
    sufficiency: float = Field(1.5, gt=0)  # the pruner stops adding evidence once relevance sums to this
    probe_tokens: int = Field(16, ge=1)  # length of the answer whose entropy the judger measures
    max_iterations: int = Field(2, ge=0)  # decoupler rounds
    detail_tokens: int = Field(64, ge=1)  # length of each round's fine-print notes


class AnswerSettings(_Section):
    # extractive: the best evidence sentences, chosen with the embedder, with citations and the value the question
    # asks for (the short answer); llm: generated from the evidence passages; hybrid: generated from the sentences
    # the extractive answerer chose (hybrid_sentences of them, within hybrid_margin of the best), each numbered by
    # its evidence, instead of whole passages: a prompt of a few hundred tokens that a small LLM reads quickly
    # (pipeline/hybrid.py). None: the profile's default (tiny: extractive, since its LLM has random weights; otherwise llm).
    answerer: Optional[Literal["extractive", "llm", "hybrid"]] = None
    hybrid_sentences: int = Field(6, ge=1)
    hybrid_margin: float = Field(0.3, ge=0)
    hybrid_max_tokens: int = Field(32, ge=1)  # the hybrid answer is a value or a sentence: at most this many tokens
    extractive_sentences: int = Field(3, ge=1)  # at most this many sentences in an extractive answer
    extractive_min_similarity: float = Field(0.3, ge=-1, le=2)  # each scores at least this ...
    extractive_margin: float = Field(0.15, ge=0)  # ... and at most this much below the best sentence
    extractive_candidates: int = Field(16, ge=1)  # sentences embedded per answer (most shared words first)
    # The short answer (FinalAnswer.short_answer: the asked-for value alone). Off by default: on the dev PDFs a
    # short answer was given for 53% of the short-answer questions and held the expected value for 2.5% of them
    # (benchmarks/results/mmlongbench-dev/document_qa-answers.md), too often wrong to show a user unasked.
    short_answer: bool = False
    # With less time than this left before the deadline the LLM is not started: the extractive answer is
    # given instead, flagged as degraded. The same answer replaces an LLM that fails or runs out of time.
    llm_reserve_s: float = Field(1.0, ge=0)
    extractive_reserve_s: float = Field(0.25, ge=0)  # time kept back for that fallback


class IndexSettings(_Section):
    """FAISS index kind for every vector table of a collection (derived data: changing it needs no re-ingest)."""

    kind: Literal["flat", "ivf", "hnsw"] = "flat"
    ivf_lists: int = Field(0, ge=0)  # 0: about 4 * sqrt(vectors)
    ivf_probe: int = Field(16, ge=1)
    ivf_min_vectors: int = Field(10_000, ge=1)  # fewer vectors: exact Flat instead (IVF cannot train on them)
    hnsw_neighbors: int = Field(32, ge=4)
    hnsw_ef_search: int = Field(128, ge=1)
    # Flat and IVF indexes on a GPU when faiss-gpu sees one (the `gpu` extra; HNSW has no GPU index in faiss);
    # the same results as on the CPU. Off, or with faiss-cpu, every index stays on the CPU.
    use_gpu: bool = True
    # The one GPU the indexes go on (faiss's numbering: of the devices CUDA_VISIBLE_DEVICES leaves visible),
    # never every device: Triton's models share the machine. A device faiss does not see: the CPU, logged.
    gpu_device: int = Field(0, ge=0)
    # Scratch memory faiss reserves on that device for searches (StandardGpuResources.setTempMemory), once per
    # process; faiss's own default would take a share of the whole device.
    gpu_temp_memory_mb: int = Field(256, ge=0)
    # Device memory all the GPU indexes of this process may hold together (their vectors and IVF centroids); an
    # index that would pass it is built on the CPU instead (logged), never failing a commit. 0: no limit.
    gpu_memory_mb: int = Field(4096, ge=0)


class IngestSettings(_Section):
    # Retrieval units: passages of at most this many of the embedder's tokens, never crossing a page; by default
    # the embedder's whole window. On the dev PDFs 254 ranked pages better than 192 or 128 (R@1 0.40 against 0.39
    # and 0.38, R@5 0.66 against 0.64 and 0.63; the default fusion replayed in process) with a third fewer vectors
    # than 128.
    passage_tokens: int = Field(254, ge=8)
    # The embedder reads at most this many tokens (all-MiniLM-L6-v2: 256 with its two special tokens); a passage
    # longer than this could not be embedded whole.
    embed_window_tokens: int = Field(254, ge=8)
    # What the entity extractor reads: windows of the embedder's tokens (LightRAG's 1,200 / 100).
    chunk_tokens: int = Field(1200, ge=16)
    chunk_overlap_tokens: int = Field(100, ge=0)
    # The embedder's tokenizer.json; empty: the one the model repository's text_embedder_tokenize serves.
    tokenizer: Optional[Path] = None
    # Entities named by fewer evidence records of their document than this get no vector (zeros): they stay in
    # the graph and seed it when a question names them, but no similarity search finds them. Most entities of a
    # real document are named once (2310.07609v1 of the dev PDFs: 576 entities, 63 passages), and embedding their
    # "name: description" texts took more of the embedder than the passages did. 1: every entity gets one.
    entity_min_mentions: int = Field(2, ge=1)
    # Entities and relations: "cooccurrence" (model-free, GraphRAG's fast mode) or "llm" (through Triton).
    extractor: Literal["cooccurrence", "llm"] = "cooccurrence"
    extraction_max_tokens: int = Field(512, ge=16)
    # Images, tables, equations: "caption" (caption, footnote and table text) or "vlm" (described through Triton).
    describer: Literal["caption", "vlm"] = "caption"
    description_context_blocks: int = Field(2, ge=0)  # neighbouring blocks on each side given to the VLM
    description_max_tokens: int = Field(128, ge=8)
    # Page renders, stored once: embedded by every page-image encoder family (each downscales to its input) and
    # shown to the VLM (page relevance, perception), which needs print-size text legible: 100 dpi makes a 10-point
    # letter about 14 pixels tall. JPEG at `page_render_quality` (0: lossless PNG, 3.3x the time, 1.7x the bytes).
    # A page larger than print is rendered with its longer side at `page_render_max_side` pixels (an A0 poster at
    # 85 dpi; a 48 MB bitmap at most): a page's size is the uploader's to choose, and uncapped one 200-inch page
    # took 4.4 GB to render.
    page_images: bool = True
    page_render_dpi: float = Field(100.0, gt=0)
    page_render_max_side: int = Field(4000, ge=64)
    page_render_quality: int = Field(85, ge=0, le=95)
    max_pages: int = Field(1000, ge=1)  # a PDF with more pages is refused with a clear error
    # OCR through the `ocr` model (PP-OCRv4 with trained weights, every profile): "auto" reads the pages on which the
    # parser found no text (scans, slides exported as pictures: MinerU's flash tier does no OCR; a PDF's pages
    # without a text layer are begun while MinerU parses), "always" every page (its text replaces the parser's: for
    # PDFs whose text layer is garbage), "off" none. Pages are rendered at `ocr_dpi` as PNG, the longer side at most
    # `ocr_max_side` pixels; a page with nothing drawn on it is not sent. `ocr_figures` also reads the figures and
    # charts the parser cropped and found no words in (a picture's axis labels, legends, values join the unit's
    # text; a figure whose words the text layer holds is not read again): off by default, as on the 36 dev PDFs its
    # 406 crops doubled OCR's time and changed no retrieval figure (docs/measured/ingest-and-ocr.md). Lines below
    # `ocr_min_confidence` are kept in blocks of their own, marked by their confidence, and counted.
    ocr: Literal["auto", "always", "off"] = "auto"
    ocr_dpi: float = Field(150.0, gt=0)
    ocr_max_side: int = Field(2000, ge=64)
    ocr_figures: bool = False
    ocr_min_confidence: float = Field(0.5, ge=0, le=1)
    ocr_concurrency: int = Field(4, ge=1)  # page images in flight (each rendered when its turn comes)
    # A page with more drawing objects than this is not given to the parser (OCR reads its image instead): the one
    # parse blow-up measured took 45 KB of parse memory per object (187,176 objects past 8 GiB); at 50,000 a page
    # stays within a third of the flash tier's budget, and the dev PDFs' busiest page has 7,817. 0: no limit.
    parser_max_page_objects: int = Field(50_000, ge=0)
    # When the parse of a whole PDF fails (memory, time, a crash), it is parsed again in ranges of this many pages,
    # a failing range one page at a time; a page that still fails is read by OCR (orchestrator/knowledge/parsing/page_ranges.py).
    parser_range_pages: int = Field(8, ge=1)
    # MinerU: the offline "flash" tier by default; "basic" / "standard" / "advanced" need their model folders.
    parser_tier: str = "flash"
    parser_mode: Literal["subprocess", "inprocess"] = "subprocess"
    parser_timeout_s: float = Field(1800.0, gt=0)
    # The parse process's memory (address space, MiB; 0: unlimited): a document needing more fails alone with
    # RESOURCE_EXHAUSTED instead of the kernel's OOM killer choosing Triton or the server. The flash tier's
    # peak on the dev PDFs is 0.3-1.6 GB; one ordinary PDF with a huge vector chart once took 21.6 GB. None:
    # 8192 for the flash tier, unlimited for the others (their torch and CUDA reserve far more address space
    # than they use, so an address-space limit is no measure of their memory).
    parser_memory_mb: Optional[int] = Field(None, ge=0)
    # "local" never downloads: higher tiers read models pre-placed in parser_model_dir (default ~/.mineru/models).
    parser_model_source: Literal["local", "auto", "huggingface", "modelscope"] = "local"
    parser_model_dir: Optional[Path] = None
    # Model calls: texts per request and requests in flight per document (Triton batches across them).
    embed_batch: int = Field(32, ge=1)
    max_concurrent_calls: int = Field(8, ge=1)


class GenerationSettings(_Section):
    max_tokens: int = Field(64, ge=0)
    max_tokens_limit: int = Field(1024, ge=1)
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    # The LLM's and the VLM's tokenizer.json, to fit prompts to their context exactly; empty: the files the
    # model repository serves (llm/1/tokenizer.json, vlm/1/tokenizer.json).
    llm_tokenizer: Optional[Path] = None
    vlm_tokenizer: Optional[Path] = None


# Settings left unset (None) take their value from the profile: the tiny profile's router, cross-encoder, LLM,
# VLM and page encoders have random weights, so it decides routes by features, gives the reranker no say, runs
# neither page-image retrieval nor perception unless a request asks, and answers extractively; every other
# profile serves trained models and uses them. Either way every path is real.
TRAINED_MODEL_DEFAULTS: tuple[tuple[str, str, Any], ...] = (
    ("router", "mode", "model"),
    ("retrieval", "rerank_weight", 1.0),
    ("answer", "answerer", "llm"),
    ("pages", "run_by_default", True),
    ("perception", "mode", "dpr"),
)
PROFILE_DEFAULTS: dict[str, tuple[tuple[str, str, Any], ...]] = {
    "tiny": (("router", "mode", "features"), ("retrieval", "rerank_weight", 0.0), ("answer", "answerer", "extractive"),
             ("pages", "run_by_default", False), ("perception", "mode", "off")),
    # tiny with a trained LLM (SmolLM2-135M-Instruct) that also routes when asked: what it is given a say in
    # follows the measurements on the dev PDFs (docs/measured/); the other models are tiny's random ones
    "offline": (("router", "mode", "features"), ("retrieval", "rerank_weight", 0.0), ("answer", "answerer", "extractive"),
                ("pages", "run_by_default", False), ("perception", "mode", "off")),
}


class Settings(_Section):
    profile: str = "tiny"
    triton: TritonSettings = TritonSettings()
    server: ServerSettings = ServerSettings()
    http: HttpSettings = HttpSettings()
    auth: AuthSettings = AuthSettings()
    observability: ObservabilitySettings = ObservabilitySettings()
    storage: StorageSettings = StorageSettings()
    retrieval: RetrievalSettings = RetrievalSettings()
    router: RouterSettings = RouterSettings()
    routes: RouteSettings = RouteSettings()
    pages: PageSettings = PageSettings()
    perception: PerceptionSettings = PerceptionSettings()
    uncertainty: UncertaintySettings = UncertaintySettings()
    answer: AnswerSettings = AnswerSettings()
    index: IndexSettings = IndexSettings()
    ingest: IngestSettings = IngestSettings()
    generation: GenerationSettings = GenerationSettings()

    @model_validator(mode="after")
    def _repository_follows_profile(self) -> "Settings":
        if "model_repository" not in self.triton.model_fields_set:
            repository = Path("model_repository") / self.profile
            object.__setattr__(self, "triton", self.triton.model_copy(update={"model_repository": repository}))
        if self.ingest.chunk_overlap_tokens >= self.ingest.chunk_tokens:
            raise ValueError("ingest.chunk_overlap_tokens must be smaller than ingest.chunk_tokens")
        if self.ingest.passage_tokens > self.ingest.embed_window_tokens:
            raise ValueError(
                f"ingest.passage_tokens ({self.ingest.passage_tokens}) must fit the embedder's window "
                f"(ingest.embed_window_tokens = {self.ingest.embed_window_tokens})"
            )
        defaults = PROFILE_DEFAULTS.get(self.profile, TRAINED_MODEL_DEFAULTS)
        for section, field, value in defaults:
            current = getattr(self, section)
            if getattr(current, field) is None:
                object.__setattr__(self, section, current.model_copy(update={field: value}))
        return self

    def scratch(self, data_dir: Path) -> "Settings":
        """These settings for a throw-away deployment (demo, benchmarks) that must not disturb a running one: any
        free gRPC and HTTP ports and its own data folder."""
        return self.model_copy(update={
            "server": self.server.model_copy(update={"port": 0}),
            "http": self.http.model_copy(update={"port": 0}),
            "storage": self.storage.model_copy(update={"data_dir": data_dir}),
        })

    @property
    def tokenizer_file(self) -> Path:
        """The text embedder's tokenizer: chunks are counted in the tokens the embedder reads."""
        if self.ingest.tokenizer is not None:
            return self.ingest.tokenizer
        return self.triton.model_repository / "text_embedder_tokenize" / "1" / "tokenizer.json"

    def generator_tokenizer_file(self, model: str) -> Path:
        """The tokenizer of the LLM or the VLM (named by its contract), from settings or the model repository."""
        configured = {"llm": self.generation.llm_tokenizer, "vlm": self.generation.vlm_tokenizer}.get(model)
        return configured if configured is not None else self.triton.model_repository / model / "1" / "tokenizer.json"

    @classmethod
    def load(
        cls, path: Optional[Path] = None, overrides: Optional[dict[str, Any]] = None,
        environment: Optional[Mapping[str, str]] = None,
    ) -> "Settings":
        """Settings from a TOML file (optional), then the environment's THINKSERVE_SECTION__KEY variables (when
        an `environment` is given: the commands pass os.environ), then dotted-key overrides, e.g.
        {"server.port": 0}; then the grants of `auth.tokens_file` join `auth.tokens`."""
        data: dict[str, Any] = {}
        if path is not None:
            try:
                data = tomllib.loads(Path(path).read_text())
            except (OSError, tomllib.TOMLDecodeError) as error:
                raise ConfigurationError(f"cannot read settings file {path}: {error}") from None
        layers = {**environment_overrides(environment or {}), **{k: v for k, v in (overrides or {}).items() if v is not None}}
        for dotted, value in layers.items():
            section = data
            *parents, leaf = dotted.split(".")
            for parent in parents:
                section = section.setdefault(parent, {})
                if not isinstance(section, dict):
                    raise ConfigurationError(f"invalid settings: {dotted}: {parent} is a value, not a section")
            section[leaf] = value
        auth = data.get("auth")
        if isinstance(auth, dict) and auth.get("tokens_file"):
            auth["tokens"] = [*auth.get("tokens", []), *_token_file(Path(auth["tokens_file"]))]
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
            raise ConfigurationError(f"invalid settings: {problems}") from None


ENVIRONMENT_PREFIX = "THINKSERVE_"


def environment_overrides(environment: Mapping[str, str]) -> dict[str, Any]:
    """THINKSERVE_SECTION__KEY=value variables as dotted overrides ({"section.key": value}), at any depth
    (THINKSERVE_ROUTES__SIMPLE__EVIDENCE_K). Only names whose first part is a settings field count (so
    THINKSERVE_TOKEN, the client's token, is not a setting). A value reads as TOML when it is a TOML value
    (8, 0.5, true, ["a", "b"], {name = "x"}, "quoted"), else as the text it is (a path, a host name)."""
    fields = set(Settings.model_fields)
    found: dict[str, Any] = {}
    for name, raw in environment.items():
        if not name.startswith(ENVIRONMENT_PREFIX):
            continue
        parts = name[len(ENVIRONMENT_PREFIX):].lower().split("__")
        if parts[0] not in fields or not all(parts):
            continue
        try:
            value = tomllib.loads(f"value = {raw}")["value"]
        except tomllib.TOMLDecodeError:
            value = raw
        found[".".join(parts)] = value
    return found


def _token_file(path: Path) -> list[dict[str, Any]]:
    try:
        grants = tomllib.loads(path.read_text()).get("tokens", [])
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigurationError(f"cannot read auth.tokens_file {path}: {error}") from None
    if not isinstance(grants, list):
        raise ConfigurationError(f"auth.tokens_file {path}: 'tokens' must be an array of tables ([[tokens]])")
    return grants
