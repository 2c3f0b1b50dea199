"""A loaded segment reads its records on first use and its BM25 term counts and row pages from terms.npz: a
snapshot of loaded segments equals one of the same segments in memory, and a terms file that is missing,
corrupt, of another tokeniser version or of another size is replaced by tokenising the texts again."""

from __future__ import annotations

import logging
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from orchestrator.knowledge.storage import segments as segment_files
from orchestrator.knowledge.parsing.documents import NO_PAGE
from orchestrator.knowledge.storage.indexes import IndexSpec
from orchestrator.knowledge.storage.lexical import BM25Index
from orchestrator.knowledge.storage.segments import TERMS_FILE, Segment, StoredRecords
from orchestrator.knowledge.storage.snapshot import Snapshot
from tests.segment_factory import make_segment

WORDS = ["revenue", "grew", "north", "south", "2024", "1,200", "cost", "fell", "the", "report", "4.5%", "Ünïcode"]
QUERIES = ["revenue 2024", "north cost fell", "report", "ünïcode south 1,200"]
ENTITIES = {"revenue grew north": ["North Unit", "Revenue Desk"]}


def written(segment: Segment, folder: Path) -> Segment:
    segment.write(folder)
    return Segment.load(folder)


def assert_same_snapshot(loaded: Snapshot, memory: Snapshot) -> None:
    assert list(loaded.evidence) == list(memory.evidence)
    assert np.array_equal(loaded.page_of_row, memory.page_of_row)
    assert [list(rows) for rows in loaded.page_rows] == [list(rows) for rows in memory.page_rows]
    for query in QUERIES:
        assert np.allclose(loaded.lexical.scores(query), memory.lexical.scores(query))
        assert np.allclose(loaded.page_lexical.scores(query), memory.page_lexical.scores(query))


document = st.tuples(
    st.lists(st.lists(st.sampled_from(WORDS), min_size=0, max_size=10).map(" ".join), min_size=1, max_size=6),
    st.lists(st.sampled_from([NO_PAGE, 1, 2, 5]), min_size=6, max_size=6),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(document, min_size=1, max_size=4))
def test_a_snapshot_of_loaded_segments_equals_the_same_segments_in_memory(documents):
    folder = Path(tempfile.mkdtemp(prefix="segments-"))
    try:
        memory = [
            make_segment(f"doc{n}.pdf", texts, dim=4, seed=n, pages=pages[: len(texts)])
            for n, (texts, pages) in enumerate(documents)
        ]
        loaded = [written(segment, folder / f"seg-{n}") for n, segment in enumerate(memory)]
        assert_same_snapshot(Snapshot(1, loaded, IndexSpec()), Snapshot(1, memory, IndexSpec()))
    finally:
        shutil.rmtree(folder)


def test_opening_reads_no_record_and_a_query_reads_only_its_rows_documents(tmp_path):
    texts = ["revenue grew north", "cost fell south", "the report 2024"]
    memory = [make_segment(f"doc{n}.pdf", texts, ENTITIES, dim=4, seed=n, content=str(n)) for n in range(3)]
    loaded = [written(segment, tmp_path / f"seg-{n}") for n, segment in enumerate(memory)]
    snapshot = Snapshot(1, loaded, IndexSpec())
    snapshot.lexical, snapshot.page_lexical, snapshot.page_rows  # what every query reads of every row
    unread = lambda segment: [name for name in ("blocks", "evidence", "entities", "relations")  # noqa: E731
                              if getattr(segment, name)._records is None]
    assert all(unread(segment) == ["blocks", "evidence", "entities", "relations"] for segment in loaded)

    (row, score), *_ = snapshot.search_lexical("cost fell south", 1)
    assert row == memory[0].evidence[1] and score > 0
    # the row was decoded from its own line: no segment decoded its whole evidence file
    assert all(len(unread(segment)) == 4 for segment in loaded)
    assert [segment.evidence._lines is not None for segment in loaded] == [True, False, False]
    assert snapshot.evidence[-1] == memory[2].evidence[-1] and snapshot.evidence[3:5] == memory[1].evidence[:2]
    assert [snapshot.evidence[row] for row in range(9)] == [e for segment in memory for e in segment.evidence]

    snapshot.node_evidence  # the graph reads every mention and every evidence record
    assert all(unread(segment) == ["blocks"] for segment in loaded)
    assert snapshot.graph.node_count == Snapshot(1, memory, IndexSpec()).graph.node_count
    assert list(loaded[0].blocks) == list(memory[0].blocks)


def test_a_block_and_the_block_count_are_read_without_decoding_the_documents_blocks(tmp_path):
    """The extractive answer checks which blocks of the evidence are titles on every query (evidence.headings):
    decoding every block of each cited document took 0.7 s on a query over 1,000-chunk documents."""
    memory = make_segment("doc.pdf", ["revenue grew north", "cost fell south", "the report 2024"], ENTITIES, dim=4, seed=1)
    loaded = written(memory, tmp_path / "seg")
    assert len(loaded.blocks) == len(memory.blocks) and loaded.blocks[-1] == memory.blocks[-1]
    assert loaded.blocks[1] == memory.blocks[1] and loaded.blocks._records is None  # rows read from their lines
    with pytest.raises(IndexError):
        loaded.blocks[len(memory.blocks)]


def damage_truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:40])


def damage_garbage(path: Path) -> None:
    path.write_bytes(b"not an npz file at all")


def damage_version(path: Path) -> None:
    stored = dict(np.load(path))
    np.savez(path, **(stored | {"version": np.int64(0)}))


def damage_rows(path: Path) -> None:
    stored = dict(np.load(path))
    np.savez(path, **(stored | {"pages": stored["pages"][:-1]}))


@pytest.mark.parametrize("damage", [damage_truncated, damage_garbage, damage_version, damage_rows, Path.unlink])
def test_an_unusable_terms_file_is_replaced_by_tokenising_again_and_logged(tmp_path, caplog, damage):
    texts = ["revenue grew north", "cost fell south", "the report 2024 revenue"]
    memory = make_segment("doc.pdf", texts, dim=4, pages=[1, 1, 2])
    loaded = written(memory, tmp_path / "seg")
    damage(tmp_path / "seg" / TERMS_FILE)
    with caplog.at_level(logging.WARNING, logger="thinkserve.knowledge"):
        assert_same_snapshot(Snapshot(1, [loaded], IndexSpec()), Snapshot(1, [memory], IndexSpec()))
    if damage is not Path.unlink:  # a segment written before terms files is not an error
        assert any(TERMS_FILE in r.getMessage() and "tokenised again" in r.getMessage() for r in caplog.records)
    assert np.allclose(Snapshot(1, [loaded], IndexSpec()).lexical.scores("revenue"), BM25Index(texts).scores("revenue"))


@pytest.mark.parametrize("read", [lambda evidence: evidence[1], list], ids=["one row", "every row"])
def test_evidence_records_that_do_not_match_their_vectors_fail_naming_the_file(tmp_path, read):
    loaded = written(make_segment("doc.pdf", ["revenue grew", "cost fell"], dim=4), tmp_path / "seg")
    lines = (tmp_path / "seg" / "evidence.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "seg" / "evidence.jsonl").write_text(lines[0])
    assert len(loaded.evidence) == 2  # from the vectors: nothing read yet
    with pytest.raises(ValueError, match="evidence.jsonl holds 1 records for 2 vectors"):
        read(loaded.evidence)


def test_stored_records_are_read_once_when_several_threads_ask(tmp_path, monkeypatch):
    loaded = written(make_segment("doc.pdf", ["revenue grew", "cost fell"], dim=4), tmp_path / "seg")
    reads: list[Path] = []
    original = segment_files._read_jsonl
    monkeypatch.setattr(segment_files, "_read_jsonl", lambda path: reads.append(path) or original(path))
    with ThreadPoolExecutor(4) as pool:
        texts = list(pool.map(lambda row: [e.text for e in loaded.evidence][row % 2], range(40)))
    assert texts == ["revenue grew", "cost fell"] * 20 and reads == [tmp_path / "seg" / "evidence.jsonl"]
    assert isinstance(loaded.evidence, StoredRecords)
