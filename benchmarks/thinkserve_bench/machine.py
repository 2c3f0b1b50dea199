"""The facts of the machine a benchmark ran on (CPU, cores, memory, GPU, load, versions, commit), recorded in every
result file. Standard library only: the GPU runner reads them on a machine with none of the project's packages."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.config import Settings

    from .prices import BenchSettings

PACKAGES = ("thinkserve", "grpcio", "protobuf", "tritonclient", "nvidia-pytriton", "numpy", "onnxruntime", "faiss-cpu",
            "torch", "transformers", "matplotlib")


def machine_facts() -> dict:
    """CPU, cores, memory, GPU, load, versions and commit of the machine a benchmark runs on."""
    cpu = platform.processor() or ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = "none"
    if shutil.which("nvidia-smi"):
        gpu = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip() or "none"
    versions = {}
    for package in PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {
        "cpu": cpu,
        "logical_cores": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "gpu": gpu,
        "load_average": os.getloadavg(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": versions,
        "git_commit": git_commit(),
    }


def git_commit() -> str:
    """The checkout's short commit; empty outside a git checkout or without git (the GPU machine's copied tree)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def machine_info(settings: "Settings", bench: "BenchSettings") -> dict:
    """The machine's facts, plus the profile and a hash of the deployment and bench settings (`thinkserve-bench`)."""
    from .prices import config_hash

    return {**machine_facts(), "profile": settings.profile, "config_hash": config_hash(settings, bench)}
