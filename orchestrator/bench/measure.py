"""Measurement helpers of the checkout's benchmark scripts (benchmarks/): timed calls, raw-sample summaries,
machine facts, result files and how a run was invoked.

Percentiles always come from raw samples (never averages of averages; stats.py computes them, for `thinkserve
bench` too); clocks are monotonic; warm-up iterations are run and discarded before any sample is kept.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Awaitable, Callable

from .report import machine_facts, write
from .stats import distribution

RESULTS = Path("benchmarks/results")  # the scripts run from the checkout's root


def summarize(samples_s: list[float], items_per_sample: int = 1) -> dict:
    """stats.distribution of the samples in milliseconds, and the throughput of a closed loop with one request
    in flight: items done / time spent."""
    samples_ms = [s * 1000.0 for s in samples_s]
    return {**distribution(samples_ms), "items_per_s": items_per_sample * len(samples_s) / sum(samples_s)}


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
    return write(directory, name, payload, markdown)


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
