"""Starting and stopping a real tritonserver on loopback, cleanly.

What this guards against (each seen with Triton 2.51 on CPU machines):
- a port conflict only shows after every model loaded, and meanwhile the OTHER server answers on that port:
  readiness is accepted only from a server reporting our own --id;
- an open client stream blocks shutdown forever: after the exit timeout the whole process group is killed;
- a killed server leaves its stubs running, /dev/shm regions and /tmp/python_env_* folders behind: the
  process group is always killed at the end and both are removed;
- stubs orphaned by a killed server would become zombies of PID 1, which in a container may never reap them:
  the launching process makes itself their subreaper and reaps them;
- a server that died is restarted on the SAME ports (`restart()`), so clients' channels reconnect to the same
  address without being rebuilt; the dead server's stubs, regions and folders are removed first;
- a launching process killed without stopping the server (SIGKILL, the OOM killer) would leave it and its stubs
  running in their own session: a watchdog beside the server ends them when this process is gone (watchdog.py).
The python-backend stubs are listed with the model each serves (`stub_processes()`), so a supervisor can tell
a model whose stub died: Triton keeps such a model READY while every request to it fails.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..config import TritonSettings
from ..errors import TritonSetupError
from ..models.contracts import ModelContract, all_contracts
from .installation import ModelEnvironment, TritonInstallation, check_repository, repository_uses_gpu

LOOPBACK = "127.0.0.1"
PYTHON_ENV_GLOB = "/tmp/python_env_*"  # the python backend ignores TMPDIR for these
# Error lines every CPU-only server logs at start-up: never the cause of a failure.
HARMLESS_ERRORS = ("CudaDriverHelper has not been initialized", "CUDA driver version is insufficient", "CUDA memory pool disabled")


@dataclass(frozen=True)
class TritonEndpoints:
    grpc: str  # host:port
    http: str  # http://host:port
    metrics: str  # http://host:port/metrics


@dataclass(frozen=True)
class StubProcess:
    """A live python-backend stub: one model instance in its own process."""

    pid: int
    model: str  # the model whose model.py it runs (for an ensemble: the composing model)
    instance: str  # Triton's instance name, as in "Stub process '<instance>' is not healthy"


STUB_BINARY = "triton_python_backend_stub"


class TritonServer:
    """One tritonserver process with the project's model repository. Use as a context manager."""

    def __init__(self, settings: TritonSettings, required: tuple[ModelContract, ...] = all_contracts()):
        self.settings = settings
        self.required = required
        self.server_id = _new_server_id()
        self.log_path: Optional[Path] = None
        self.endpoints: Optional[TritonEndpoints] = None
        self._process: Optional[subprocess.Popen] = None
        self._watchdog: Optional[tuple[subprocess.Popen, int]] = None  # watchdog.py and our end of its pipe
        self._runtime_dir: Optional[Path] = None
        self._backends: Optional[Path] = None  # --backend-directory, chosen at start() and kept by restart()
        self._env_dirs_before: set[str] = set()
        self._env_dirs_ours: set[str] = set()
        self._abort = threading.Event()

    @property
    def shm_prefix(self) -> str:
        return f"{self.server_id}-"

    @property
    def pid(self) -> Optional[int]:
        return self._process.pid if self._process else None

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def exit_description(self) -> str:
        """How the server process ended ("killed by SIGKILL", "exited with status 1"), or "running"."""
        if self._process is None:
            return "not started"
        code = self._process.poll()
        if code is None:
            return "running"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
            return f"killed by signal {-code}"
        return f"exited with status {code}"

    def stub_processes(self) -> list[StubProcess]:
        """The live python-backend stubs of this server, each with its model (read from /proc: the stubs are in
        the server's process group; argv[1] is <repository>/<model>/<version>/model.py, argv[8] the instance).
        A stub that died is absent (a zombie has no command line left)."""
        if self._process is None:
            return []
        stubs = []
        for pid in _group_members(self._process.pid) - {self._process.pid}:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    argv = handle.read().decode(errors="replace").split("\0")
            except OSError:
                continue
            if len(argv) < 2 or not argv[0].endswith(STUB_BINARY):
                continue
            model = Path(argv[1]).parent.parent.name
            stubs.append(StubProcess(pid, model, argv[8] if len(argv) > 8 and argv[8] else model))
        return sorted(stubs, key=lambda stub: stub.instance)

    def abort_start(self) -> None:
        """Make a start() or restart() waiting for readiness in another thread give up (the deployment stops);
        restarts stay refused until the next start()."""
        self._abort.set()

    def __enter__(self) -> "TritonServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> TritonEndpoints:
        self._abort.clear()
        settings = self.settings
        installation = TritonInstallation.locate(settings.install_root)
        environment = ModelEnvironment.inspect(settings.model_environment)
        check_repository(settings.model_repository, self.required, installation, environment)
        self._runtime_dir = Path(tempfile.mkdtemp(prefix="thinkserve-triton-"))
        try:
            # the wheel's python backend assembled in the runtime folder, or a container's own backends/
            self._backends = installation.backend_directory(self._runtime_dir / "backends", environment.python_version)
            automatic = not (settings.grpc_port or settings.http_port or settings.metrics_port)
            for attempt in range(3):
                ports = self._ports()
                try:
                    self._launch(installation, environment, self._backends, ports)
                    return self.endpoints
                except _PortRace:
                    self.stop(_keep_runtime_dir=True)
                    if not automatic or attempt == 2:
                        raise TritonSetupError(
                            f"another server answered on Triton's ports {ports} while ours started: a port is taken"
                        ) from None
        except BaseException:
            self.stop()
            raise
        raise AssertionError("unreachable")

    def restart(self) -> TritonEndpoints:
        """Start the server again after it died (or to replace a stuck one), on the same ports, so that clients
        reconnect to the address they already have. The old process group is killed (SIGKILL: a server being
        replaced is dead or stuck) and reaped, and its /dev/shm regions and /tmp/python_env_* folders are
        removed before the new server starts."""
        if self.endpoints is None or self._runtime_dir is None or self._backends is None:
            raise TritonSetupError("Triton cannot be restarted: it was never started")
        ports = {
            "grpc_port": int(self.endpoints.grpc.rsplit(":", 1)[1]),
            "http_port": int(self.endpoints.http.rsplit(":", 1)[1]),
            "metrics_port": int(self.endpoints.metrics.rsplit(":", 1)[1].split("/")[0]),
        }
        self.stop(_keep_runtime_dir=True, _graceful=False)
        if self._abort.is_set():
            raise TritonSetupError("Triton's restart was abandoned: the deployment is stopping")
        installation = TritonInstallation.locate(self.settings.install_root)
        environment = ModelEnvironment.inspect(self.settings.model_environment)
        self.server_id = _new_server_id()  # a new --id: readiness must come from the new server
        try:
            # No free-port check: the dead server's connections in TIME_WAIT make a plain bind() fail, while
            # Triton binds with SO_REUSEADDR; a port really taken shows as _PortRace or as a start-up error.
            self._launch(installation, environment, self._backends, ports)
        except _PortRace:
            self.stop(_keep_runtime_dir=True, _graceful=False)
            raise TritonSetupError(f"another server answers on Triton's ports {ports}: cannot restart on them") from None
        except BaseException:
            self.stop(_keep_runtime_dir=True, _graceful=False)  # a half-started replacement: nothing to drain
            raise
        return self.endpoints

    def _ports(self) -> dict[str, int]:
        ports = {}
        for name in ("grpc_port", "http_port", "metrics_port"):
            port = getattr(self.settings, name)
            if port and not _port_free(port):
                raise TritonSetupError(f"port {port} (triton.{name}) on {LOOPBACK} is already in use")
            ports[name] = port or _free_port(exclude=set(ports.values()))
        return ports

    def _launch(self, installation, environment: ModelEnvironment, backends: Path, ports: dict[str, int]) -> None:
        settings = self.settings
        settings.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = settings.log_dir / f"triton-{self.server_id}.log"
        command = [
            str(installation.server_binary),
            f"--model-repository={settings.model_repository.absolute()}",
            f"--backend-directory={backends}",
            "--model-control-mode=explicit",
            "--load-model=*",
            f"--id={self.server_id}",
            f"--http-address={LOOPBACK}",
            f"--grpc-address={LOOPBACK}",
            f"--metrics-address={LOOPBACK}",
            f"--http-port={ports['http_port']}",
            f"--grpc-port={ports['grpc_port']}",
            f"--metrics-port={ports['metrics_port']}",
            *gpu_flags(repository_uses_gpu(settings.model_repository)),
            "--metrics-interval-ms=100",  # the 2000 ms default delays shutdown by up to 2 s
            f"--exit-timeout-secs={settings.exit_timeout_s}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            f"--log-verbose={settings.log_verbose}",
        ]
        env = dict(os.environ)
        # The stub finds its interpreter's prefix through `python3` on PATH (PYTHON* variables are ignored), and
        # must load that interpreter's own libpython, not a system one of another patch version.
        env["PATH"] = f"{environment.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [environment.libdir, env.get("LD_LIBRARY_PATH")]))
        env.pop("VIRTUAL_ENV", None)
        self._env_dirs_before = set(glob.glob(PYTHON_ENV_GLOB))
        _become_subreaper()
        with open(self.log_path, "wb") as log:
            self._process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
            )
        self._watchdog = _start_watchdog(self._process.pid, self.shm_prefix, settings.exit_timeout_s)
        self.endpoints = TritonEndpoints(
            grpc=f"{LOOPBACK}:{ports['grpc_port']}",
            http=f"http://{LOOPBACK}:{ports['http_port']}",
            metrics=f"http://{LOOPBACK}:{ports['metrics_port']}/metrics",
        )
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.settings.startup_timeout_s
        while time.monotonic() < deadline:
            self._env_dirs_ours |= set(glob.glob(PYTHON_ENV_GLOB)) - self._env_dirs_before
            if self._process.poll() is not None:
                raise TritonSetupError(f"Triton exited during start-up: {self.failure_reason()}")
            if self._abort.is_set():
                raise TritonSetupError("Triton's start-up was abandoned: the deployment is stopping")
            name = _server_name(self.endpoints.http)
            if name is not None and name != self.server_id:
                raise _PortRace()
            if name == self.server_id and _http_ok(f"{self.endpoints.http}/v2/health/ready"):
                return
            time.sleep(0.2)
        raise TritonSetupError(
            f"Triton was not ready after {self.settings.startup_timeout_s:.0f}s (log: {self.log_path}): "
            f"{self.failure_reason()}"
        )

    def failure_reason(self, errors_only: bool = False) -> str:
        """The most telling line of the server log, for a one-line error. errors_only: an error line or none
        ("no error logged"), for a server killed by a signal, whose last log line tells nothing."""
        if not self.log_path or not self.log_path.exists():
            return "no log"
        lines = self.log_path.read_text(errors="replace").splitlines()
        errors = [line for line in lines if line.startswith("E") and not any(h in line for h in HARMLESS_ERRORS)]
        chosen = next((entry for entry in errors if "failed to load" in entry), None) or (errors[-1] if errors else None)
        if chosen is None and errors_only:
            return f"no error logged (log: {self.log_path})"
        if chosen is None:
            chosen = next((entry for entry in reversed(lines) if entry.strip()), "empty log")
        message = re.sub(r"^[EWI]\d{4} [\d:.]+ \d+ \S+\] ", "", chosen).strip().strip('"')
        message = message.split("\\n")[0].split(" At:")[0]
        return message[:400] + f" (log: {self.log_path})"

    def stop(self, _keep_runtime_dir: bool = False, _graceful: bool = True) -> None:
        """Graceful stop, bounded: SIGTERM, wait the exit timeout, then SIGKILL the whole process group."""
        process, self._process = self._process, None
        if process is not None:
            stubs = _group_members(process.pid) - {process.pid}
            if process.poll() is None and _graceful:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=self.settings.exit_timeout_s + 5)
                except subprocess.TimeoutExpired:
                    pass
            with contextlib.suppress(ProcessLookupError, PermissionError):  # stubs outlive a killed or hung server
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            for pid in stubs:
                with contextlib.suppress(ChildProcessError):  # ours only when we are their subreaper
                    os.waitpid(pid, 0)
            self._remove_leftovers()
        self._stop_watchdog()
        if self._runtime_dir and not _keep_runtime_dir:
            shutil.rmtree(self._runtime_dir, ignore_errors=True)
            self._runtime_dir = self._backends = None

    def _stop_watchdog(self) -> None:
        """Close our end of the watchdog's pipe once the server is gone: it finds nothing left and exits."""
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            process, pipe = watchdog
            os.close(pipe)
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _remove_leftovers(self) -> None:
        for region in glob.glob(f"/dev/shm/{self.shm_prefix}*"):
            with contextlib.suppress(ProcessLookupError, FileNotFoundError, PermissionError):
                os.unlink(region)
        for folder in self._env_dirs_ours:
            shutil.rmtree(folder, ignore_errors=True)
        self._env_dirs_ours = set()


class _PortRace(Exception):
    """Another server answers on a port we chose."""


def _new_server_id() -> str:
    return f"thinkserve-{os.getpid()}-{secrets.token_hex(3)}"


def _start_watchdog(group: int, shm_prefix: str, grace_s: float) -> tuple[subprocess.Popen, int]:
    """watchdog.py beside the server (see it for why), in a session of its own so that whatever kills this
    process's group spares it; its stdin is a pipe whose write end, returned, only this process holds (pipes
    are not inherited by other children). -I: nothing from the environment or the script's folder is imported."""
    read_end, write_end = os.pipe()
    try:
        process = subprocess.Popen(
            [sys.executable, "-I", str(Path(__file__).with_name("watchdog.py")), str(group), shm_prefix, str(grace_s)],
            stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return process, write_end


def _become_subreaper() -> None:
    """Orphaned descendants (stubs of a killed server) are re-parented to this process, which reaps them."""
    if sys.platform.startswith("linux"):
        pr_set_child_subreaper = 36
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, 1, 0, 0, 0)


def _group_members(pgid: int) -> set[int]:
    """Processes of a process group, read from /proc (the server and its stubs)."""
    members = set()
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after "(comm)": state, ppid, pgrp, ...
            members.add(int(stat.split("/")[2]))
    return members


def gpu_flags(uses_gpu: bool) -> list[str]:
    """A repository with GPU models gets Triton's GPU metrics (utilisation, memory, power: the scrape and the dashboard
    read them) and its default pinned host memory pool (staging of tensors between host and device); on the CPU
    both are off (no GPU to read, and nothing to stage)."""
    if uses_gpu:
        return ["--allow-gpu-metrics=true"]
    return ["--allow-gpu-metrics=false", "--pinned-memory-pool-byte-size=0"]


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((LOOPBACK, port))
            return True
        except OSError:
            return False


def _free_port(exclude: set[int]) -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((LOOPBACK, 0))
            port = probe.getsockname()[1]
        if port not in exclude:
            return port


def _server_name(http: str) -> Optional[str]:
    try:
        with urllib.request.urlopen(f"{http}/v2", timeout=1) as response:
            return json.loads(response.read()).get("name")
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False
