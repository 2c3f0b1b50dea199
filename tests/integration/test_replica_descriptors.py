"""A read replica's open files stay bounded while its writer adds, replaces and deletes documents: every stored
vector table or record file it maps holds a descriptor, and a superseded document's must close once no query
reads it. Found by the soak benchmark (issue 54): a replica polled with GetDocument, as a client waiting for a
change does, kept every replaced and deleted document's files open, 70 -> 96 descriptors in 10 minutes. Each
NOT_FOUND left the snapshot it had read in a reference cycle (the aborted call's AbortError chained the error and
the frames under it), which the next published snapshot's freeze kept for good (knowledge/collector.py)."""

from __future__ import annotations

import gc
import os
import time
import uuid
from pathlib import Path

import grpc
import pytest

from orchestrator.client import ThinkServeClient
from orchestrator.server.deployment import Deployment
from orchestrator.knowledge.storage.manifest import read_manifest
from tests.conftest import settings_with
from tests.integration.conftest import BackgroundLoop

pytestmark = pytest.mark.integration

TEXT = "# Depot bulletin {}\n\nThe Harbourview depot counted {} crates of spare parts in week {}."


def open_segment_files(folder: Path) -> dict[str, int]:
    """Segment folder -> descriptors this process holds on files in it (a removed folder's files too)."""
    held: dict[str, int] = {}
    for descriptor in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{descriptor}")
        except OSError:
            continue
        if target.startswith(f"{folder}/seg-"):
            segment = target[len(f"{folder}/"):].split("/", 1)[0]
            held[segment] = held.get(segment, 0) + 1
    return held


def test_a_replica_closes_the_files_of_documents_its_writer_replaced_or_deleted(running_orchestrator, triton, triton_settings):
    collection = f"fds-{uuid.uuid4().hex[:8]}"
    folder = running_orchestrator.data_dir / "collections" / collection
    config = settings_with(
        triton_settings.model_copy(update={"url": triton.endpoints.grpc}), running_orchestrator.data_dir,
        storage={"read_only": True, "follow_interval_s": 0.1}, http={"enabled": False},
    )
    loop = BackgroundLoop()
    replica = Deployment(config)
    address = loop.run(replica.start(progress=lambda _: None))
    enabled = gc.isenabled()
    gc.disable()  # what the replica leaves must be freed by reference counting, as frozen objects only are
    try:
        with ThinkServeClient(running_orchestrator.address) as writer, ThinkServeClient(address) as reader:

            def shown(name: str, document_id: str | None) -> None:
                """GetDocument until the replica shows the change (NOT_FOUND meanwhile, or for good after a delete),
                asking for a document that is not there too, as the soak's lag measurement and clients do."""
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    for missing in ("absent.md", name):
                        try:
                            seen = reader.get_document(collection, missing).document_id == document_id
                        except grpc.RpcError as error:
                            assert error.code() == grpc.StatusCode.NOT_FOUND, error.details()
                            seen = document_id is None
                    if seen:
                        return
                    time.sleep(0.02)
                raise AssertionError(f"the replica never showed {name} as {document_id}")

            number = 0
            for _ in range(3):
                for name in ("a.md", "b.md"):  # added, then replaced
                    for _ in range(2):
                        number += 1
                        report = writer.ingest(collection, TEXT.format(number, number * 7, number).encode(), name)
                        shown(name, report.document_id)
                for name in ("a.md", "b.md"):
                    writer.delete_document(collection, name)
                    shown(name, None)
            number += 1
            shown("c.md", writer.ingest(collection, TEXT.format(number, 1, number).encode(), "c.md").document_id)
            time.sleep(0.3)  # a follow round after the last change
            _, manifest = read_manifest(folder)
            live = {entry.segment for entry in manifest}
            held = open_segment_files(folder)
            stale = {segment: count for segment, count in held.items() if segment not in live}
            assert not stale, f"{sum(stale.values())} descriptors on {len(stale)} replaced or deleted documents' files " \
                              f"({len(held)} segments held, {len(live)} documents)"
            assert set(held) <= live and held, held  # the one document's files are mapped, nothing else
    finally:
        if enabled:
            gc.enable()
        loop.run(replica.stop())
        loop.close()
        gc.unfreeze()  # what the replica froze goes back to the collector
