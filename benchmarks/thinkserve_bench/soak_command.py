"""`thinkserve-bench soak`: start the writer and the replica, load the corpus, make the questions, run the soak
(modes/soak.py) and write its report (JSON, Markdown, a PNG over time), with a partial report every ten minutes."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from orchestrator.client import AsyncThinkServeClient
from orchestrator.errors import ConfigurationError
from .machine import machine_info
from .modes.soak import ChurnDocuments, SoakPlan, run_soak
from .modes.soak_report import markdown, plot
from .result_files import write
from .soak_deployment import SoakDeployment, soak_deployment, stop_servers
from .target import default_documents, ingest
from .workload import generate_mix, harvest

CHURN_PDF_SEEDS = (101, 202)  # two generated corpora of six one-page reports: twelve PDFs the churn cycles through


def run_soak_mode(args, settings, command: str, bench, options: dict) -> int:
    if args.address:
        raise ConfigurationError("soak starts its own writer and replica (it samples their processes): drop --address")
    plan = SoakPlan(
        duration_s=60 * args.duration_minutes, warmup_s=60 * args.warmup_minutes, rate_qps=args.rate,
        knee_fraction=args.knee_fraction, churn_interval_s=args.churn_interval, churn_slots=args.churn_slots,
        sample_interval_s=args.sample_interval, seed=args.seed, options=options,
    )
    if plan.warmup_s >= plan.duration_s:
        raise ConfigurationError("--warmup-minutes must be shorter than --duration-minutes")
    global_args = [*(["--config", str(args.config)] if args.config else []), *(["--profile", args.profile] if args.profile else [])]
    name = args.name or "bench-soak"
    machine = machine_info(settings, bench)
    with tempfile.TemporaryDirectory(prefix="thinkserve-soak-") as folder:
        work = Path(folder)
        documents = list(args.documents) if args.documents else default_documents(work / "documents")
        churn = ChurnDocuments(_churn_pdfs(work / "churn"))
        with soak_deployment(work, global_args, args.follow_interval) as deployment:
            stop_on_signals(lambda: stop_servers(deployment.replica, deployment.writer))
            payload = asyncio.run(_run(deployment, plan, documents, churn, args, command, machine, name))
    paths = []
    if not args.no_plots:
        payload["plots"] = plot(payload, args.out, name)
        paths += [args.out / p for p in payload["plots"].values()]
    for path in [*write(args.out, name, payload, markdown(payload)), *paths]:
        print(f"wrote {path}")
    return 0


def stop_on_signals(stop: Callable[[], None]) -> None:
    """On SIGTERM or SIGINT, call `stop` (the writer, the replica and their Triton) and end the process; the partial
    report of the last checkpoint stays. Seen before: SIGTERM ended this process at once and left the three running,
    and SIGINT (asyncio cancelling the main task) had not ended an overloaded soak a minute later: the cancelled run
    waits for its load and churn tasks to wind down (queries up to 60 s, an ingest up to 900 s). Leaving through
    asyncio.run would wait likewise, and for ever on a task that outlives its cancellation."""

    def interrupt(signum, frame):
        print(f"soak: stopped by {signal.Signals(signum).name}; stopping the servers ...", file=sys.stderr, flush=True)
        try:
            stop()
        finally:
            os._exit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, interrupt)


def _churn_pdfs(folder: Path) -> list[Path]:
    from .corpora.quality_corpus import write_quality_corpus

    return [path for seed in CHURN_PDF_SEEDS
            for path in write_quality_corpus(folder / str(seed), documents=6, pages=1, seed=seed).files]


async def _run(deployment: SoakDeployment, plan: SoakPlan, documents, churn, args, command: str, machine: dict,
               name: str) -> dict:
    corpus = await ingest(deployment.writer.address, args.collection, documents)
    await _replica_has(deployment.replica.address, args.collection, len(documents))
    async with AsyncThinkServeClient(deployment.writer.address, timeout_s=120) as client:
        passages = await harvest(client, args.collection)
    mix = generate_mix(passages, args.questions, args.seed, args.collection, None)
    corpus["questions"] = len(mix.questions)

    def payload(result: dict) -> dict:
        return {"command": command, "machine": machine, "corpus": corpus, "result": result}

    def checkpoint(result: dict) -> None:
        data = payload(result)
        write(args.out, name, data, markdown(data))

    result = await run_soak(deployment, plan, mix.questions, churn, args.collection, checkpoint=checkpoint)
    return payload(result)


async def _replica_has(address: str, collection: str, documents: int, timeout_s: float = 300.0) -> None:
    """Wait until the replica lists every document of the corpus (it follows the writer's folder)."""
    import grpc

    deadline = time.monotonic() + timeout_s
    async with AsyncThinkServeClient(address, timeout_s=30) as client:
        while time.monotonic() < deadline:
            try:
                if len(await client.list_documents(collection)) >= documents:
                    return
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.NOT_FOUND:
                    raise
            await asyncio.sleep(0.5)
    raise ConfigurationError(f"the replica did not show the {documents} documents within {timeout_s:.0f} s")
