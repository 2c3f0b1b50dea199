"""What auth, admission and metrics add to a request (issue 5's goal: under 1 ms p50).

    thinkserve-bench service_overhead [--rounds 300] [--tokens 100]

Two measurements in one run:
1. End to end, A/B on one Triton: a "guarded" deployment (bearer tokens, `--tokens` grants configured,
   admission limits, metrics) and an "open" one (no tokens, admission limits far above the load) serve the same
   document. Requests alternate between them, one at a time: Retrieve (route simple: embedder, retrieval,
   reranker) and GetDocument (no model: the server's own path only). Reported: p50/p95 of each and the
   difference of the medians. Metrics cannot be switched off, so both sides pay them: part 2 times them.
2. In process: the gateway's work per query without any transport or model: the call context (request id,
   token check among `--tokens` digests, span, request metrics), an admission slot, and the query metrics of a
   final answer with every stage timing and four models' usage.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
from pathlib import Path

from orchestrator.api.admission import AdmissionPool
from orchestrator.api.gateway import Gateway
from orchestrator.api.security import new_token
from thinkserve_bench.machine import machine_facts
from thinkserve_bench.result_files import write_results
from thinkserve_bench.stats import summarize
from thinkserve_bench.timed_calls import time_async_calls
from orchestrator.client import AsyncThinkServeClient
from orchestrator.config import Settings
from orchestrator.server.deployment import running
from orchestrator.observability.metrics import ServiceMetrics
from orchestrator.pipeline.accounting import CostReport, ModelUsage
from orchestrator.pipeline.events import FinalAnswerEvent, Usage
from orchestrator.triton.launcher import TritonServer

NAME = "service_overhead"
SAMPLE = Path("samples/northwind-2024-annual-report.md")
QUESTION = "What was Northwind's total revenue in 2024?"
STAGES = ("route", "embed", "dense", "sparse", "graph", "fusion", "retrieval", "rerank", "context", "answer", "rag_ttft", "total")


def _settings(base: Settings, data_dir: Path, triton_url: str, guarded: bool, grants: list[dict]) -> Settings:
    overrides = {
        "server.port": 0, "http.port": 0, "triton.url": triton_url, "storage.data_dir": str(data_dir),
        "ingest.chunk_tokens": 200, "ingest.chunk_overlap_tokens": 20,
    }
    if guarded:
        overrides["auth.tokens"] = grants
    else:
        overrides |= {"server.max_concurrent_queries": 1024, "server.max_queued_queries": 1024}
    return Settings.load(None, overrides)


async def end_to_end(rounds: int, token_count: int) -> dict:
    grants = []
    for index in range(token_count):  # the client uses the last token: the check walks every digest anyway
        token, digest = new_token()
        grants.append({"name": f"tenant-{index}", "sha256": digest, "collections": ["bench"], "write": True})
    base = Settings()
    results: dict = {}
    with TritonServer(base.triton) as triton, tempfile.TemporaryDirectory(prefix="thinkserve-overhead-") as folder:
        clients = {}
        async with contextlib.AsyncExitStack() as started:
            for name in ("guarded", "open"):
                settings = _settings(base, Path(folder) / name, triton.endpoints.grpc, name == "guarded", grants)
                deployment = await started.enter_async_context(running(settings, progress=lambda _: None))
                clients[name] = AsyncThinkServeClient(deployment.address, timeout_s=60, token=token if name == "guarded" else "")
                started.push_async_callback(clients[name].close)
                await clients[name].ingest_file("bench", SAMPLE)
            for request, call in (
                ("retrieve", lambda c: c.retrieve("bench", QUESTION, route="simple", perception="off")),
                ("get_document", lambda c: c.get_document("bench", SAMPLE.name)),
            ):
                samples = {name: [] for name in clients}
                for _ in range(10):  # warm-up
                    for client in clients.values():
                        await call(client)
                for _ in range(rounds):
                    for name, client in clients.items():  # alternating: drift hits both sides alike
                        started = time.perf_counter()
                        await call(client)
                        samples[name].append(time.perf_counter() - started)
                summaries = {name: summarize(values) for name, values in samples.items()}
                results[request] = {
                    **summaries,
                    "p50_difference_ms": summaries["guarded"]["p50_ms"] - summaries["open"]["p50_ms"],
                    "p50_ratio": summaries["guarded"]["p50_ms"] / summaries["open"]["p50_ms"],
                }
    return results


async def in_process(rounds: int, token_count: int) -> dict:
    grants = []
    for index in range(token_count):
        token, digest = new_token()
        grants.append({"name": f"tenant-{index}", "sha256": digest, "collections": ["bench"]})
    settings = Settings.load(None, {"auth.tokens": grants})
    metrics = ServiceMetrics()
    gateway = Gateway(settings, pipeline=None, metrics=metrics)
    pool: AdmissionPool = gateway.admission.queries
    usage = tuple(ModelUsage(m, "answer", 1, 8, 120, 0, 3.0) for m in ("text_embedder", "reranker", "vlm_relevance", "llm"))
    final = FinalAnswerEvent(
        text="x", citations=(), finish_reason="extracted", answer_source="extractive",
        timings_ms={stage: 1.0 for stage in STAGES}, usage=Usage(4, 0, 0), cost=CostReport(usage, 12.0, 3.0),
    )
    header = f"Bearer {token}"

    async def one() -> None:
        async with gateway.call("Query", header, "bench-request", 10.0) as call:
            async with gateway._admitted(pool, call):
                metrics.query_done("simple", final)

    return summarize(await time_async_calls(one, rounds, warmup=200))


def markdown(payload: dict, command: str) -> str:
    e2e, local = payload["end_to_end"], payload["in_process"]
    lines = [
        "# Service overhead: auth, admission and metrics",
        "",
        f"Command: `{command}`",
        f"Machine: {payload['machine']['cpu']}, {payload['machine']['logical_cores']} cores, GPU: {payload['machine']['gpu']}.",
        f"Load average (1/5/15 min) before / after: {' '.join(f'{v:.1f}' for v in payload['load_average_before_after'][0])} / "
        f"{' '.join(f'{v:.1f}' for v in payload['load_average_before_after'][1])} (other work shares the 2 cores).",
        f"{payload['tokens']} token grants configured on the guarded side; {payload['rounds']} requests per side, alternating.",
        "",
        "| request | open p50 ms | guarded p50 ms | difference p50 ms | ratio | open p95 ms | guarded p95 ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for request, figures in e2e.items():
        lines.append(
            f"| {request} | {figures['open']['p50_ms']:.2f} | {figures['guarded']['p50_ms']:.2f} | "
            f"{figures['p50_difference_ms']:+.3f} | {figures['p50_ratio']:.3f} | {figures['open']['p95_ms']:.2f} | "
            f"{figures['guarded']['p95_ms']:.2f} |"
        )
    lines += [
        "",
        f"In process, the gateway's own work per query (call context with the token check, admission slot, request and "
        f"query metrics): p50 {local['p50_ms'] * 1000:.0f} us, p95 {local['p95_ms'] * 1000:.0f} us, p99 {local['p99_ms'] * 1000:.0f} us "
        f"over {local['count']} calls.",
        "",
        "Both deployments record metrics (they cannot be switched off); the in-process figure is what all three cost together.",
    ]
    return "\n".join(lines) + "\n"


def declare_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--tokens", type=int, default=100, help="token grants configured on the guarded side")


def run_benchmark(args: argparse.Namespace, command: str) -> int:
    load_before = os.getloadavg()
    payload = {
        "machine": machine_facts(),
        "rounds": args.rounds,
        "tokens": args.tokens,
        "in_process": asyncio.run(in_process(max(args.rounds, 2000), args.tokens)),
        "end_to_end": asyncio.run(end_to_end(args.rounds, args.tokens)),
    }
    payload["load_average_before_after"] = [load_before, os.getloadavg()]
    json_path, md_path = write_results(NAME, payload, markdown(payload, command.strip()))
    print(md_path.read_text())
    return 0
