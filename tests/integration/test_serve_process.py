"""`thinkserve serve` as an operator runs it: configured from the environment (THINKSERVE_SECTION__KEY, grants
from a mounted tokens file), and killed with SIGKILL it leaves no Triton behind: the watchdog beside the server
(triton/watchdog.py) ends the server, its stubs and their shared memory once serve is gone."""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from orchestrator.api.security import new_token
from orchestrator.client import ThinkServeClient
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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_serve_configured_from_the_environment_and_killed_with_sigkill_leaves_nothing(tmp_path):
    token, digest = new_token()
    secret = tmp_path / "tokens.toml"  # what a container mounts as a secret
    secret.write_text(f'[[tokens]]\nname = "ops"\nsha256 = "{digest}"\nwrite = true\n')
    port = _free_port()
    environment = {
        **os.environ,  # no settings file at all: a container's environment
        "THINKSERVE_SERVER__PORT": str(port), "THINKSERVE_HTTP__PORT": "0",
        "THINKSERVE_STORAGE__DATA_DIR": str(tmp_path / "data"), "THINKSERVE_AUTH__TOKENS_FILE": str(secret),
        "THINKSERVE_TRITON__MODEL_REPOSITORY": str(MODEL_REPOSITORY),
        "THINKSERVE_TRITON__MODEL_ENVIRONMENT": str(MODEL_ENVIRONMENT),
        "THINKSERVE_TRITON__LOG_DIR": str(tmp_path / "logs"), "THINKSERVE_TRITON__EXIT_TIMEOUT_S": "5",
    }
    # a session of its own, as a supervisor would run it: the kill reaches serve's group only
    serve = subprocess.Popen([sys.executable, "-m", "orchestrator", "serve"], cwd=ROOT, env=environment,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        lines = _lines_until(serve.stdout, "serving", 300)
        assert any(line.startswith("serving") for line in lines), "".join(lines)
        with ThinkServeClient(f"127.0.0.1:{port}", token=token) as operator:  # the port and the grant came from the environment
            operator.create_collection("ops")
            assert [c.name for c in operator.list_collections()] == ["ops"]
        with ThinkServeClient(f"127.0.0.1:{port}") as anonymous, pytest.raises(grpc.RpcError) as refused:
            anonymous.list_collections()
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
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
