"""kill -9 of `thinkserve serve` leaves no Triton behind: the watchdog beside the server (triton/watchdog.py)
ends the server, its stubs and their shared memory once the process that launched them is gone."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import MODEL_ENVIRONMENT, MODEL_REPOSITORY, ROOT
from tests.integration.test_bench_interrupt import _lines_until, _tritonservers_of

pytestmark = pytest.mark.integration


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


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
        assert len(subprocess.run(["pgrep", "-g", str(server)], capture_output=True, text=True).stdout.split()) > 1

        os.killpg(serve.pid, signal.SIGKILL)  # no orderly stop: serve and its group die at once
        serve.wait(timeout=30)
        deadline = time.monotonic() + 30  # exit_timeout_s (5) for the SIGTERM, then SIGKILL
        while time.monotonic() < deadline and _group_alive(server):
            time.sleep(0.2)
        assert not _group_alive(server), "the server or a stub of it outlived serve"
        assert _tritonservers_of(serve.pid) == []
        assert not glob.glob(regions), "shared-memory regions left"
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)
        for pid in _tritonservers_of(serve.pid):
            os.killpg(pid, signal.SIGKILL)
