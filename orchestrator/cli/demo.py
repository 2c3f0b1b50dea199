"""The demo: start Triton and the orchestrator, ingest the bundled sample over gRPC, ask its questions, stop."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from ..client import AsyncThinkServeClient
from ..config import Settings
from ..server.deployment import Deployment
from ..client.presentation import QueryPrinter

DEMO_COLLECTION = "demo"


# Profiles whose LLM reads (trained weights): each answer is shown beside the other answerers' of these.
READING_LLM = {"offline": "SmolLM2-135M-Instruct"}
COMPARED = ("extractive", "hybrid")


async def _answer_beside(client: AsyncThinkServeClient, question: str, answerer: str) -> None:
    """The same question with another answerer, in one line: its text, what it cites, how long it took."""
    started = time.monotonic()
    final = None
    async for event in client.query(DEMO_COLLECTION, question, answerer=answerer):
        if event.WhichOneof("event") == "final":
            final = event.final
    if final is None:
        return
    cites = ", ".join(f"[{c.evidence_rank}] p.{c.page + 1}" if c.page >= 0 else f"[{c.evidence_rank}]" for c in final.citations)
    print(f"   {answerer} answer ({final.answer_source}, {time.monotonic() - started:.1f} s): {' '.join(final.text.split())}"
          + (f"  cites {cites}" if cites else ""))


async def run_demo(settings: Settings, samples: list[Path], questions_file: Path) -> int:
    questions = [line.strip() for line in questions_file.read_text().splitlines() if line.strip()]
    with tempfile.TemporaryDirectory(prefix="thinkserve-demo-") as data_dir:
        return await _run(_demo_settings(settings, Path(data_dir)), samples, questions)


def _demo_settings(settings: Settings, data_dir: Path) -> Settings:
    """Free ports (a running `thinkserve serve` is not disturbed) and a throw-away data folder."""
    return settings.scratch(data_dir)


async def _run(settings: Settings, samples: list[Path], questions: list[str]) -> int:
    started = time.monotonic()
    deployment = Deployment(settings)
    address = await deployment.start(progress=lambda message: print(f"* {message}", flush=True))
    print(f"* up in {time.monotonic() - started:.1f}s")
    try:
        async with AsyncThinkServeClient(address) as client:
            health = await client.health()
            print(f"* health: serving={health.serving}, {sum(m.ready for m in health.models)}/{len(health.models)} models ready, profile {health.profile}")
            for sample in samples:
                report = await client.ingest_file(DEMO_COLLECTION, sample)
                state = "already indexed" if report.already_present else f"{report.passages} passages indexed in {report.seconds:.2f}s"
                print(f"* ingested {sample.name}: {state}")
            if settings.profile == "tiny":
                print(
                    "* tiny profile: the embedder is the real all-MiniLM-L6-v2, so retrieval and the extractive answers\n"
                    "  (evidence sentences chosen with it, cited) are real; the router, reranker, VLM and LLM have random\n"
                    "  weights, so routes come from the question's features and the reranker, having no say, is not called.\n"
                    "  `thinkserve ask --answerer llm --router model ...` runs the random LLM and router: noise output."
                )
            beside = tuple(a for a in COMPARED if a != settings.answer.answerer) if settings.profile in READING_LLM else ()
            if beside:
                print(f"* {settings.profile} profile: the LLM is {READING_LLM[settings.profile]} (trained, small); each answer is\n"
                      f"  followed by the {' and '.join(beside)} answer to the same question, to compare them.")
            for question in questions:
                printer = QueryPrinter(question)
                async for event in client.query(DEMO_COLLECTION, question):
                    printer.handle(event)
                for answerer in beside:
                    await _answer_beside(client, question, answerer)
    finally:
        stopped = time.monotonic()
        await deployment.stop()
        print(f"\n* stopped cleanly in {time.monotonic() - stopped:.1f}s")
    return 0
