"""kill -9 at any moment of a commit: the collection holds each document completely or not at all, and
every document whose commit returned before the kill is there after a restart. With HNSW indexes each commit
also writes them (stored_indexes.py): a kill while they are written costs a rebuild, never a document."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from orchestrator.knowledge.storage.indexes import IndexSpec
from orchestrator.knowledge.storage.manifest import MANIFEST
from orchestrator.knowledge.storage.registry import KnowledgeBase
from orchestrator.knowledge.storage.stored_indexes import META, PREFIX
from tests.conftest import ROOT

WRITER = r"""
import sys
from orchestrator.knowledge.storage.indexes import IndexSpec
from orchestrator.knowledge.storage.registry import KnowledgeBase
from tests.segment_factory import commit, make_segment

kb = KnowledgeBase(__import__("pathlib").Path(sys.argv[1]), IndexSpec(kind=sys.argv[3], hnsw_neighbors=8))
start = int(sys.argv[2])
for step in range(start, start + 1000):
    name = f"doc{step % 7}.md"  # names repeat: most commits replace a document
    texts = [f"{name} version {step} chunk {j}" for j in range(150)]
    commit(kb.collection("crash", create=True), make_segment(name, texts, dim=384, seed=step))
    print(f"committed {name} {step}", flush=True)
"""


def run_writer(data_dir, start, seconds, kind):
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(data_dir), str(start), kind],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    time.sleep(seconds)
    writer.send_signal(signal.SIGKILL)
    output, _ = writer.communicate()
    return [line.split()[1:] for line in output.splitlines() if line.startswith("committed")]


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_kill_9_during_commits_never_leaves_half_a_document(tmp_path, kind):
    spec = IndexSpec(kind=kind, hnsw_neighbors=8)
    rng = random.Random(7)
    acknowledged: dict[str, int] = {}  # name -> last version whose commit returned
    interrupted_rounds = 0
    step = 0
    for _ in range(8):
        for name, version in run_writer(tmp_path, step, rng.uniform(1.5, 3.0), kind):
            acknowledged[name] = int(version)
        step += 1000
        root = tmp_path / "collections" / "crash"
        listed = {entry["segment"] for entry in json.loads((root / MANIFEST).read_text())["documents"]} if (root / MANIFEST).exists() else set()
        leftovers = [p for p in root.iterdir() if p.name != MANIFEST and p.name not in listed] if root.exists() else []
        interrupted_rounds += bool(leftovers)

        restarted = KnowledgeBase(tmp_path, spec)  # a restart: the killed writer's lock went with it
        snapshot = restarted.collection("crash").snapshot
        for name in acknowledged:
            assert name in snapshot.documents, f"{name} was acknowledged but is gone"
        for name in snapshot.documents:
            texts = [e.text for e in snapshot.evidence if e.document_name == name]
            versions = {text.split()[2] for text in texts}
            assert len(texts) == 150 and len(versions) == 1, f"{name} is incomplete or mixed: {len(texts)} chunks, {versions}"
            assert int(versions.pop()) >= acknowledged.get(name, -1), f"{name} went back to an older version"
        assert snapshot.evidence_index.size == len(snapshot.evidence)
        indexes = sorted(root.glob(f"{PREFIX}*"))  # the loaded or rebuilt indexes of this manifest, and no other
        assert len(indexes) == (kind == "hnsw")
        segments = [s.folder.name for s in snapshot.segments]
        assert sorted(p.name for p in root.iterdir()) == sorted([MANIFEST] + segments + [p.name for p in indexes])
        if indexes:
            assert json.loads((indexes[0] / META).read_text())["segments"] == segments
        restarted.close()  # the next writer takes the folder
    assert acknowledged, "the writer never completed a commit: the test exercised nothing"
    assert interrupted_rounds >= 4, f"only {interrupted_rounds} of 8 kills landed inside a commit"
