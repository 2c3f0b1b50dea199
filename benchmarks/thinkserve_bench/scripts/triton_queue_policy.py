"""Bursts of concurrent requests to one model served twice by the same tritonserver: with a queue policy (the
bound and timeout the build wrote before: thinkserve_bench.variants.OLD_QUEUE_POLICY) and
without one (what it writes now).

    thinkserve-bench triton_queue_policy [--repository model_repository/tiny] [--bursts 80] [--concurrency 4 8 16]
        [--name triton_queue_policy] [--output DIR]

Why: any queue-policy field turns off the dynamic batcher's prefetching in tritonserver 2.51 (its PriorityQueue's
support_prefetching_); the batcher then waits for a free instance and a wake-up that is sometimes lost, so some
requests of a burst wait its 500 ms idle timeout. The model is `text_embedder_encode` (one onnxruntime call per
batch), fed pre-tokenised rows of 16 positions. A burst: `concurrency` requests of one row at once, then a 50 ms
pause; the copies alternate burst by burst. Reported per copy and concurrency: the slowest request of each burst
(p50 / p90 / max), how many bursts had a request over 300 ms, and the mean request latency.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from google.protobuf import text_format

from orchestrator.config import TritonSettings
from orchestrator.triton.client import TritonClient
from orchestrator.triton.launcher import TritonServer
from thinkserve_bench.gpu.served_models import read_config, renamed_copy
from thinkserve_bench.machine import machine_facts
from thinkserve_bench.result_files import RESULTS, uncommitted_changes, write_and_show
from thinkserve_bench.stats import percentile
from thinkserve_bench.variants import OLD_QUEUE_POLICY as POLICY, add_old_queue_policy

MODEL = "text_embedder_encode"
COPIES = ("with_policy", "without_policy")
STALLED_MS = 300.0
POSITIONS = 16


def serve_copies(repository: Path, destination: Path) -> None:
    """The model twice: `with_policy` carries POLICY (timeouts rejected), `without_policy` none."""
    for copy in COPIES:
        renamed_copy(repository, MODEL, destination, copy, {})
        config = read_config(destination, copy)
        config.dynamic_batching.ClearField("default_queue_policy")
        if copy == "with_policy":
            add_old_queue_policy(config)
        (destination / copy / "config.pbtxt").write_text(text_format.MessageToString(config))


def row(index: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(index)
    return {
        "input_ids": rng.integers(1000, 2000, size=(1, POSITIONS), dtype=np.int64),
        "attention_mask": np.ones((1, POSITIONS), dtype=np.int64),
        "token_type_ids": np.zeros((1, POSITIONS), dtype=np.int64),
    }


async def burst(client: TritonClient, model: str, concurrency: int, first: int) -> list[float]:
    async def one(index: int) -> float:
        started = time.monotonic()
        await client.infer(model, row(index), ["embedding"])
        return (time.monotonic() - started) * 1000

    return list(await asyncio.gather(*(one(first + i) for i in range(concurrency))))


async def measure(endpoint: str, options) -> dict:
    levels = []
    async with TritonClient(endpoint, default_timeout_s=60) as client:
        for copy in COPIES:  # warm-up
            await burst(client, copy, 4, 0)
        for concurrency in options.concurrency:
            slowest: dict[str, list[float]] = {copy: [] for copy in COPIES}
            every: dict[str, list[float]] = {copy: [] for copy in COPIES}
            for number in range(options.bursts):
                order = COPIES if number % 2 == 0 else tuple(reversed(COPIES))
                for copy in order:
                    latencies = await burst(client, copy, concurrency, number * concurrency)
                    slowest[copy].append(max(latencies))
                    every[copy] += latencies
                    await asyncio.sleep(0.05)
            level = {"concurrency": concurrency}
            for copy in COPIES:
                level[copy] = {
                    "bursts": len(slowest[copy]),
                    "slowest_p50_ms": percentile(slowest[copy], 50), "slowest_p90_ms": percentile(slowest[copy], 90),
                    "slowest_max_ms": max(slowest[copy]),
                    "stalled_bursts": sum(ms > STALLED_MS for ms in slowest[copy]),
                    "mean_ms": statistics.fmean(every[copy]),
                }
            levels.append(level)
            print(f"concurrency {concurrency} done", file=sys.stderr)
    return {"levels": levels}


def report(payload: dict) -> str:
    machine, options = payload["machine"], payload["options"]
    lines = [
        "# Triton's queue policy and bursts of concurrent requests",
        "",
        f"Machine: {machine['cpu']}, {machine['logical_cores']} logical cores, GPU {machine['gpu']}; commit "
        f"{machine['git_commit']}{' (uncommitted changes)' if payload['uncommitted'] else ''}  ",
        f"Model: `{options['repository']}/{MODEL}` served twice by one tritonserver: `with_policy` "
        f"(max_queue_size {POLICY['max_queue_size']}, default timeout {POLICY['default_timeout_microseconds'] // 1000} ms, "
        "timeout override allowed: the build's policy before) and `without_policy`; dynamic batching as built.  ",
        f"A burst: that many one-row requests ({POSITIONS} positions) at once; {options['bursts']} bursts per copy and "
        "level, the copies alternating.  ",
        f"Command: `{payload['command']}`",
        "",
        "| concurrency | copy | slowest of a burst p50 / p90 / max ms | bursts with a request > 300 ms | mean request ms |",
        "|---:|---|---:|---:|---:|",
    ]
    for level in payload["result"]["levels"]:
        for copy in COPIES:
            s = level[copy]
            lines.append(f"| {level['concurrency']} | {copy} | {s['slowest_p50_ms']:,.1f} / {s['slowest_p90_ms']:,.1f} / "
                         f"{s['slowest_max_ms']:,.1f} | {s['stalled_bursts']} of {s['bursts']} | {s['mean_ms']:,.1f} |")
    return "\n".join(lines) + "\n"


def declare_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repository", type=Path, default=Path("model_repository/tiny"))
    parser.add_argument("--bursts", type=int, default=80)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--name", default="triton_queue_policy")
    parser.add_argument("--output", type=Path, default=RESULTS / "triton_queue_policy")
    parser.add_argument("--model-environment", type=Path, default=Path(".venv-triton"))


def run_benchmark(options: argparse.Namespace, command: str) -> None:
    with tempfile.TemporaryDirectory(prefix="triton-queue-policy-") as folder:
        repository = Path(folder) / "repository"
        repository.mkdir()
        serve_copies(options.repository, repository)
        settings = TritonSettings(model_repository=repository, model_environment=options.model_environment, log_dir=Path(folder))
        with TritonServer(settings, required=()) as server:
            result = asyncio.run(measure(server.endpoints.grpc, options))
    payload = {
        "command": command,
        "machine": machine_facts(),
        "uncommitted": uncommitted_changes(),
        "options": {**vars(options), **{key: str(getattr(options, key)) for key in ("repository", "model_environment", "output")}},
        "result": result,
    }
    write_and_show(options.name, payload, report(payload), options.output)
