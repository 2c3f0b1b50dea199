"""Scaling out as an operator would: the session's orchestrator writes its data folder; `serve --read-only`, a
second real process on the same folder and the same Triton, answers queries and follows the writer's ingests
and deletes; a second `serve` without --read-only refuses to start, naming the writer, before it launches
anything."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import grpc
import pytest

from orchestrator.client import ThinkServeClient
from tests.conftest import ROOT
from tests.integration.test_bench_interrupt import _lines_until
from tests.integration.test_serve_process import _free_port
from tests.integration.test_service import status_of

pytestmark = pytest.mark.integration

FACT = "The Harbourview depot stores {} crates of spare turbine blades for the northern wind farm."
QUESTION = "How many crates of spare turbine blades does the Harbourview depot store?"


def _environment(running_orchestrator, triton, port: int, tmp_path) -> dict[str, str]:
    return {
        **os.environ,
        "THINKSERVE_STORAGE__DATA_DIR": str(running_orchestrator.data_dir), "THINKSERVE_TRITON__URL": triton.endpoints.grpc,
        "THINKSERVE_SERVER__PORT": str(port), "THINKSERVE_HTTP__ENABLED": "false",
        "THINKSERVE_STORAGE__FOLLOW_INTERVAL_S": "0.2", "THINKSERVE_TRITON__LOG_DIR": str(tmp_path / "logs"),
    }


def _eventually(check, seconds: float = 30.0):
    """The first truthy result of `check` within `seconds` (the replica follows within its interval)."""
    deadline = time.monotonic() + seconds
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.1)


def test_a_read_replica_follows_the_writer_and_a_second_writer_is_refused(running_orchestrator, triton, tmp_path):
    second = subprocess.run(
        [sys.executable, "-m", "orchestrator", "serve"], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env=_environment(running_orchestrator, triton, _free_port(), tmp_path),
    )
    assert second.returncode != 0
    assert f"is held by its writer, process {os.getpid()} on " in second.stderr, second.stderr
    assert "starting Triton" not in second.stdout + second.stderr  # refused before anything was launched

    collection = f"replica-{uuid.uuid4().hex[:8]}"
    port = _free_port()
    replica = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "serve", "--read-only"], cwd=ROOT,
        env=_environment(running_orchestrator, triton, port, tmp_path),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        lines = _lines_until(replica.stdout, "serving", 180)
        assert any(line.startswith("serving") for line in lines), "".join(lines)
        assert any("read replica of" in line for line in lines)
        with ThinkServeClient(running_orchestrator.address) as writer, ThinkServeClient(f"127.0.0.1:{port}") as reader:
            writer.ingest(collection, FACT.format(412).encode(), "depot.md")

            def cites(number: str):
                try:
                    items = reader.retrieve(collection, QUESTION).evidence.items
                except grpc.RpcError as error:  # NOT_FOUND until the replica sees the collection
                    return error.code() == grpc.StatusCode.NOT_FOUND and None
                return items and number in items[0].text

            assert _eventually(lambda: cites("412")), "the replica never answered from the writer's document"
            writer.ingest(collection, FACT.format(977).encode(), "depot.md")  # replaced
            assert _eventually(lambda: cites("977")), "the replica kept the replaced version"
            assert [d.name for d in reader.list_documents(collection)] == ["depot.md"]

            code, details = status_of(lambda: reader.ingest(collection, b"# x\n\ny", "x.md"))
            assert code == grpc.StatusCode.FAILED_PRECONDITION and "read replica" in details
            code, _ = status_of(lambda: reader.delete_document(collection, "depot.md"))
            assert code == grpc.StatusCode.FAILED_PRECONDITION
            code, _ = status_of(lambda: reader.delete_collection(collection))
            assert code == grpc.StatusCode.FAILED_PRECONDITION
            assert [d.name for d in writer.list_documents(collection)] == ["depot.md"]  # nothing changed

            writer.delete_document(collection, "depot.md")
            assert _eventually(lambda: reader.list_documents(collection) == []), "the replica kept a deleted document"
            writer.delete_collection(collection)

            def gone():
                code, _ = status_of(lambda: reader.list_documents(collection))
                return code == grpc.StatusCode.NOT_FOUND

            assert _eventually(gone), "the replica kept a deleted collection"
            assert reader.health().serving
        replica.send_signal(signal.SIGTERM)
        assert replica.wait(60) == 0
    finally:
        if replica.poll() is None:
            os.killpg(replica.pid, signal.SIGKILL)
