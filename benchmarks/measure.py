"""Measurement helpers shared by the benchmarks: raw-sample statistics, machine facts, result files.

Percentiles always come from raw samples (never averages of averages); clocks are monotonic; warm-up
iterations are run and discarded before any sample is kept.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Awaitable, Callable

import numpy as np

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
    cpu = platform.processor() or ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    gpu = "none"
    if shutil.which("nvidia-smi"):
        gpu = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip() or "none"
    versions = {}
    for package in ("onnxruntime", "numpy", "tritonclient", "grpcio", "faiss-cpu", "torch", "transformers"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {
        "cpu": cpu,
        "logical_cores": os.cpu_count(),
        "memory_gib": round(memory_gib, 1),
        "gpu": gpu,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": versions,
        "git_commit": commit,
    }


def write_results(name: str, payload: dict, markdown: str, directory: Path = RESULTS) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    json_path, md_path = directory / f"{name}.json", directory / f"{name}.md"
    json_path.write_text(json.dumps(payload, indent=2) + "\n")
    md_path.write_text(markdown)
    return json_path, md_path
