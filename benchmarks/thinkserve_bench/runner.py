"""One benchmark run: open the target, build the workload, run the mode, write JSON + Markdown (+ PNG plots)."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import grpc

from orchestrator.config import Settings
from orchestrator.errors import ThinkServeError
from .prices import BenchSettings
from .machine import machine_info
from .mode_reports import cost_markdown, latency_markdown, load_markdown
from .result_files import write
from .session import BenchSession
from .target import Target, open_target
from .workload import Mix, WorkloadQuestion, generate_mix, harvest, load_jsonl, write_jsonl


@dataclass
class Run:
    mode: str
    settings: Settings
    bench: BenchSettings
    collection: str = "bench"
    address: str = ""
    triton_url: str = ""
    token: str = ""
    documents: Optional[Sequence[Path]] = None
    workload: Optional[Path] = None
    questions: int = 24
    seed: int = 7
    mix: Optional[dict[str, float]] = None
    options: dict[str, Any] = field(default_factory=dict)
    rounds: int = 1
    concurrency: Optional[Sequence[int]] = None
    qps: Optional[Sequence[float]] = None
    open_loop: bool = True
    ceiling: bool = True
    ablations: Optional[Sequence[str]] = None
    configs: Optional[Sequence[str]] = None  # latency: which of its configurations (default: all)
    out: Path = Path("benchmarks/results/bench")
    name: str = ""
    plots: bool = True
    out_file: Optional[Path] = None
    command: str = ""
    progress: Callable[[str], None] = print

    int8_repository: Optional[Path] = None  # ablations: the int8-embedder build (default: built when missing)
    throughput_concurrency: int = 4  # ablations: closed-loop windows of the deployment variants (0: none)
    variants: dict = field(default_factory=dict)  # ablations: label -> (Target, VariantRepository, corpus), set by execute

    async def execute(self) -> list[Path]:
        import tempfile

        from .target import default_documents
        from .variants import variant_targets, wanted_variants

        wanted = wanted_variants(self.mode, self.ablations)
        if not wanted or self.address:
            async with open_target(self.address, self.triton_url, self.settings, self.collection, self.documents, self.progress,
                                   self.token) as (target, corpus):
                return await self.against(target, corpus)
        # deployment variants: the same documents for the baseline's deployment and each variant's
        with tempfile.TemporaryDirectory(prefix="thinkserve-bench-variants-") as folder:
            work = Path(folder)
            documents = list(self.documents) if self.documents else default_documents(work / "documents")
            async with open_target("", "", self.settings, self.collection, documents, self.progress) as (target, corpus):
                async with variant_targets(self.settings, wanted, documents, self.collection, work, self.int8_repository,
                                           self.progress) as variants:
                    self.variants = variants
                    return await self.against(target, corpus)

    async def against(self, target: Target, corpus: dict) -> list[Path]:
        """Run the mode against a target that is already up and loaded (the tests call this directly)."""
        machine = machine_info(self.settings, self.bench)
        async with BenchSession(target, self.bench, self.collection, self.progress) as session:
            questions, workload = await self.build_workload(session)
            if self.mode == "workload":
                path = write_jsonl(self.out_file or self.out / f"{self.name}.jsonl", questions)
                return [path]
            started = time.monotonic()
            result = await self.dispatch(session, questions)
            result["seconds"] = time.monotonic() - started
        payload = {
            "command": self.command,
            "machine": machine,
            "target": ("started by the command (child process)" if target.own else target.address),
            "target_triton": bool(target.triton_url),
            "corpus": corpus,
            "workload": workload,
            "bench": self.bench.model_dump(mode="json"),
            "options": self.options,
            "result": result,
        }
        paths: list[Path] = []
        if self.plots:
            from .plots import plot

            payload["plots"] = plot(self.mode, payload, self.out, self.name)
            paths += [self.out / p for p in payload["plots"].values()]
        markdown = MARKDOWN[self.mode](payload)
        return [*write(self.out, self.name, payload, markdown), *paths]

    async def build_workload(self, session: BenchSession) -> tuple[list[WorkloadQuestion], dict]:
        if self.workload is not None:
            questions = load_jsonl(self.workload, self.collection)
            return questions, {"source": str(self.workload), "questions": len(questions),
                               "description": f"{len(questions)} questions replayed from {self.workload.name}"}
        passages = await harvest(session.client, self.collection)
        mix: Mix = generate_mix(passages, self.questions, self.seed, self.collection, self.mix)
        described = ", ".join(f"{k} {v}" for k, v in mix.produced.items() if v)
        substituted = f"; made as lookups for lack of material: {mix.substituted}" if mix.substituted else ""
        return mix.questions, {
            "source": "generated", **mix.describe(),
            "description": f"{len(mix.questions)} generated questions (seed {self.seed}, from {mix.passages} passages of "
                           f"collection `{self.collection}`): {described}{substituted}",
            "questions_text": [q.model_dump(mode="json") for q in mix.questions],
        }

    async def dispatch(self, session: BenchSession, questions: list[WorkloadQuestion]) -> dict:
        if self.mode == "latency":
            from .modes.latency import CONFIGS, run_latency

            chosen = {name: CONFIGS[name] for name in (self.configs or CONFIGS)}
            return await run_latency(session, questions, chosen, self.rounds, self.options)
        if self.mode == "cost":
            from .modes.cost import run_cost

            return await run_cost(session, questions, self.rounds, self.options)
        if self.mode == "load":
            from .modes.load import run_load

            result = await run_load(session, questions, self.options, self.concurrency, self.qps, self.seed, self.open_loop)
            if self.ceiling and session.triton is not None:
                from .modes.ceiling import compare, run_ceiling

                # swept on its own until it saturates, at least up to the end-to-end best level
                best = result["best_closed_loop"]["concurrency"]
                try:
                    ceiling = await run_ceiling(session, questions, self.options, reach=best, pair_with=best)
                    result["ceiling"] = compare(result, ceiling)
                except (ThinkServeError, grpc.aio.AioRpcError) as error:  # the sweep's results stand on their own
                    session.progress(f"ceiling: failed, the load results are kept: {error}")
                    result["ceiling"] = {"error": f"{type(error).__name__}: {error}"}
            return result
        if self.mode == "ceiling":
            from .modes.ceiling import run_ceiling

            return await run_ceiling(session, questions, self.options, self.concurrency)
        if self.mode == "ablations":
            from .modes.ablations import run_ablations

            async with contextlib.AsyncExitStack() as stack:
                sessions, notes = {}, {}
                for label, (target, repository, corpus) in self.variants.items():
                    sessions[label] = await stack.enter_async_context(BenchSession(target, self.bench, self.collection, self.progress))
                    notes[label] = {"repository": repository.source, "models_changed": list(repository.changed), "corpus": corpus}
                if "int8 embedder" in self.variants and session.triton is not None:
                    from .variants import embedding_agreement

                    texts = [q.question for q in questions] + await _evidence_texts(session, questions[:4])
                    notes["int8 embedder"]["embedding_agreement"] = await embedding_agreement(
                        session.target.triton_url, self.variants["int8 embedder"][0].triton_url, texts)
                return await run_ablations(session, questions, self.rounds, self.options, self.ablations, sessions, notes,
                                           self.throughput_concurrency)
        raise ValueError(f"unknown mode {self.mode}")


async def _evidence_texts(session: BenchSession, questions: Sequence[WorkloadQuestion]) -> list[str]:
    """The evidence texts a few questions retrieve (passages of the collection, to compare embeddings on)."""
    texts: list[str] = []
    for question in questions:
        async for event in session.client.query(question.collection or session.collection, question.question,
                                                route="simple", page_images=False, perception="off"):
            if event.WhichOneof("event") == "evidence":
                texts += [item.text for item in event.evidence.items if item.text]
    return list(dict.fromkeys(texts))


def _ceiling_markdown(payload: dict) -> str:
    from .modes.ceiling import markdown

    return markdown(payload)


def _ablations_markdown(payload: dict) -> str:
    from .modes.ablations import markdown

    return markdown(payload)


MARKDOWN = {"latency": latency_markdown, "cost": cost_markdown, "load": load_markdown, "ceiling": _ceiling_markdown,
            "ablations": _ablations_markdown}
