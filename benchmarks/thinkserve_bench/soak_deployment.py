"""The deployment a soak runs against, as an operator runs it: `thinkserve serve` (the writer, with the Triton it
launches and supervises) and `thinkserve serve --read-only` (a replica following the writer's data folder,
using the writer's Triton), each a process of its own, started from this checkout.

Separate processes, not the benchmark's own interpreter, so that the memory, descriptors and threads sampled
are the server's alone, and so that the replica follows the writer through the data folder only, as replicas do.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

from orchestrator.errors import ConfigurationError

from .process_sampler import triton_of

START_TIMEOUT_S = 300.0
STOP_GRACE_S = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    """One `serve` process: its addresses, its process id, and its output (kept in a log file)."""

    role: str
    process: subprocess.Popen
    address: str
    http: str
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclass
class SoakDeployment:
    writer: Server
    replica: Server
    triton_url: str
    data_dir: Path

    @property
    def triton_pid(self) -> Optional[int]:
        return triton_of(self.writer.pid)


def _wait_serving(server: Server, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise ConfigurationError(f"the {server.role} exited with {server.process.returncode} before serving: "
                                     f"{_tail(server.log)}")
        if any(line.startswith("serving") for line in server.log.read_text(errors="replace").splitlines()):
            return
        time.sleep(0.2)
    raise ConfigurationError(f"the {server.role} did not start within {timeout_s:.0f} s: {_tail(server.log)}")


def _tail(log: Path, lines: int = 15) -> str:
    try:
        return " | ".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def _start(role: str, global_args: list[str], serve_args: list[str], environment: dict[str, str], log: Path,
           root: Path) -> Server:
    grpc_port, http_port = int(environment["THINKSERVE_SERVER__PORT"]), int(environment["THINKSERVE_HTTP__PORT"])
    output = log.open("w")
    process = subprocess.Popen(
        [sys.executable, "-u", "-m", "orchestrator", *global_args, "serve", *serve_args], cwd=root, env=environment,
        stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
    )
    output.close()
    return Server(role, process, f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{http_port}", log)


def _stop(server: Server) -> None:
    """SIGTERM (drains), then SIGKILL of the process group after the grace."""
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
            server.process.wait(10)


@contextlib.contextmanager
def soak_deployment(work: Path, global_args: list[str], follow_interval_s: float = 1.0,
                    progress: Callable[[str], None] = print, root: Optional[Path] = None) -> Iterator[SoakDeployment]:
    """A writer (launching its Triton) and a read replica on the same data folder and Triton; both stopped after."""
    root = root or Path.cwd()
    data_dir, logs = work / "data", work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    triton_port = free_port()
    common = {
        **os.environ, "THINKSERVE_STORAGE__DATA_DIR": str(data_dir), "THINKSERVE_TRITON__LOG_DIR": str(logs),
        "THINKSERVE_STORAGE__FOLLOW_INTERVAL_S": str(follow_interval_s), "PYTHONUNBUFFERED": "1",
    }
    writer_env = {**common, "THINKSERVE_SERVER__PORT": str(free_port()), "THINKSERVE_HTTP__PORT": str(free_port()),
                  "THINKSERVE_TRITON__GRPC_PORT": str(triton_port)}
    triton_url = f"127.0.0.1:{triton_port}"
    progress("starting the writer (`serve`, launching Triton) ...")
    writer = _start("writer", global_args, [], writer_env, logs / "writer.log", root)
    replica: Optional[Server] = None
    try:
        _wait_serving(writer, START_TIMEOUT_S)
        progress(f"writer serving at {writer.address} (pid {writer.pid}), Triton {triton_url}; starting the read replica ...")
        replica_env = {**common, "THINKSERVE_SERVER__PORT": str(free_port()), "THINKSERVE_HTTP__PORT": str(free_port())}
        replica = _start("replica", global_args, ["--read-only", "--triton-url", triton_url], replica_env,
                         logs / "replica.log", root)
        _wait_serving(replica, START_TIMEOUT_S)
        progress(f"replica serving at {replica.address} (pid {replica.pid})")
        yield SoakDeployment(writer, replica, triton_url, data_dir)
    finally:
        stop_servers(replica, writer)


def stop_servers(*servers: Optional[Server]) -> None:
    """Stop these servers in this order (the replica first: it uses the writer's Triton); None is skipped."""
    for server in servers:
        if server is not None:
            _stop(server)
