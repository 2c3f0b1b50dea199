"""Recovery after Triton is killed: kill -9 of tritonserver, and of one model's python stub, under steady load.

    thinkserve-bench triton_recovery [--server-kills 5] [--stub-kills 3] [--rate 2] [--deadline 10]

A real deployment (the tiny profile, its whole model repository, launched and supervised by the orchestrator
as `serve` does) answers the sample report's questions at a steady open-loop rate (`rate` queries per second,
each with its own `deadline`, whether or not earlier ones have finished, so failing fast does not change the
load). Then, `server-kills` times, tritonserver is killed with SIGKILL; and `stub-kills` times each, the python
stub of the reranker's model (an optional stage: answers degrade) and of the text embedder's encoder (a
mandatory one: queries fail) is killed.

Reported per kill: the time from the kill to the supervisor noticing it, to Triton (or the model) being
ready again, and to the first query answered in full after it; every request that ended after the kill, by
outcome (answered, answered degraded, answered in lexical mode because the question could not be embedded, or
the gRPC status it failed with) and the share answered at all; and that no request outlived its deadline.
p50 / max over the repeats. `--no-lexical-fallback` runs the server as it was before lexical mode
(retrieval.lexical_fallback off: without the embedder a query fails), for the comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import grpc
import numpy as np

from thinkserve_bench.machine import machine_facts
from thinkserve_bench.result_files import invocation, write_results
from orchestrator.client import AsyncThinkServeClient
from orchestrator.config import Settings
from orchestrator.server.deployment import Deployment, running

NAME = "triton_recovery"
SAMPLE = Path("samples/northwind-2024-annual-report.md")
QUESTIONS = [line.strip() for line in Path("samples/questions.txt").read_text().splitlines() if line.strip()]
ANSWERED = ("answered", "degraded", "lexical")  # the outcomes that gave the user an answer
STUB_MODELS = {"reranker_score": "reranker (optional stage)", "text_embedder_encode": "text embedder (mandatory)"}


@dataclass(frozen=True)
class Request:
    started: float  # seconds since the kill (negative: before it)
    seconds: float
    outcome: str  # answered | degraded | lexical | the gRPC status name
    detail: str = ""

    @property
    def ended(self) -> float:
        return self.started + self.seconds


class Load:
    """Open-loop queries at a fixed rate, each its own task, all recorded relative to `origin`."""

    def __init__(self, client: AsyncThinkServeClient, rate: float):
        self.client, self.rate = client, rate
        self.origin = time.monotonic()
        self.requests: list[Request] = []
        self._tasks: set[asyncio.Task] = set()
        self._runner: Optional[asyncio.Task] = None

    def start(self) -> None:
        self._runner = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._runner.cancel()
        await asyncio.gather(self._runner, return_exceptions=True)
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _run(self) -> None:
        number = 0
        began = time.monotonic()
        while True:
            task = asyncio.create_task(self._query(QUESTIONS[number % len(QUESTIONS)]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            number += 1
            await asyncio.sleep(max(0.0, began + number / self.rate - time.monotonic()))

    async def _query(self, question: str) -> None:
        started = time.monotonic()
        try:
            final = None
            async for event in self.client.query("bench", question):
                if event.WhichOneof("event") == "final":
                    final = event.final
            outcome = "lexical" if final.retrieval_mode == "lexical" else "degraded" if final.degraded else "answered"
            detail = final.degraded_reason
        except grpc.aio.AioRpcError as error:
            outcome, detail = error.code().name, error.details() or ""
        self.requests.append(Request(started - self.origin, time.monotonic() - started, outcome, detail[:300]))

    def since(self, moment: float) -> list[Request]:
        return [r for r in self.requests if r.ended >= moment - self.origin]


async def wait_until(condition, timeout_s: float, poll_s: float = 0.02) -> Optional[float]:
    """Monotonic time at which `condition()` first held, or None after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return time.monotonic()
        await asyncio.sleep(poll_s)
    return None


def first_success_after(load: Load, killed: float) -> Optional[Request]:
    """The first query that started after the kill and was answered without degradation."""
    good = [r for r in load.requests if r.started >= killed - load.origin and r.outcome == "answered"]
    return min(good, key=lambda r: r.ended) if good else None


def account(load: Load, killed: float, until: float, deadline_s: float) -> dict:
    """Requests that ended between the kill and `until` (the first success + the settle time)."""
    ended = [r for r in load.requests if killed - load.origin <= r.ended <= until - load.origin]
    failures = Counter(r.outcome for r in ended if r.outcome not in ANSWERED)
    examples = {}
    for r in ended:
        if r.outcome != "answered":
            examples.setdefault(r.outcome, r.detail)
    return {
        "requests": len(ended),
        "answered": sum(r.outcome == "answered" for r in ended),
        "degraded": sum(r.outcome == "degraded" for r in ended),
        "lexical": sum(r.outcome == "lexical" for r in ended),
        "answered_share": sum(r.outcome in ANSWERED for r in ended) / len(ended) if ended else None,
        "failed": dict(failures),
        "examples": examples,
        "longest_s": max((r.seconds for r in ended), default=0.0),
        "over_deadline": sum(r.seconds > deadline_s + 1.0 for r in ended),
    }


async def server_kill(deployment: Deployment, load: Load, deadline_s: float, settle_s: float) -> dict:
    supervisor, triton = deployment.supervisor, deployment.triton
    restarts = supervisor.status().restarts
    killed = time.monotonic()
    os.kill(triton.pid, signal.SIGKILL)
    noticed = await wait_until(lambda: not supervisor.status().triton_ready, 30, 0.005)
    ready = await wait_until(lambda: supervisor.status().restarts > restarts, 120)
    served = await wait_until(lambda: first_success_after(load, killed) is not None, 120)
    first = first_success_after(load, killed)
    await asyncio.sleep(settle_s)
    result = {
        "noticed_s": noticed - killed if noticed else None,
        "triton_ready_s": ready - killed if ready else None,
        "first_success_s": first.ended - (killed - load.origin) if first else None,
        "first_success_started_s": first.started - (killed - load.origin) if first else None,
        "supervisor_restart_s": supervisor.status().last_restart_s,
        "outcomes": account(load, killed, (served or time.monotonic()) + settle_s, deadline_s),
    }
    print(f"  server kill: ready {result['triton_ready_s']:.2f} s, first success {result['first_success_s']:.2f} s, "
          f"{result['outcomes']['failed']}", flush=True)
    return result


async def stub_kill(deployment: Deployment, load: Load, model: str, deadline_s: float, settle_s: float) -> dict:
    supervisor = deployment.supervisor
    reloads = supervisor.status().reloads_by_model.get(model, 0)
    (stub,) = [s for s in deployment.triton.stub_processes() if s.model == model]
    killed = time.monotonic()
    os.kill(stub.pid, signal.SIGKILL)
    reloaded = await wait_until(lambda: supervisor.status().reloads_by_model.get(model, 0) > reloads, 120)
    served = await wait_until(lambda: first_success_after(load, killed) is not None, 120)
    first = first_success_after(load, killed)
    await asyncio.sleep(settle_s)
    result = {
        "model": model,
        "reloaded_s": reloaded - killed if reloaded else None,
        "reload_duration_s": supervisor.status().last_reload_s,
        "first_success_s": first.ended - (killed - load.origin) if first else None,
        "outcomes": account(load, killed, (served or time.monotonic()) + settle_s, deadline_s),
    }
    print(f"  stub kill {model}: reloaded {result['reloaded_s']:.2f} s, {result['outcomes']['degraded']} degraded, "
          f"{result['outcomes']['failed']}", flush=True)
    return result


def _spread(values: list[Optional[float]]) -> dict:
    present = [v for v in values if v is not None]
    if not present:
        return {"count": 0}
    return {"count": len(present), "p50_s": float(np.median(present)), "max_s": float(max(present)), "min_s": float(min(present))}


async def run(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="thinkserve-recovery-") as folder:
        settings = Settings.load(None, {
            "server.port": 0,
            "storage.data_dir": str(Path(folder) / "data"),
            "triton.log_dir": str(Path(folder) / "logs"),
            "ingest.chunk_tokens": 200,
            "ingest.chunk_overlap_tokens": 20,
            "retrieval.lexical_fallback": args.lexical_fallback,
            **({"http.port": 0} if "http" in Settings.model_fields else {}),
        })
        started = time.monotonic()
        async with running(settings, lambda message: print(f"* {message}", flush=True)) as deployment:
            start_s = time.monotonic() - started
            async with AsyncThinkServeClient(deployment.address, timeout_s=args.deadline) as client:
                await client.ingest("bench", SAMPLE.read_bytes(), SAMPLE.name)
                load = Load(client, args.rate)
                load.start()
                await asyncio.sleep(args.warmup)
                server_kills, stub_kills = [], []
                for number in range(args.server_kills):
                    print(f"* server kill {number + 1}/{args.server_kills}", flush=True)
                    server_kills.append(await server_kill(deployment, load, args.deadline, args.settle))
                for model in STUB_MODELS:
                    for number in range(args.stub_kills):
                        print(f"* stub kill {model} {number + 1}/{args.stub_kills}", flush=True)
                        stub_kills.append(await stub_kill(deployment, load, model, args.deadline, args.settle))
                await load.stop()
    return {
        "triton_start_s": start_s,
        "requests_total": len(load.requests),
        "answered_latency_p50_s": float(np.median([r.seconds for r in load.requests if r.outcome == "answered"])),
        "hung": sum(r.seconds > args.deadline + 1.0 for r in load.requests),
        "answered_share_after_kills": _share([k["outcomes"] for k in server_kills + stub_kills]),
        "answered_share_after_server_kills": _share([k["outcomes"] for k in server_kills]),
        "server_kills": server_kills,
        "stub_kills": stub_kills,
        "summary": {
            "server": {
                key: _spread([k[key] for k in server_kills])
                for key in ("noticed_s", "triton_ready_s", "first_success_s", "supervisor_restart_s")
            },
            **{
                f"stub {model}": {
                    key: _spread([k[key] for k in stub_kills if k["model"] == model])
                    for key in ("reloaded_s", "reload_duration_s", "first_success_s")
                }
                for model in STUB_MODELS
            },
        },
    }


def _share(outcomes: list[dict]) -> Optional[float]:
    """Answered (in any mode) over all requests that ended in the kills' windows."""
    requests = sum(o["requests"] for o in outcomes)
    return sum(o["answered"] + o["degraded"] + o["lexical"] for o in outcomes) / requests if requests else None


def _percent(share: Optional[float]) -> str:
    return f"{share:.0%}" if share is not None else "n/a"


def _fmt(spread: dict) -> str:
    return f"{spread['p50_s']:.2f} / {spread['max_s']:.2f}" if spread.get("count") else "n/a"


def markdown(command: str, machine: dict, args, results: dict) -> str:
    s = results["summary"]
    lines = [
        "# Recovery after Triton is killed",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine['cpu']}, {machine['logical_cores']} logical cores, {machine['memory_gib']} GiB, GPU: {machine['gpu']}  ",
        f"Commit: {machine['git_commit']} (results committed with the code that produced them)  ",
        f"Load average before / after (other work shares the 2 cores): "
        f"{' '.join(f'{v:.1f}' for v in results['machine_load']['before_1m_5m_15m'])} / "
        f"{' '.join(f'{v:.1f}' for v in results['machine_load']['after_1m_5m_15m'])}",
        "",
        f"The tiny profile's whole model repository, launched and supervised by the deployment (Triton ready in "
        f"{results['triton_start_s']:.1f} s at start-up). Steady open-loop load of {args.rate:g} queries/s on the sample "
        f"report (tiny defaults: features router, reranker, extractive answer), each with a {args.deadline:g} s "
        f"deadline; answered queries took {results['answered_latency_p50_s'] * 1000:.0f} ms p50. "
        f"{results['requests_total']} requests in all, **{results['hung']} outlived their deadline**. Lexical mode "
        f"(retrieval.lexical_fallback) {'on' if args.lexical_fallback else '**off**'}: of the requests that ended in the "
        f"kills' windows, **{_percent(results['answered_share_after_kills'])} were answered** "
        f"({_percent(results['answered_share_after_server_kills'])} through the kills of tritonserver).",
        "",
        "## kill -9 of tritonserver",
        "",
        f"{len(results['server_kills'])} kills. Times from the kill, p50 / max in seconds:",
        "",
        "| supervisor noticed | Triton ready again (same ports) | first full answer ended | restart, noticed to ready |",
        "|---:|---:|---:|---:|",
        f"| {_fmt(s['server']['noticed_s'])} | {_fmt(s['server']['triton_ready_s'])} | "
        f"**{_fmt(s['server']['first_success_s'])}** | {_fmt(s['server']['supervisor_restart_s'])} |",
        "",
        "Per kill (requests that ended between the kill and the first full answer + settle time; lexical: answered in "
        "lexical mode, the question not embedded):",
        "",
        "| # | ready s | first full answer s | requests | answered | degraded | lexical | failed (status: count) | answered share | longest s |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for number, k in enumerate(results["server_kills"], 1):
        o = k["outcomes"]
        failed = ", ".join(f"{code}: {count}" for code, count in sorted(o["failed"].items())) or "none"
        lines.append(
            f"| {number} | {k['triton_ready_s']:.2f} | {k['first_success_s']:.2f} | {o['requests']} | {o['answered']} | "
            f"{o['degraded']} | {o['lexical']} | {failed} | {_percent(o['answered_share'])} | {o['longest_s']:.2f} |"
        )
    examples = {code: text for k in results["server_kills"] for code, text in k["outcomes"]["examples"].items()}
    if examples:
        lines += ["", "Messages seen:", ""] + [f"- {code}: `{text}`" for code, text in sorted(examples.items())]
    lines += [
        "",
        "## kill -9 of one model's python stub",
        "",
        "A dead stub leaves its model READY in Triton while every request to it fails; the supervisor sees the "
        "stub gone from Triton's process group and reloads the model (unload + load). p50 / max in seconds:",
        "",
        "| model | kills | reloaded (from the kill) | the reload itself | first full answer ended |",
        "|---|---:|---:|---:|---:|",
    ]
    for model, label in STUB_MODELS.items():
        m = s[f"stub {model}"]
        lines.append(
            f"| {model}: {label} | {m['reloaded_s']['count']} | {_fmt(m['reloaded_s'])} | {_fmt(m['reload_duration_s'])} | "
            f"{_fmt(m['first_success_s'])} |"
        )
    lines += ["", "| model | # | requests | answered | degraded | lexical | failed (status: count) | answered share |",
              "|---|---:|---:|---:|---:|---:|---|---:|"]
    counters: dict[str, int] = {}
    for k in results["stub_kills"]:
        counters[k["model"]] = counters.get(k["model"], 0) + 1
        o = k["outcomes"]
        failed = ", ".join(f"{code}: {count}" for code, count in sorted(o["failed"].items())) or "none"
        lines.append(f"| {k['model']} | {counters[k['model']]} | {o['requests']} | {o['answered']} | {o['degraded']} | "
                     f"{o['lexical']} | {failed} | {_percent(o['answered_share'])} |")
    examples = {f"{k['model']} {code}": text for k in results["stub_kills"] for code, text in k["outcomes"]["examples"].items()}
    if examples:
        lines += ["", "Messages seen:", ""] + [f"- {code}: `{text}`" for code, text in sorted(examples.items())]
    lines.append("")
    return "\n".join(lines)


def declare_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server-kills", type=int, default=5)
    parser.add_argument("--stub-kills", type=int, default=3, help="per model")
    parser.add_argument("--rate", type=float, default=0.5, help="queries per second (open loop), well below capacity")
    parser.add_argument("--deadline", type=float, default=10.0, help="each query's deadline, seconds")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of load before the first kill")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds of load after each recovery")
    parser.add_argument("--lexical-fallback", action=argparse.BooleanOptionalAction, default=True,
                        help="retrieval.lexical_fallback (off: the server as before lexical mode, for the comparison)")
    parser.add_argument("--name", default=NAME, help="result file name")


def run_benchmark(args: argparse.Namespace, command: str) -> None:
    command = invocation(NAME, [
        f"--{k.replace('_', '-')}" if v is True else f"--no-{k.replace('_', '-')}" if v is False else f"--{k.replace('_', '-')} {v}"
        for k, v in vars(args).items()])
    machine = machine_facts()
    load_before = os.getloadavg()
    results = asyncio.run(run(args))
    results["machine_load"] = {"before_1m_5m_15m": load_before, "after_1m_5m_15m": os.getloadavg()}
    payload = {"command": command, "machine": machine, "results": results}
    json_path, md_path = write_results(args.name, payload, markdown(command, machine, args, results))
    print(md_path.read_text())
    print(f"results: {json_path}, {md_path}")
