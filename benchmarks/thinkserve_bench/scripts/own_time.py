"""The orchestrator's own time per query on a large collection: everything but waiting on a model.

    thinkserve-bench own_time [--documents 100 --chunks-per-document 1000] [--queries 200] [--index hnsw]
                                  [--model-ms 1.0] [--commits 3] [--profile]

A synthetic collection (benchmarks/thinkserve_bench/scripts/synthetic_collection.py, 100 x 1,000 chunks by default) is written to disk
and opened as the server opens it (KnowledgeBase, warmed in the background). The query pipeline the server
runs (QueryPipeline.run: route, embed, retrieval, rerank when the route asks for it, context, the extractive
answer, the final event with its cost) answers each question, in process, with stand-in models that take
--model-ms per call (1 ms: about a small batch through Triton on a GPU) and answer with the question's vector
from the corpus, or a fixed vector per other text. What the pipeline reports as its own time
(`cost.orchestrator_ms`: wall time outside model calls) is what is measured, split per stage as the final
event reports it. Beside it: each query's events converted to protobuf and serialised, as the service sends
them; and, for Simple and Complex, the same queries through the gRPC service, timed by a client in another
process.

Measured in one run, per route (Simple, Moderate, Complex; extractive answer, the default settings):
  steady   own time per query once everything is built: p50, p95, p99 and per stage
  at once  the Simple route again with models that take no time at all: bookkeeping the pipeline does while
           a model computes (token counts) then counts as its own; and alternating question by question, the
           answer sentences read as stored at commit time or cut per query (as before they were stored)
  PageRank Moderate and Complex alternating question by question, a neighbourhood's PageRank compiled (numba)
           or on the scipy path (as on a host without numba)
  start    the first query after the collection is opened (the server's start), against steady and against
           the same question asked again once everything is warm (a question's own time depends on the
           question: the first one is heavier than most, warm or not)
  commit   80-chunk documents committed one after another (--commits): a query sent at once (the previous
           snapshot), the time until the new snapshot is published, the first query on it, against steady and
           against the same question asked again at the end
  collector  every collection of Python's garbage collector from the end of the warm-up on, and how long it
           held the interpreter (a long one stalls every query in flight)
  gRPC     Simple and Complex again through the gRPC service, served by this process (the same pipeline) to a
           client in another process: what the client waits beyond the models, against the server's own time
The interpreter's switch interval is the server's (server.switch_interval_ms).
With --profile, pyinstrument samples the steady queries of --profile-route (Simple by default; models at once):
the functions that take the time, in the event loop's thread and in retrieval (which the pipeline runs in a
worker thread).
Goal (issue 21): Simple <= 5 ms p50 and <= 10 ms p99, Complex <= 10 ms p50, at 100,000 chunks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import hashlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import AsyncIterator, Optional, Sequence

import numpy as np

from orchestrator.api.convert import query_event
from thinkserve_bench.machine import machine_facts
from thinkserve_bench.result_files import RESULTS, uncommitted_changes, write_results
from thinkserve_bench.stats import summarize
from orchestrator.config import Settings
from orchestrator.knowledge.graph import pagerank as graph_engines
from orchestrator.knowledge.storage.indexes import index_spec
from orchestrator.knowledge.storage.registry import KnowledgeBase
from orchestrator.pipeline.events import FinalAnswerEvent
from orchestrator.pipeline.plan import QueryOptions, make_plan
from orchestrator.pipeline.query import QueryInput, QueryPipeline
from orchestrator.pipeline.retrieval import retrieve
from orchestrator.pipeline.router import query_features
from orchestrator.models.tokens import PlainTokenizer

from .incremental_commit import wait_warm
from .synthetic_collection import CollectionShape, SyntheticCorpus, SyntheticQuestion, write_collection

NAME = "own_time"
COLLECTION = "large"
ROUTES = ("simple", "moderate", "complex")
GOALS_MS = {"simple": (5.0, 10.0), "complex": (10.0, None)}  # p50, p99


class InstantModels:
    """The models' protocol (TritonModels' methods the extractive pipeline calls), each call answered after
    `latency_s` (0: at once; making its vectors counts as model time). The question gets its corpus vector; any
    other text (an evidence sentence) a unit vector near the last question's, its offset seeded by a hash of
    the text, so that sentences score as they would against a real embedder (cosine about 0.8) and the
    answer cites them."""

    def __init__(self, dimension: int, latency_s: float = 0.0):
        self.dimension = dimension
        self.latency_s = latency_s  # each call's time, as a GPU behind Triton would take; 0: none at all
        self.question: Optional[SyntheticQuestion] = None
        self.expected: dict[str, SyntheticQuestion] = {}

    def expect(self, questions: Sequence[SyntheticQuestion]) -> None:
        """Questions that come by their text alone (through the gRPC API): one embedded becomes the question."""
        self.expected.update((question.text, question) for question in questions)

    async def _wait(self) -> None:
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)

    def _vector(self, text: str) -> np.ndarray:
        self.question = self.expected.get(text, self.question)
        if self.question is not None and text == self.question.text:
            return self.question.vector[0]
        seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
        vector = np.random.default_rng(seed).normal(size=self.dimension)
        if self.question is not None:
            vector = self.question.vector[0] + 0.7 * vector / np.linalg.norm(vector)
        return (vector / np.linalg.norm(vector)).astype(np.float32)

    async def embed(self, texts: Sequence[str], timeout_s: Optional[float] = None) -> np.ndarray:
        await self._wait()
        return np.stack([self._vector(text) for text in texts]) if texts else np.zeros((0, self.dimension), np.float32)

    async def rerank(self, query: str, passages: Sequence[str], timeout_s: Optional[float] = None) -> np.ndarray:
        await self._wait()
        return np.asarray([self._vector(query) @ self._vector(p) for p in passages], dtype=np.float32)

    async def route(self, questions: Sequence[str], timeout_s: Optional[float] = None) -> np.ndarray:
        await self._wait()
        return np.tile(np.asarray([[1.0, 0.0, 0.0]], np.float32), (len(questions), 1))

    @contextlib.asynccontextmanager
    async def generate(self, *args, **kwargs) -> AsyncIterator[AsyncIterator]:
        raise NotImplementedError("the own-time benchmark measures the extractive answer")
        yield


class CollectorPauses:
    """Every collection of Python's cyclic garbage collector while installed (gc.callbacks), and how long it held
    the interpreter: no query in the process runs meanwhile, so a long one is a stall of every query in flight."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []  # (generation, ms)
        self._began = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.pauses.append((info["generation"], (time.perf_counter() - self._began) * 1000))

    def __enter__(self) -> "CollectorPauses":
        gc.callbacks.append(self)
        return self

    def __exit__(self, *_) -> None:
        gc.callbacks.remove(self)

    def summary(self) -> dict:
        longest = max(self.pauses, key=lambda pause: pause[1], default=(-1, 0.0))
        return {"collections": len(self.pauses), "over_10ms": sum(ms >= 10 for _, ms in self.pauses),
                "longest_ms": longest[1], "longest_generation": longest[0], "total_ms": sum(ms for _, ms in self.pauses)}


CONVERSION_MS: list[float] = []  # per query: its events converted to protobuf and serialised, as the server sends them


async def ask(pipeline: QueryPipeline, models: InstantModels, question: SyntheticQuestion, route: str) -> FinalAnswerEvent:
    """One query as the server runs it (one event loop for all, as in the server; retrieval in its thread)."""
    models.question = question
    final, converting = None, 0.0
    async for event in pipeline.run(QueryInput(COLLECTION, question.text, QueryOptions(route=route)), time.monotonic() + 60.0):
        started = time.perf_counter()
        query_event(event, "bench").SerializeToString()
        converting += time.perf_counter() - started
        final = event
    assert isinstance(final, FinalAnswerEvent), final
    CONVERSION_MS.append(converting * 1000)
    return final


def own_ms(final: FinalAnswerEvent) -> float:
    return final.cost.orchestrator_ms


def route_summary(finals: list[FinalAnswerEvent]) -> dict:
    stages = sorted({stage for f in finals for stage in f.cost.orchestrator_ms_by_stage})
    return {
        "conversion_p50_ms": float(np.median(CONVERSION_MS[-len(finals):])),
        "own": summarize([own_ms(f) / 1000 for f in finals]),
        "model_ms_p50": float(np.median([f.cost.model_ms for f in finals])),
        "stages_p50_ms": {s: float(np.median([f.cost.orchestrator_ms_by_stage.get(s, 0.0) for f in finals])) for s in stages},
        "evidence_p50": float(np.median([len(f.citations) for f in finals])),
    }


async def profile_queries(
    pipeline: QueryPipeline, models: InstantModels, questions: list[SyntheticQuestion], route: str
) -> dict[str, str]:
    """pyinstrument's text reports (frames under 2% of the time left out): the queries as the server runs them,
    and retrieval alone, called in this thread (the pipeline runs it in a worker thread, which a profiler of
    the event loop's thread does not see)."""
    from pyinstrument import Profiler

    def report(profiler: Profiler) -> str:
        text = profiler.output_text(unicode=False, color=False, show_all=False, time="percent_of_total",
                                    processor_options={"filter_threshold": 0.02})
        return "\n".join(line for line in text.splitlines() if not line.startswith("Profile at "))  # a local path

    profiler = Profiler(interval=0.0002, async_mode="disabled")
    with profiler:
        for question in questions:
            await ask(pipeline, models, question, route)
    reports = {"pipeline": report(profiler)}
    snapshot = pipeline.knowledge.collection(COLLECTION).snapshot
    plan = make_plan(route, QueryOptions(), pipeline.settings)
    profiler = Profiler(interval=0.0002, async_mode="disabled")
    with profiler:
        for question in questions:
            features = query_features(question.text, snapshot.entity_key_set)
            retrieve(snapshot, [question.text], question.vector, plan, pipeline.settings.retrieval, features.entities,
                     features.modalities)
    reports["retrieval"] = report(profiler)
    return reports


async def through_server(
    settings: Settings, pipeline: QueryPipeline, models: InstantModels, questions: list[SyntheticQuestion], route: str,
    warm_up: int = 5,
) -> dict:
    """The same queries through the orchestrator's gRPC service (gateway: request id, admission, metrics; events to
    protobuf; HTTP/2 over a local TCP socket) served by this process's event loop and pipeline, from a client in a
    process of its own (benchmarks/thinkserve_bench/scripts/grpc_query_timing.py), one after another: the client's wall time less the time
    a model call was in flight is the own time a caller sees."""
    import grpc

    from orchestrator.api import protos
    from orchestrator.api.gateway import Gateway
    from orchestrator.api.service import ThinkServeService
    from orchestrator.knowledge.ingest import Ingestor
    from orchestrator.observability.metrics import ServiceMetrics

    ingestor = Ingestor(pipeline.knowledge, models, settings.ingest, settings.tokenizer_file)  # type: ignore[arg-type]
    service = ThinkServeService(settings, models, ingestor, Gateway(settings, pipeline, ServiceMetrics()), ())  # type: ignore[arg-type]
    server = grpc.aio.server()
    protos.pb_grpc.add_ThinkServeServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    asked = questions[:warm_up] + questions
    models.expect(asked)
    try:
        client = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "thinkserve_bench.scripts.grpc_query_timing", f"127.0.0.1:{port}", COLLECTION, route, str(warm_up),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await client.communicate(json.dumps([question.text for question in asked]).encode())
        if client.returncode != 0:
            raise RuntimeError(f"the gRPC client failed (exit {client.returncode})")
    finally:
        await server.stop(None)
    timings = json.loads(out)
    return {
        "seen_by_client": summarize([(t["wall_ms"] - t["model_ms"]) / 1000 for t in timings]),
        "server_own": summarize([t["orchestrator_ms"] / 1000 for t in timings]),
        "wall": summarize([t["wall_ms"] / 1000 for t in timings]),
    }


async def sentences_ab(pipeline: QueryPipeline, models: InstantModels, questions: list[SyntheticQuestion]) -> dict:
    """Simple queries with the answer sentences read as stored and cut per query (as for segments written before
    they were stored), alternating question by question in this one process: the change measured apart from
    this machine's drift from one minute to the next (with the models as they are set: at once here)."""
    segments = pipeline.knowledge.collection(COLLECTION).snapshot.segments
    stored = [segment.sentences for segment in segments]
    own: dict[str, list[float]] = {"stored": [], "cut": []}
    try:
        for number, question in enumerate(questions):
            for variant in ("stored", "cut") if number % 2 == 0 else ("cut", "stored"):
                for segment, sentences in zip(segments, stored):
                    segment.sentences = sentences if variant == "stored" else None
                own[variant].append(own_ms(await ask(pipeline, models, question, "simple")) / 1000)
    finally:
        for segment, sentences in zip(segments, stored):
            segment.sentences = sentences
    return {variant: summarize(seconds) for variant, seconds in own.items()}


async def pagerank_ab(pipeline: QueryPipeline, models: InstantModels, questions: list[SyntheticQuestion], route: str) -> dict:
    """`route`'s queries with a neighbourhood's PageRank compiled (numba) and on the scipy path (as on a host
    without numba; the same scores), alternating question by question in this one process."""
    own: dict[str, list[float]] = {"compiled": [], "scipy": []}
    compiled = graph_engines.compiled_kernels
    try:
        for number, question in enumerate(questions):
            for variant in ("compiled", "scipy") if number % 2 == 0 else ("scipy", "compiled"):
                graph_engines.compiled_kernels = compiled if variant == "compiled" else (lambda: None)
                own[variant].append(own_ms(await ask(pipeline, models, question, route)) / 1000)
    finally:
        graph_engines.compiled_kernels = compiled
    return {variant: summarize(seconds) for variant, seconds in own.items()}


async def measure(
    settings: Settings, knowledge: KnowledgeBase, models: InstantModels, corpus: SyntheticCorpus, args: argparse.Namespace,
    first_questions: list[SyntheticQuestion], questions: list[SyntheticQuestion], result: dict,
) -> None:
    tokenizer = PlainTokenizer(settings.tokenizer_file, "ingest.tokenizer")
    pipeline = QueryPipeline(settings, models, knowledge, tokenizer)  # type: ignore[arg-type]
    started = time.monotonic()
    pipeline.warm_up()  # what the server runs in the background at start
    result["warm_up_s"] = time.monotonic() - started
    try:
        with CollectorPauses() as pauses:
            await measure_queries(settings, knowledge, models, corpus, args, first_questions, questions, result, pipeline)
        result["collector"] = pauses.summary()
    finally:
        pipeline.close()


async def measure_queries(
    settings: Settings, knowledge: KnowledgeBase, models: InstantModels, corpus: SyntheticCorpus, args: argparse.Namespace,
    first_questions: list[SyntheticQuestion], questions: list[SyntheticQuestion], result: dict, pipeline: QueryPipeline,
) -> None:
    """Everything measured after the warm-up: first query, steady routes, the A/Bs, profiles, commits."""
    tokenizer = pipeline.tokenizer
    first = await ask(pipeline, models, first_questions[0], "simple")
    result["first_after_start_ms"] = own_ms(first)
    result["first_after_start_stages_ms"] = first.cost.orchestrator_ms_by_stage
    print(f"* first query after start: {own_ms(first):.1f} ms", flush=True)
    for route in ROUTES:
        for question in questions[:5]:
            await ask(pipeline, models, question, route)  # warm-up (caches of the route's first use)
        finals = [await ask(pipeline, models, question, route) for question in questions]
        result["routes"][route] = route_summary(finals)
        own = result["routes"][route]["own"]
        print(f"* {route}: own time p50 {own['p50_ms']:.2f} ms, p99 {own['p99_ms']:.2f} ms", flush=True)
    if graph_engines.compiled_kernels() is not None:
        for route in ("moderate", "complex"):
            result.setdefault("pagerank_ab", {})[route] = ab = await pagerank_ab(pipeline, models, questions, route)
            print(f"* {route}, PageRank compiled / scipy path, alternating: p50 {ab['compiled']['p50_ms']:.2f} / "
                  f"{ab['scipy']['p50_ms']:.2f} ms", flush=True)
    for route in ("simple", "complex"):
        result.setdefault("through_grpc", {})[route] = through = await through_server(settings, pipeline, models, questions, route)
        print(f"* {route} through the gRPC server: own time seen by the client p50 {through['seen_by_client']['p50_ms']:.2f} ms, "
              f"the server's {through['server_own']['p50_ms']:.2f} ms", flush=True)
    # the first question again, now that everything is warm: a question's own time depends on the question
    # (its words' postings, its evidence's sentences), so "first" is compared with the same question too
    again = [await ask(pipeline, models, first_questions[0], "simple") for _ in range(3)]
    result["first_question_steady_ms"] = float(np.median([own_ms(f) for f in again]))
    latency_s, models.latency_s = models.latency_s, 0.0
    result["simple_at_once"] = route_summary([await ask(pipeline, models, question, "simple") for question in questions])
    print(f"* simple, models at once: own time p50 {result['simple_at_once']['own']['p50_ms']:.2f} ms", flush=True)
    result["sentences_ab"] = await sentences_ab(pipeline, models, questions)
    print(f"* simple, answer sentences stored / cut per query, alternating: p50 {result['sentences_ab']['stored']['p50_ms']:.2f} / "
          f"{result['sentences_ab']['cut']['p50_ms']:.2f} ms", flush=True)
    if args.profile:
        result["profile_route"] = args.profile_route
        result["profile_simple"] = await profile_queries(pipeline, models, questions, args.profile_route)
    models.latency_s = latency_s
    collection = knowledge.collection(COLLECTION)
    rounds = []
    for number in range(args.commits):
        staging = collection.staging_folder()
        (staging / "assets").mkdir()
        (staging / "pages").mkdir()
        started = time.monotonic()
        document = corpus.document(args.documents + number, 80)
        document.cut_sentences(tokenizer.counts)  # as the ingest does before its commit (not timed here)
        collection.commit(document, staging)
        committed_s = time.monotonic() - started
        during = await ask(pipeline, models, first_questions[1 + 2 * number], "simple")  # reads the previous snapshot
        await collection.visible(collection.head().generation)
        published_s = time.monotonic() - started
        after = await ask(pipeline, models, first_questions[2 + 2 * number], "simple")
        rounds.append({"commit_s": committed_s, "during_build_ms": own_ms(during), "published_s": published_s,
                       "first_after_commit_ms": own_ms(after), "first_after_commit_stages_ms": after.cost.orchestrator_ms_by_stage})
        print(f"* after commit {number + 1}: at once {own_ms(during):.1f} ms, published {published_s:.1f} s after the commit "
              f"began, first query on it {own_ms(after):.1f} ms", flush=True)
    for number, round_ in enumerate(rounds):  # each first question on a new snapshot, asked again on the last one
        again = [await ask(pipeline, models, first_questions[2 + 2 * number], "simple") for _ in range(3)]
        round_["same_question_steady_ms"] = float(np.median([own_ms(f) for f in again]))
    result["commits"] = rounds
    for key in ("commit_s", "during_build_ms", "published_s", "first_after_commit_ms"):
        result[key] = float(np.median([r[key] for r in rounds]))
    result["first_after_commit_vs_same_question"] = float(np.median([r["first_after_commit_ms"] / r["same_question_steady_ms"] for r in rounds]))
    middle = sorted(rounds, key=lambda r: r["first_after_commit_ms"])[len(rounds) // 2]
    result["first_after_commit_stages_ms"] = middle["first_after_commit_stages_ms"]


def declare_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--documents", type=int, default=100)
    parser.add_argument("--chunks-per-document", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--index", default="hnsw", choices=("flat", "ivf", "hnsw"))
    parser.add_argument("--model-ms", type=float, default=1.0, help="each stand-in model call's time")
    parser.add_argument("--commits", type=int, default=3, help="80-chunk documents committed one after another")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--profile-route", default="simple", choices=ROUTES, help="the route --profile samples")
    parser.add_argument("--name", default=NAME)
    parser.add_argument("--output", type=Path, default=RESULTS)


def run_benchmark(args: argparse.Namespace, command: str) -> None:
    shape = CollectionShape(documents=args.documents + args.commits, chunks_per_document=args.chunks_per_document)
    corpus = SyntheticCorpus(shape)  # its last documents are the ones committed during the run
    segments = corpus.segments()
    firsts = 1 + 2 * args.commits
    questions = corpus.questions(args.queries + firsts)
    first_questions, questions = questions[:firsts], questions[firsts:]
    settings = Settings.load(overrides={"index": {"kind": args.index}})
    sys.setswitchinterval(settings.server.switch_interval_ms / 1000)  # as a serving process sets it
    models = InstantModels(shape.dimension, args.model_ms / 1000)
    data_dir = Path(tempfile.mkdtemp(prefix="own-time-"))
    result: dict = {
        "benchmark": NAME, "command": command, "machine": machine_facts(),
        "uncommitted_changes": uncommitted_changes(), "shape": {**shape.__dict__, "documents": args.documents},
        "index": args.index, "model_ms": args.model_ms, "routes": {},
    }
    try:
        tokenizer = PlainTokenizer(settings.tokenizer_file, "ingest.tokenizer")
        write_collection(segments[: args.documents], data_dir, COLLECTION, tokenizer.counts)
        started = time.monotonic()
        knowledge = KnowledgeBase(data_dir, index_spec(settings.index), warm=True)
        knowledge.preload()
        result["open_s"] = time.monotonic() - started
        result["warm_s"] = wait_warm(knowledge.collection(COLLECTION).snapshot)  # what a server does after start
        asyncio.run(measure(settings, knowledge, models, corpus, args, first_questions, questions, result))
        result["evidence"] = len(knowledge.collection(COLLECTION).snapshot.evidence)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    path, md_path = write_results(args.name, result, markdown(result), args.output)
    print(markdown(result))
    print(f"wrote {path} and {md_path}")


def markdown(result: dict) -> str:
    machine = result["machine"]
    routes = result["routes"]
    stages = sorted({s for r in routes.values() for s in r["stages_p50_ms"]}, key=lambda s: -routes["simple"]["stages_p50_ms"].get(s, 0))
    steady = routes["simple"]["own"]["p50_ms"]
    lines = [
        "# The orchestrator's own time per query",
        "",
        f"Command: `{result['command']}`  ",
        f"Machine: {machine['cpu']}, {machine['logical_cores']} logical cores, {machine['memory_gib']} GiB, GPU: {machine['gpu'] or 'none'}  ",
        f"Collection: {result['evidence']:,} chunks in synthetic documents (after the commit), {result['index']} index; "
        f"opened in {result['open_s']:.1f} s, warmed in the background {result['warm_s']:.1f} s after. The pipeline the server runs, in process, with "
        f"stand-in models taking {result['model_ms']:g} ms a call: the time below is everything but waiting on a model (the protobuf conversion of its events in the last column; through the whole gRPC service: below). "
        "Extractive answer.",
        "",
        "| route | p50 ms | p95 ms | p99 ms | max ms | goal p50 / p99 | queries | evidence cited p50 | + events to protobuf, p50 ms |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for route, summary in routes.items():
        own = summary["own"]
        goal = GOALS_MS.get(route)
        goal_text = f"{goal[0]:g}" + (f" / {goal[1]:g}" if goal and goal[1] else "") if goal else ""
        lines.append(f"| {route} | **{own['p50_ms']:.2f}** | {own['p95_ms']:.2f} | {own['p99_ms']:.2f} | {own['max_ms']:.2f} | {goal_text} | "
                     f"{own['count']} | {summary['evidence_p50']:.0f} | {summary.get('conversion_p50_ms', 0.0):.2f} |")
    at_once = result["simple_at_once"]["own"]
    lines += [
        "",
        f"- Simple with models that take no time (token counts no longer hidden behind a model call): p50 "
        f"{at_once['p50_ms']:.2f} ms, p95 {at_once['p95_ms']:.2f}, p99 {at_once['p99_ms']:.2f}",
        f"- first query after start, once the server's background warm-up is done (Simple; QueryPipeline.warm_up "
        f"took {result['warm_up_s']:.2f} s on the built collection): {result['first_after_start_ms']:.1f} ms = "
        f"{result['first_after_start_ms'] / steady:.2f}x the steady p50, "
        f"{result['first_after_start_ms'] / result['first_question_steady_ms']:.2f}x the same question asked once everything is warm "
        f"({result['first_question_steady_ms']:.1f} ms, median of 3) (goal: within 1.5x)",
        f"- an 80-chunk document committed, medians of {len(result['commits'])} (durable in {result['commit_s']:.2f} s): a query sent at once reads the previous "
        f"snapshot, {result['during_build_ms']:.1f} ms = {result['during_build_ms'] / steady:.2f}x; the new snapshot is published "
        f"{result['published_s']:.1f} s after the commit began (built); the first query on it {result['first_after_commit_ms']:.1f} ms = "
        f"{result['first_after_commit_ms'] / steady:.2f}x the steady p50, {result['first_after_commit_vs_same_question']:.2f}x the same "
        "question asked again on the last snapshot (goal: within 1.5x)",
    ]
    collector = result.get("collector")
    if collector:
        lines.append(
            f"- Python's garbage collector from the end of the warm-up to the last query (every query and commit above): "
            f"{collector['collections']} collections, {collector['over_10ms']} of them 10 ms or longer, the longest "
            f"{collector['longest_ms']:.1f} ms (generation {collector['longest_generation']}), {collector['total_ms']:.0f} ms in all "
            "(a collection holds the interpreter: every query in flight waits)")
    for route, through in result.get("through_grpc", {}).items():
        seen, server = through["seen_by_client"], through["server_own"]
        lines.append(
            f"- {route.title()} through the gRPC server (this process's event loop and pipeline behind the service's gateway, a client in "
            f"another process over a local TCP socket, one query at a time, {seen['count']} queries): the client's wall time less the time a "
            f"model call was in flight p50 {seen['p50_ms']:.2f} ms, p99 {seen['p99_ms']:.2f}; the server's own time of the same queries p50 "
            f"{server['p50_ms']:.2f} ms, p99 {server['p99_ms']:.2f}: gRPC, the gateway and the client add {seen['p50_ms'] - server['p50_ms']:.2f} ms at p50")
    for route, ab in result.get("pagerank_ab", {}).items():
        lines.append(
            f"- {route.title()}, alternating question by question in this process (models at {result['model_ms']:g} ms): a neighbourhood's "
            f"PageRank compiled by numba p50 {ab['compiled']['p50_ms']:.2f} ms (p99 {ab['compiled']['p99_ms']:.2f}), on the scipy path "
            f"(as without numba; the same scores) {ab['scipy']['p50_ms']:.2f} ms (p99 {ab['scipy']['p99_ms']:.2f}): "
            f"{ab['scipy']['p50_ms'] / ab['compiled']['p50_ms']:.2f}x")
    ab = result.get("sentences_ab")
    if ab:
        lines.append(
            "- Simple, alternating question by question in this process (models at once, so that token counts show): answer sentences read as "
            f"stored at commit time p50 {ab['stored']['p50_ms']:.2f} ms (p99 {ab['stored']['p99_ms']:.2f}), cut and counted per query as "
            f"before (segments written without them) {ab['cut']['p50_ms']:.2f} ms (p99 {ab['cut']['p99_ms']:.2f}): "
            f"{ab['cut']['p50_ms'] / ab['stored']['p50_ms']:.2f}x")
    lines += [
        "",
        "Own time per stage, p50 ms (`cost.orchestrator_ms_by_stage`):",
        "",
        "| stage | " + " | ".join(routes) + " | first after start | first after commit |",
        "|---|" + "---:|" * (len(routes) + 2),
    ]
    for stage in stages:
        cells = [f"{r['stages_p50_ms'].get(stage, 0.0):.2f}" for r in routes.values()]
        cells += [f"{result[k].get(stage, 0.0):.2f}" for k in ("first_after_start_stages_ms", "first_after_commit_stages_ms")]
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    for part, text in result.get("profile_simple", {}).items():
        where = "the event loop's thread" if part == "pipeline" else "retrieval alone, called in the main thread"
        lines += ["", f"pyinstrument over the steady {result.get('profile_route', 'simple').title()} queries (models at once), {where} (share of the sampled time, frames under 2% "
                  "left out):", "", "```", text.strip(), "```"]
    return "\n".join(lines) + "\n"
