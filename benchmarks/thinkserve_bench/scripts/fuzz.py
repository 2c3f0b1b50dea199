"""Thousands of generated hostile requests against a real deployment: every gRPC method (messages generated from
the .proto, and raw bytes that are no message), every HTTP operation of the OpenAPI description (Schemathesis,
valid and invalid by the schema) and hostile files through both upload paths.

    thinkserve-bench fuzz [--grpc 60] [--raw 300] [--rest 60] [--files 1500] [--seed 54]

--grpc: cases per RPC; --raw: raw-bytes cases over the unary RPCs; --rest: cases per HTTP operation and mode
(positive, negative); --files: hostile documents. The deployment (Triton + orchestrator, tiny profile unless
--profile/--config say otherwise) is started here with a 2 MiB upload limit (so oversized files are cheap) and
stopped after. Each case's answer is judged (thinkserve_bench.fuzzing.runner): a result, or a client error that
names its cause; a server error, a hang (no answer within 120 s) or a failed health check (a crash) is a defect.
The report counts cases, answers and defects by surface and family.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.config import Settings
from thinkserve_bench.fuzzing.runner import FileFuzzer, GrpcFuzzer, RestFuzzer, Tally, health_probe
from thinkserve_bench.machine import machine_facts
from thinkserve_bench.result_files import RESULTS, uncommitted_changes, write_results
from thinkserve_bench.target import own_deployment

NAME = "fuzz"
PROBE_COLLECTION = "fuzz-probe-7c1e"  # the health probe's own collection: no generated request names it
PROBE_DOCUMENT = b"# Probe\n\nAcme sold 12 robots in 2024. Bolt Ltd bought three of them."
PROBE_QUESTION = "How many robots did Acme sell?"
UPLOAD_LIMIT = 2 * 1024 * 1024


def fuzz_settings(settings: Settings, data_dir: Path) -> Settings:
    """The deployment under fuzzing: a small upload limit (oversized cases stay cheap), a deep query queue (the
    fuzzer is sequential, but the health probe runs beside it) and short LLM answers."""
    scratch = settings.scratch(data_dir)
    return scratch.model_copy(update={
        "server": scratch.server.model_copy(update={"max_upload_bytes": UPLOAD_LIMIT, "max_queued_queries": 64}),
        "generation": scratch.generation.model_copy(update={"max_tokens_limit": 64}),
    })


def declare_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--grpc", type=int, default=60, help="generated messages per RPC")
    parser.add_argument("--raw", type=int, default=300, help="raw-bytes cases over the unary RPCs")
    parser.add_argument("--rest", type=int, default=60, help="cases per HTTP operation and generation mode")
    parser.add_argument("--files", type=int, default=1500, help="hostile documents")
    parser.add_argument("--seed", type=int, default=54)
    parser.add_argument("--profile", default=None)
    parser.add_argument("--config", type=Path, default=None)
    parser.add_argument("--name", default=NAME)
    parser.add_argument("--output", type=Path, default=RESULTS)


def run_benchmark(args: argparse.Namespace, command: str) -> None:
    overrides = {"profile": args.profile} if args.profile else None
    settings = Settings.load(args.config, overrides)
    tally = Tally()
    seconds: dict[str, float] = {}

    def run(address: str, http: str) -> None:
        from orchestrator.client import ThinkServeClient

        with ThinkServeClient(address, timeout_s=300) as client:
            client.ingest(PROBE_COLLECTION, PROBE_DOCUMENT, "probe.md")
            client.ingest("fuzz", PROBE_DOCUMENT, "fuzz.md")  # the collection the generated requests name most
        health = health_probe(address, PROBE_COLLECTION, PROBE_QUESTION)
        for surface, job in (("grpc", lambda: _grpc(address, tally, health, args)),
                             ("rest", lambda: _rest(http, tally, health, args)),
                             ("files", lambda: _files(address, http, tally, health, args))):
            started = time.monotonic()
            print(f"fuzz: {surface} ...", flush=True)
            job()
            seconds[surface] = time.monotonic() - started
            summary = tally.summary()
            print(f"fuzz: {surface} done in {seconds[surface]:.0f} s; {summary['cases']} cases so far, "
                  f"{summary['defects']} defects, {summary['crashes']} failed health checks", flush=True)
        tally.health_checks += 1
        final = health()
        if final:
            tally.health_failures.append(f"at the end: {final}")

    with tempfile.TemporaryDirectory(prefix="thinkserve-fuzz-") as folder:
        configured = fuzz_settings(settings, Path(folder) / "data")
        asyncio.run(_run_against(configured, run))
    summary = tally.summary()
    result = {
        "benchmark": NAME, "command": command, "machine": machine_facts(),
        "uncommitted_changes": uncommitted_changes(), "seed": args.seed, "upload_limit_bytes": UPLOAD_LIMIT,
        "seconds": seconds, "summary": summary,
    }
    path, md_path = write_results(args.name, result, markdown(result), args.output)
    print(markdown(result))
    print(f"wrote {path} and {md_path}")
    sys.exit(1 if summary["defects"] or summary["crashes"] else 0)


async def _run_against(settings: Settings, run) -> None:
    async with own_deployment(settings, progress=print) as target:
        await asyncio.to_thread(run, target.address, target.http)


def _grpc(address: str, tally: Tally, health, args) -> None:
    fuzzer = GrpcFuzzer(address, tally, health)
    try:
        fuzzer.run(args.grpc, args.seed, args.raw)
    finally:
        fuzzer.close()


def _rest(http: str, tally: Tally, health, args) -> None:
    RestFuzzer(http, tally, health).run(args.rest, args.seed)


def _files(address: str, http: str, tally: Tally, health, args) -> None:
    done = [0]

    def progress(outcome) -> None:
        done[0] += 1
        if done[0] % 100 == 0:
            print(f"fuzz: files {done[0]}/{args.files}", flush=True)

    fuzzer = FileFuzzer(address, http, tally, health, UPLOAD_LIMIT)
    try:
        fuzzer.run(args.files, args.seed, progress)
    finally:
        fuzzer.close()


def markdown(result: dict) -> str:
    summary, machine = result["summary"], result["machine"]
    lines = [
        "# Fuzzing: generated hostile input against a real deployment",
        "",
        f"Command: `{result['command']}`  ",
        f"Machine: {machine['cpu']}, {machine['logical_cores']} logical cores, {machine['memory_gib']} GiB; commit "
        f"{machine.get('git_commit', '')}; seed {result['seed']}; upload limit {result['upload_limit_bytes']:,} bytes",
        "",
        f"**{summary['cases']:,} cases: {summary['server_errors']} server errors, {summary['hangs']} hangs, "
        f"{summary['crashes']} failed health checks (crashes) of {summary['health_checks']}; {summary['defects']} "
        "defects in all.** A case passes with a result or a client error naming its cause (gRPC INVALID_ARGUMENT, "
        "NOT_FOUND, FAILED_PRECONDITION, ...; HTTP 4xx with a message). Every 50 cases, and at the end, Health must "
        "report every model ready and a question must get its answer.",
        "",
        "| surface | cases | answers | defects | hangs | slowest case |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for surface, entry in summary["by_surface"].items():
        answers = ", ".join(f"{k} {v}" for k, v in sorted(entry["answers"].items(), key=lambda kv: -kv[1]))
        lines.append(f"| {surface} | {entry['cases']:,} | {answers} | {entry['defects']} | {entry['hangs']} | "
                     f"{entry['slowest_s']:.1f} s |")
    for surface, entry in summary["by_surface"].items():
        lines += ["", f"{surface}: cases by {'RPC' if surface == 'grpc' else 'operation' if surface == 'rest' else 'family'}: "
                  + ", ".join(f"{k} {v}" for k, v in sorted(entry["families"].items()))]
    if summary["defect_examples"]:
        lines += ["", "Defects (first 50):", ""]
        lines += [f"- {d['surface']} {d['family']}: {d['defect']} ({d['detail'][:160]!r}); case {d['case'][:200]}"
                  for d in summary["defect_examples"]]
    if summary["health_failures"]:
        lines += ["", "Failed health checks:", "", *(f"- {h}" for h in summary["health_failures"])]
    if summary["conformance"]:
        lines += ["", "Schemathesis' conformance checks (the description against the answers; not defects of the "
                  "server's robustness):", ""]
        lines += [f"- {k}: {v}" for k, v in sorted(summary["conformance"].items())]
        lines += ["", "First of each:", "", *(f"- {e}" for e in summary["conformance_examples"])]
    lines += ["", f"Time: {', '.join(f'{k} {v:.0f} s' for k, v in result['seconds'].items())}.", ""]
    return "\n".join(lines)
