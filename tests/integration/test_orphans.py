"""kill -9 of `thinkserve serve` leaves no Triton behind: the watchdog beside the server (triton/watchdog.py)
ends the server, its stubs and their shared memory once the process that launched them is gone."""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import MODEL_ENVIRONMENT, MODEL_REPOSITORY, ROOT
from tests.integration.test_bench_interrupt import _lines_until, _tritonservers_of

pytestmark = pytest.mark.integration


def _living_members(group: int) -> list[int]:
    """Processes of the group that still run: a zombie has ended. (An orphan is re-parented to the nearest
    subreaper, and a test process that launched a Triton in-process is one: its zombies are reaped here.)"""
    living = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) != group:
            continue
        pid = int(stat.parent.name)
        if fields[0] == "Z":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        else:
            living.append(pid)
    return living


def test_kill_9_of_serve_ends_its_triton_and_every_stub(tmp_path):
    config = tmp_path / "serve.toml"
    config.write_text(
        f'[server]\nport = 0\n[http]\nport = 0\n[storage]\ndata_dir = "{tmp_path / "data"}"\n'
        f'[triton]\nmodel_repository = "{MODEL_REPOSITORY}"\nmodel_environment = "{MODEL_ENVIRONMENT}"\n'
        f'log_dir = "{tmp_path / "logs"}"\nexit_timeout_s = 5\n'
    )
    # a session of its own, as a supervisor would run it: the kill reaches serve's group only
    serve = subprocess.Popen([sys.executable, "-m", "orchestrator", "--config", str(config), "serve"], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        lines = _lines_until(serve.stdout, "serving", 300)
        assert any(line.startswith("serving") for line in lines), "".join(lines)
        servers = _tritonservers_of(serve.pid)
        assert len(servers) == 1, servers
        server = servers[0]  # the leader of its own process group, with its stubs in it
        regions = f"/dev/shm/thinkserve-{serve.pid}-*"  # the stubs' shared memory, named after the server's id
        assert glob.glob(regions)
        assert len(_living_members(server)) > 1  # the server and its stubs

        os.killpg(serve.pid, signal.SIGKILL)  # no orderly stop: serve and its group die at once
        serve.wait(timeout=30)
        deadline = time.monotonic() + 30  # exit_timeout_s (5) for the SIGTERM, then SIGKILL
        while time.monotonic() < deadline and _living_members(server):
            time.sleep(0.2)
        assert _living_members(server) == [], "the server or a stub of it outlived serve"
        assert _tritonservers_of(serve.pid) == []
        assert not glob.glob(regions), "shared-memory regions left"
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)
        for pid in _tritonservers_of(serve.pid):
            os.killpg(pid, signal.SIGKILL)
