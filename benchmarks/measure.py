"""Measurement helpers shared by the benchmarks: raw-sample statistics, machine facts, result files.

Percentiles always come from raw samples (never averages of averages); clocks are monotonic; warm-up
iterations are run and discarded before any sample is kept.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Awaitable, Callable

import numpy as np

from orchestrator.bench.report import machine_facts

RESULTS = Path(__file__).parent / "results"


def summarize(samples_s: list[float], items_per_sample: int = 1) -> dict:
    samples = np.asarray(samples_s, dtype=np.float64) * 1000.0
    return {
        "count": int(samples.size),
        "mean_ms": float(samples.mean()),
        "p50_ms": float(np.percentile(samples, 50)),
        "p90_ms": float(np.percentile(samples, 90)),
        "p95_ms": float(np.percentile(samples, 95)),
        "p99_ms": float(np.percentile(samples, 99)),
        "min_ms": float(samples.min()),
        "max_ms": float(samples.max()),
        # throughput of a closed loop with one request in flight: items done / time spent
        "items_per_s": float(items_per_sample * samples.size / (samples.sum() / 1000.0)),
    }


def time_calls(call: Callable[[], object], repeat: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return samples


async def time_async_calls(call: Callable[[], Awaitable[object]], repeat: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        await call()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - started)
    return samples


def machine_info() -> dict:
    """CPU, cores, memory, GPU, versions and commit: the same facts `thinkserve bench` reports."""
    return machine_facts()


def write_results(name: str, payload: dict, markdown: str, directory: Path = RESULTS) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    json_path, md_path = directory / f"{name}.json", directory / f"{name}.md"
    json_path.write_text(json.dumps(payload, indent=2) + "\n")
    md_path.write_text(markdown)
    return json_path, md_path


def write_and_show(name: str, payload: dict, markdown: str, directory: Path) -> None:
    """Write the results, print the report, and say on stderr where the files went."""
    paths = write_results(name, payload, markdown, directory)
    print(markdown)
    print(f"written: {', '.join(map(str, paths))}", file=sys.stderr)


def uncommitted_changes() -> list[str]:
    """Tracked files that differ from the commit in machine_info (others may be editing the code measured)."""
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    return status.stdout.splitlines()


def invocation(name: str, argv: list[str]) -> str:
    """How benchmark `name` was run, as typed from the repository root (interpreter path and PYTHONPATH included)."""
    interpreter = Path(sys.executable)
    if interpreter.is_relative_to(Path.cwd()):
        interpreter = interpreter.relative_to(Path.cwd())
    prefix = f"PYTHONPATH={os.environ['PYTHONPATH']} " if os.environ.get("PYTHONPATH") else ""
    return f"{prefix}{interpreter} -m benchmarks.{name} {' '.join(argv)}".strip()
