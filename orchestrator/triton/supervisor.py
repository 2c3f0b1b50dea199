"""Keeps the deployment's own Triton serving: restarts a server that died, reloads a model whose stub died.

Why a supervisor: Triton does not restart itself, and a python-backend stub killed (OOM killer, crash, kill -9)
leaves its model READY in Triton while every request to it fails with "Stub process '<instance>' is not
healthy"; nothing brings it back but an unload and a load of that model. Without this, one crash would turn a
running deployment into one that answers UNAVAILABLE until someone restarts it by hand.

Every `triton.supervise_interval_s` the supervisor
- restarts the server if its process is gone (TritonServer.restart: same ports, so the orchestrator's client
  channel reconnects by itself; leftovers of the dead server are removed), with a doubling pause between failed
  attempts, each logged with its cause (the exit status and the log's telling line);
- compares the live python-backend stubs with those it saw before (the stubs are the server's process group;
  each one's command line names its model and instance) and reloads a model whose stub disappeared;
- is also told of calls that failed with "Stub process ... is not healthy" (a listener on the client), which
  catches a stub that hangs rather than dies, and wakes up at once to check (a failed call that started before
  the model's last reload or the server's last restart is old news and ignored). A model's remaining stubs are
  killed before it is reloaded: Triton leaves a hung one running beside its replacement.
A reload that fails is tried again after a doubling pause (the models that were serving, an ensemble that went
down with its composing model included, are all brought back); a reload Triton does not finish within
`triton.reload_timeout_s` means its model repository is stuck (2.51 never answers the load of a python model
whose stub fails to start, when an ensemble uses it), and the server is restarted.
After a restart or a reload it closes the client's circuit breakers, so requests flow again without waiting
for the breakers' cooldown.

With an external Triton (`triton.url`), which it neither owns nor may restart, it only watches readiness.
`status()` gives counters for Health / Stats: restarts, model reloads, the last failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import time
from dataclasses import dataclass, field
from typing import Callable, Literal, Optional

from ..config import TritonSettings
from ..errors import DeadlineExceededError, ThinkServeError
from .client import TritonClient
from .launcher import TritonServer

log = logging.getLogger("thinkserve.triton.supervisor")

STUB_FAILURE = re.compile(r"Stub process '([^']+)' is not healthy")
INSTANCE_SUFFIX = re.compile(r"_\d+_\d+$")  # <model>_<group index>_<instance index>, Triton's default naming

Mode = Literal["own", "external"]


@dataclass(frozen=True)
class SupervisorStatus:
    """Read-only counters for Health / Stats / metrics."""

    mode: Mode  # own: launched and restarted here; external: triton.url, readiness watched only
    running: bool  # the supervision task is alive
    triton_ready: bool  # at the last check
    restarts: int  # successful restarts of the server
    failed_restarts: int
    model_reloads: int  # successful reloads of a model whose stub died
    reloads_by_model: dict[str, int] = field(default_factory=dict)
    last_failure: str = ""  # the latest failure seen (server death, dead stub, failed restart or reload)
    last_failure_at: Optional[float] = None  # wall clock (time.time())
    last_restart_s: Optional[float] = None  # how long the latest successful restart took, death noticed to ready
    last_reload_s: Optional[float] = None


class TritonSupervisor:
    def __init__(self, settings: TritonSettings, client: TritonClient, server: Optional[TritonServer] = None):
        self.settings = settings
        self.client = client
        self.server = server
        self.mode: Mode = "own" if server is not None else "external"
        self._task: Optional[asyncio.Task] = None
        self._wake = asyncio.Event()
        self._stopping = False
        self._known: dict[str, str] = {}  # instance -> model, every stub seen alive since the last (re)start
        self._serving: set[str] = set()  # models READY after the last (re)start: a reload brings them all back
        self._reported: dict[str, tuple[str, float]] = {}  # model -> (failure that named its stub, call start)
        self._reloaded_at: dict[str, float] = {}  # model -> end of its last reload (monotonic)
        self._restarted_at = float("-inf")
        self._retry_reload: dict[str, str] = {}  # model -> reason, for a reload that failed: tried again ...
        self._reload_failures: dict[str, int] = {}  # ... after a doubling pause (restart_backoff_s, _max_s)
        self._next_reload_at: dict[str, float] = {}
        self._died_at = 0.0
        self._restart_failures = 0  # consecutive, for the backoff
        self._next_restart_at = 0.0
        self._ready = True
        self._restarts = 0
        self._failed_restarts = 0
        self._reloads: dict[str, int] = {}
        self._last_failure = ""
        self._last_failure_at: Optional[float] = None
        self._last_restart_s: Optional[float] = None
        self._last_reload_s: Optional[float] = None

    # ------------------------------------------------------------------ life cycle

    def start(self) -> None:
        if self._task is not None:
            return
        self._stopping = False
        if self.server is not None:
            self._learn_stubs()
        self.client.add_failure_listener(self.report_failure)
        self._task = asyncio.create_task(self._run(), name="triton-supervisor")

    async def stop(self) -> None:
        """Stop supervising; a restart in progress is abandoned (its half-started server is killed)."""
        self._stopping = True
        self.client.remove_failure_listener(self.report_failure)
        if self.server is not None:
            self.server.abort_start()
        task, self._task = self._task, None
        if task is not None:
            self._wake.set()
            try:
                await asyncio.wait_for(asyncio.shield(task), self.settings.exit_timeout_s + 10)
            except asyncio.TimeoutError:
                task.cancel()
                log.warning("Triton supervisor did not stop within %.0f s: cancelled", self.settings.exit_timeout_s + 10)

    def status(self) -> SupervisorStatus:
        return SupervisorStatus(
            mode=self.mode,
            running=self._task is not None and not self._task.done(),
            triton_ready=self._ready,
            restarts=self._restarts,
            failed_restarts=self._failed_restarts,
            model_reloads=sum(self._reloads.values()),
            reloads_by_model=dict(self._reloads),
            last_failure=self._last_failure,
            last_failure_at=self._last_failure_at,
            last_restart_s=self._last_restart_s,
            last_reload_s=self._last_reload_s,
        )

    def report_failure(self, model: str, details: str, started: float) -> None:
        """Client listener: a call failed as unavailable. A dead or hung stub is named in the message."""
        match = STUB_FAILURE.search(details or "")
        if match is None or self.server is None:
            return
        instance = match.group(1)
        stub_model = self._known.get(instance) or INSTANCE_SUFFIX.sub("", instance)
        if self._stale(stub_model, started):
            return
        self._reported.setdefault(stub_model, (f"a call to {model or stub_model} failed: {match.group(0)}", started))
        self._wake.set()

    def _stale(self, model: str, started: float) -> bool:
        """The call was sent before the model was last brought back: it says nothing about the new stub."""
        return started < max(self._restarted_at, self._reloaded_at.get(model, float("-inf")))

    # ------------------------------------------------------------------ the loop

    async def _run(self) -> None:
        while not self._stopping:
            try:
                await self._check()
            except Exception:  # the supervisor must outlive any one failed check
                log.exception("Triton supervisor: check failed")
            if self._stopping:
                break
            try:
                await asyncio.wait_for(self._wake.wait(), self.settings.supervise_interval_s)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()

    async def _check(self) -> None:
        if self.server is None:
            await self._watch_readiness()
            return
        if not self.server.is_running():
            await self._restart(lambda s: f"Triton died ({s.exit_description()}): {s.failure_reason(errors_only=True)}")
            return
        self._ready = True
        if not self._serving:
            try:
                self._serving = await self.client.ready_models()
            except ThinkServeError:
                pass  # learnt at a later check
        dead = self._dead_stubs()
        for model, reason in dead.items():
            if self._stopping or not self.server.is_running():
                return
            await self._reload(model, reason)

    async def _watch_readiness(self) -> None:
        ready = await self.client.server_ready(timeout_s=max(0.5, self.settings.supervise_interval_s))
        if ready != self._ready:
            if ready:
                log.info("Triton at %s is ready again", self.client.url)
                self.client.breakers.reset()
            else:
                self._failure(f"Triton at {self.client.url} is not ready (external server: not restarted here)")
        self._ready = ready

    # ------------------------------------------------------------------ server restarts

    async def _restart(self, cause: Callable[[TritonServer], str]) -> None:
        """Restart the server (on the same ports), or wait for the pause after a failed attempt to end."""
        now = time.monotonic()
        if now < self._next_restart_at:
            return
        server = self.server
        if self._ready:  # first notice of this outage
            self._ready = False
            self._died_at = now
            self._failure(cause(server))
        log.warning("restarting Triton on %s (attempt %d)", server.endpoints.grpc, self._restart_failures + 1)
        try:
            await asyncio.to_thread(server.restart)
        except (ThinkServeError, OSError) as error:
            if self._stopping:
                return
            self._failed_restarts += 1
            self._restart_failures += 1
            pause = min(
                self.settings.restart_backoff_max_s, self.settings.restart_backoff_s * 2 ** (self._restart_failures - 1)
            )
            self._next_restart_at = time.monotonic() + pause
            self._failure(f"restarting Triton failed (attempt {self._restart_failures}, next in {pause:.1f} s): {error}")
            return
        if self._stopping:
            return
        await self._await_reconnection(server)
        self._restart_failures, self._next_restart_at = 0, 0.0
        self._restarts += 1
        self._ready = True
        self._restarted_at = time.monotonic()
        self._last_restart_s = self._restarted_at - self._died_at
        self._known, self._reported, self._retry_reload, self._reload_failures = {}, {}, {}, {}
        self._serving = set()
        self._learn_stubs()
        self.client.breakers.reset()
        log.warning(
            "Triton restarted on %s in %.1f s (restart %d, log: %s)",
            server.endpoints.grpc, self._last_restart_s, self._restarts, server.log_path,
        )

    async def _await_reconnection(self, server: TritonServer) -> None:
        """The launcher saw the new server ready on its own probe, but the shared client's channel may still sit
        in its reconnect backoff (up to triton.reconnect_backoff_max_s), failing every call at once: a restart
        counts as done, and the breakers are reset, only once that channel reaches the new server."""
        wait_s = self.settings.reconnect_backoff_max_s + max(1.0, self.settings.supervise_interval_s)
        if not await self.client.server_ready(timeout_s=wait_s, wait_for_connection=True):
            log.warning("Triton restarted on %s, but this client did not reach it within %.1f s", server.endpoints.grpc, wait_s)

    # ------------------------------------------------------------------ dead stubs

    def _learn_stubs(self) -> dict[str, str]:
        """Instances alive now (instance -> model), remembered as expected from now on."""
        alive = {stub.instance: stub.model for stub in self.server.stub_processes()}
        self._known.update(alive)
        return alive

    def _dead_stubs(self) -> dict[str, str]:
        """Models to reload, each with the reason: a stub gone from the process table, or a reported failure."""
        alive = self._learn_stubs()
        dead: dict[str, str] = {}
        for instance, model in sorted(self._known.items()):
            if instance not in alive and model not in dead:
                dead[model] = f"the python stub of {instance} died"
        now = time.monotonic()
        for model, reason in list(self._retry_reload.items()):
            if now >= self._next_reload_at.get(model, 0.0):
                del self._retry_reload[model]
                dead.setdefault(model, reason)
        for model, (reason, started) in list(self._reported.items()):
            del self._reported[model]
            if not self._stale(model, started):  # checked again: a reload may have finished since the report
                dead.setdefault(model, reason)
        return dead

    async def _reload(self, model: str, reason: str) -> None:
        self._failure(f"model {model}: {reason}")
        log.warning("reloading model %s: %s", model, reason)
        started = time.monotonic()
        for instance in [i for i, m in self._known.items() if m == model]:
            del self._known[instance]  # its new stubs are learnt once the reload is done
        for stub in self.server.stub_processes():
            if stub.model == model:  # a hung stub would outlive the reload (and slow the unload): end it first
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(stub.pid, signal.SIGKILL)
        timeout = self.settings.reload_timeout_s
        try:
            # `expected`: after a failed attempt the ensemble went down with the model; bring it back too
            await self.client.reload_model(model, timeout_s=timeout, expected=self._serving)
        except DeadlineExceededError:
            self._reloaded_at[model] = time.monotonic()
            if not self._stopping and self.server.is_running():
                await self._restart(lambda _: (
                    f"reloading model {model} did not finish within {timeout:.0f} s (triton.reload_timeout_s): "
                    "Triton's model repository is stuck; restarting Triton"
                ))
            return
        except ThinkServeError as error:
            if not self._stopping and self.server.is_running():
                failures = self._reload_failures[model] = self._reload_failures.get(model, 0) + 1
                pause = min(self.settings.restart_backoff_max_s, self.settings.restart_backoff_s * 2 ** (failures - 1))
                self._next_reload_at[model] = time.monotonic() + pause
                self._retry_reload[model] = reason
                self._failure(f"reloading model {model} failed (attempt {failures}, next in {pause:.1f} s): {error}")
            return
        finally:
            self._reloaded_at[model] = time.monotonic()
        self._learn_stubs()
        self._reload_failures.pop(model, None)
        self._reloads[model] = self._reloads.get(model, 0) + 1
        self._last_reload_s = time.monotonic() - started
        self.client.breakers.reset()  # the breaker is keyed by the model called (an ensemble), not the reloaded one
        log.warning("model %s reloaded in %.1f s", model, self._last_reload_s)

    def _failure(self, message: str) -> None:
        log.warning("Triton supervisor: %s", message)
        self._last_failure, self._last_failure_at = message, time.time()
