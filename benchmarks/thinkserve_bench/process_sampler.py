"""Resident memory, open file descriptors and threads of a deployment's processes, read from /proc (Linux).

A soak run samples the orchestrators, tritonserver and each python-backend stub (one per model instance) by
process id, so a leak shows against the process that has it. Standard library only: nothing here may perturb
what it measures (no psutil's caches, no subprocess per sample).
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Optional

_STUB_MODEL = re.compile(r"/([^/]+)/\d+/model\.py")
_SHM_PREFIX = re.compile(r"shm-region-prefix-name=([^\s,]+)")


@dataclass(frozen=True)
class ProcessSample:
    pid: int
    name: str  # comm
    rss_kib: int
    fds: int
    threads: int

    def as_dict(self) -> dict:
        return asdict(self)


def sample(pid: int) -> Optional[ProcessSample]:
    """One process's figures; None when it has gone (or is a zombie without its memory)."""
    base = Path(f"/proc/{pid}")
    try:
        status = (base / "status").read_text()
        fds = len(os.listdir(base / "fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss = fields.get("VmRSS", "0 kB").split()[0]
    return ProcessSample(pid, fields.get("Name", "").strip(), int(rss), fds, int(fields.get("Threads", "0")))


def children(pid: int) -> list[int]:
    """Direct children, from every thread's children list (a child belongs to the thread that forked it)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return found
    for task in tasks:
        try:
            found += [int(p) for p in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return sorted(set(found))


def descendants(pid: int) -> list[int]:
    out, stack = [], children(pid)
    while stack:
        child = stack.pop()
        out.append(child)
        stack += children(child)
    return out


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\x00", b" ").decode(errors="replace").strip()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def stub_model(pid: int) -> str:
    """The model a python-backend stub serves (from the model.py path on its command line), else ''."""
    found = _STUB_MODEL.search(command_line(pid))
    return found.group(1) if found else ""


def shm_prefix(triton_pid: int) -> str:
    """The /dev/shm region prefix a tritonserver was started with (the launcher gives each server its own)."""
    found = _SHM_PREFIX.search(command_line(triton_pid))
    return found.group(1) if found else ""


def shm_bytes(prefix: str, folder: Path = Path("/dev/shm")) -> int:
    """Bytes of the shared-memory regions of one Triton (python backend: grows to ~2x the largest tensor)."""
    if not prefix:
        return 0
    total = 0
    for entry in os.scandir(folder):
        if entry.name.startswith(prefix):
            try:
                total += entry.stat().st_size
            except FileNotFoundError:
                continue
    return total


def folder_bytes(folder: Path) -> int:
    """Bytes of every file under a folder (a data folder that only grows would show here)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue
    return total


def triton_of(orchestrator_pid: int) -> Optional[int]:
    """The tritonserver an orchestrator launched (its child), None when it uses another's."""
    return next((p for p in children(orchestrator_pid) if (s := sample(p)) and s.name == "tritonserver"), None)


def total(samples: Iterable[Optional[ProcessSample]]) -> dict:
    present = [s for s in samples if s is not None]
    return {"processes": len(present), "rss_kib": sum(s.rss_kib for s in present), "fds": sum(s.fds for s in present),
            "threads": sum(s.threads for s in present)}
