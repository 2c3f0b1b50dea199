"""One real tritonserver for the session, and one orchestrator (real gRPC server) in front of it.

Teardown order matters: client streams are closed by the tests themselves (context managers), then the
orchestrator stops, then Triton.
"""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from orchestrator.server.deployment import Deployment
from orchestrator.triton.launcher import TritonServer
from tests.conftest import settings_with


class BackgroundLoop:
    """An asyncio loop on its own thread, so synchronous tests can talk to an async server."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="orchestrator-loop", daemon=True)
        self.thread.start()

    def run(self, coroutine, timeout: float = 600):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


# The session's Triton, once started: a failed test's report carries the end of its log (pytest_runtest_makereport).
_SESSION_TRITON: list[TritonServer] = []


@pytest.fixture(scope="session")
def triton(triton_settings):
    server = TritonServer(triton_settings)
    server.start()
    _SESSION_TRITON.append(server)
    yield server
    _SESSION_TRITON.clear()
    server.stop()


# Lines of the session Triton's log attached to a failed test's report: CI keeps only the printed output, and a
# failure that depends on what Triton saw (a stuck model, a cancellation never delivered) is otherwise unexplained.
TRITON_LOG_LINES_ON_FAILURE = 60


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if report.when != "call" or not report.failed:
        return
    text = f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}; garbage collector enabled: {gc.isenabled()}"
    log = _SESSION_TRITON[0].log_path if _SESSION_TRITON else None
    if log is not None and log.exists():
        tail = log.read_text(errors="replace").splitlines()[-TRITON_LOG_LINES_ON_FAILURE:]
        text += f"\nthe last {len(tail)} lines of {log.name}:\n" + "\n".join(tail)
    report.sections.append(("Triton and machine at the failure", text))


@dataclass(frozen=True)
class RunningOrchestrator:
    address: str
    data_dir: Path


# Uploads above this are refused: big enough for the 2,000-page PDF the ingest tests send (1.3 MB).
TEST_UPLOAD_LIMIT = 4 * 1024 * 1024


@pytest.fixture(scope="session")
def running_orchestrator(triton, triton_settings, tmp_path_factory):
    """A running orchestrator using the session's Triton (so Triton is not started twice)."""
    data_dir = tmp_path_factory.mktemp("data")
    settings = settings_with(
        triton_settings.model_copy(update={"url": triton.endpoints.grpc}),
        data_dir,
        server={"port": 0, "max_upload_bytes": TEST_UPLOAD_LIMIT},
        # The entity extractor reads chunks smaller than the 1,200-token default: the sample's entities then come
        # from several chunks (retrieval indexes passages whatever the chunk size).
        ingest={"chunk_tokens": 200, "chunk_overlap_tokens": 20},
        # A dropped document's folder goes at once (the orphan tests check it): the one replica that reads this
        # folder (test_read_replica) reads no page image or asset of a dropped document.
        storage={"retain_dropped_s": 0},
        answer={"short_answer": True},  # off by default (docs/configuration.md); its tests read it from this deployment
    )
    loop = BackgroundLoop()
    deployment = Deployment(settings)
    address = loop.run(deployment.start(progress=lambda _: None))
    yield RunningOrchestrator(address, data_dir)
    loop.run(deployment.stop())
    loop.close()


@pytest.fixture(scope="session")
def orchestrator(running_orchestrator):
    """The running orchestrator's address."""
    return running_orchestrator.address


def repository_subset(source: Path, target: Path, names: list[str]) -> Path:
    """A repository with only some models (hard links: no weight is copied), for servers that start fast."""
    for name in names:
        shutil.copytree(source / name, target / name, copy_function=os.link, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def event_of(events, kind: str):
    """The one event of `kind` (route, evidence, final) in a query's event stream."""
    found = [getattr(e, kind) for e in events if e.WhichOneof("event") == kind]
    assert len(found) == 1, f"expected one {kind} event, got {len(found)}"
    return found[0]


def tokens_before_cancellation(triton, request_id: str, timeout_s: float = 20.0) -> Optional[int]:
    """The tokens a generator had written when it logged `request_id` as cancelled (None if it did not within
    `timeout_s`): how a test sees that a cancellation reached the model."""
    deadline = time.monotonic() + timeout_s
    while True:
        line = next((logged for logged in triton.log_path.read_text().splitlines()
                     if request_id in logged and "cancelled" in logged), "")
        if line:
            return int(line.split("cancelled after ")[1].split()[0])
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.2)
