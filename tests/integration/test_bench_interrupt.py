"""Ctrl-C during a `thinkserve-bench` run that started its own deployment: the command stops with status 130
and leaves no tritonserver behind (Triton runs in a session of its own, so only an orderly stop ends it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import SAMPLE_DOCUMENT

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _tritonservers_of(deployment_pid: int) -> list[int]:
    """tritonserver processes launched by that deployment process (their --id names its pid)."""
    marker = f"--id=thinkserve-{deployment_pid}-"
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "tritonserver" in command and marker in command:
                found.append(int(entry.name))
    return found


def _lines_until(stream, prefix: str, seconds: float) -> list[str]:
    """A process's output lines up to the first that starts with `prefix` (or until `seconds` have passed)."""
    lines = []
    deadline = time.monotonic() + seconds
    for line in stream:
        lines.append(line)
        if line.startswith(prefix) or time.monotonic() > deadline:
            break
    return lines


def test_ctrl_c_stops_the_bench_and_its_own_deployment(tmp_path):
    command = [sys.executable, "-m", "thinkserve_bench", "latency", "--documents", str(SAMPLE_DOCUMENT),
               "--questions", "2", "--configs", "simple", "--rounds", "200", "--option", "page_images=false",
               "--option", "perception=off", "--out", str(tmp_path), "--no-plots"]
    # a session of its own, like a terminal's foreground job: Ctrl-C is SIGINT to the whole group
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        lines = _lines_until(process.stdout, "latency:", 300)
        assert any(line.startswith("latency:") for line in lines), "".join(lines)
        deployments = _children(process.pid)
        servers = [pid for child in deployments for pid in _tritonservers_of(child)]
        assert servers, f"no tritonserver found for the bench's deployment {deployments}"
        time.sleep(2)  # mid-run: queries in flight
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(timeout=90) == 130
        time.sleep(1)
        assert [pid for child in deployments for pid in _tritonservers_of(child)] == []
        assert not (tmp_path / "bench-latency.json").exists()  # an interrupted run writes no results
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
