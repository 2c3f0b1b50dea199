"""FAISS index kinds behind one API, and BM25 scores checked against the formula."""

import math

import numpy as np
import pytest

from orchestrator.knowledge.storage.indexes import IndexSpec, VectorIndex
from orchestrator.knowledge.storage.lexical import BM25Index
from orchestrator.knowledge.parsing.text import lexical_terms


def unit_vectors(n, dim=16, seed=0):
    v = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_every_kind_finds_each_vector_itself(kind):
    vectors = unit_vectors(2000)
    index = VectorIndex.build(IndexSpec(kind=kind, ivf_min_vectors=1000, ivf_lists=16, ivf_probe=16), vectors, 16)
    assert index.kind == kind and index.size == 2000
    scores, rows = index.search(vectors[:50], 1)
    assert (rows[:, 0] == np.arange(50)).mean() >= 0.96
    assert scores[0, 0] == pytest.approx(1.0, abs=1e-4)


def test_small_ivf_is_exact_flat_until_it_can_train_then_appends_stay_aligned():
    spec = IndexSpec(kind="ivf", ivf_min_vectors=500, ivf_lists=8, ivf_probe=8)
    vectors = unit_vectors(800, seed=3)
    small = VectorIndex.build(spec, vectors[:100], 16)
    assert small.kind == "flat"
    grown = small.extended(vectors[100:])
    assert grown.kind == "ivf" and grown.size == 800 and small.size == 100  # the old snapshot's index is untouched
    _, rows = grown.search(vectors[[5, 700]], 1)
    assert rows[:, 0].tolist() == [5, 700]


def test_empty_index_searches_to_nothing_and_grows():
    empty = VectorIndex.build(IndexSpec(), np.zeros((0, 0), np.float32), 0)
    scores, rows = empty.search(unit_vectors(1), 5)
    assert rows.shape == (1, 0)
    grown = empty.extended(unit_vectors(3))
    assert grown.size == 3 and grown.dimension == 16


def test_bm25_matches_the_formula_and_ranks():
    texts = ["revenue grew 12% in 2024", "the cost of revenue fell", "weather report", "revenue revenue revenue"]
    index = BM25Index(texts, k1=1.2, b=0.75)
    hits = index.search("revenue 2024", 10)
    assert [row for row, _ in hits][0] == 0
    assert 2 not in [row for row, _ in hits]  # shares no term

    lengths = [len(lexical_terms(t)) for t in texts]
    average = sum(lengths) / len(lengths)

    def expected(row):
        total = 0.0
        for term in ("revenue", "2024"):
            tf = lexical_terms(texts[row]).count(term)
            df = sum(term in lexical_terms(t) for t in texts)
            idf = math.log1p((len(texts) - df + 0.5) / (df + 0.5))
            total += idf * tf * 2.2 / (tf + 1.2 * (1 - 0.75 + 0.75 * lengths[row] / average)) if tf else 0
        return total

    for row, score in hits:
        assert score == pytest.approx(expected(row), rel=1e-5)
    assert lexical_terms("Revenue: 1,200.5 units (4.5%)") == ["revenue", "1,200.5", "units", "4.5%"]


def test_bm25_queries_drop_stop_words_and_know_their_own_weight():
    index = BM25Index(["how was the year", "revenue grew in the north", "the north was quiet"])
    assert index.search("How was the revenue?", 3) == index.search("revenue", 3)  # "how", "was", "the" ignored
    assert index.search("how was it", 3) == []  # nothing but stop words: nothing matches
    unseen = math.log1p((3 + 0.5) / 0.5)  # a word no text holds weighs the most there is
    assert index.query_weight("revenue of Atlantis") == pytest.approx(index.idf("revenue") + unseen)
    assert index.query_weight("how was it") == 0.0


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_appending_shares_the_index_and_searches_a_tail_until_it_is_merged_in(kind, monkeypatch, tmp_path):
    from orchestrator.knowledge.storage import indexes

    monkeypatch.setattr(indexes, "tail_limit", lambda base_size: 25)
    spec = IndexSpec(kind=kind, hnsw_ef_search=512)
    vectors = unit_vectors(200, seed=3)
    index = VectorIndex.build(spec, vectors[:100], 16)
    grown = index.extended(vectors[100:110]).extended(vectors[110:120])
    assert grown._index is index._index and grown.size == 120  # shared, not copied; 20 in the tail
    assert np.array_equal(grown.vectors(), vectors[:120])
    exact = VectorIndex.build(IndexSpec(), vectors[:120], 16)
    queries = unit_vectors(8, seed=4)
    for k in (1, 5, 130):
        (scores, rows), (expected_scores, expected_rows) = grown.search(queries, k), exact.search(queries, k)
        assert rows.shape == expected_rows.shape == (8, min(k, 120))
        assert np.array_equal(rows, expected_rows) and np.allclose(scores, expected_scores, atol=1e-6)
    grown.write(tmp_path / "index.faiss")  # written whole: the tail merged into a copy
    written = VectorIndex.read(spec, tmp_path / "index.faiss", kind)
    assert written.size == 120 and np.array_equal(written.vectors(), vectors[:120]) and grown._index is index._index
    merged = grown.extended(vectors[120:130])  # 30 past the limit of 25: merged into a copy
    assert merged._index is not index._index and merged._tail is None and merged.size == 130
    assert index.size == 100 and grown.size == 120  # the older ones are unchanged
    assert np.array_equal(merged.search(queries, 5)[1], VectorIndex.build(IndexSpec(), vectors[:130], 16).search(queries, 5)[1])


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_removing_rows_shares_the_index_skips_them_and_equals_an_index_of_the_rest(kind, monkeypatch, tmp_path):
    """A deleted document's rows go without a rebuild: searches skip them (main index and tail alike), the rows
    after them move up, appending still works, the index is written with its removed ids and read back so, and
    past MAX_REMOVED_FRACTION it is rebuilt from what is left."""
    from orchestrator.knowledge.storage import indexes

    monkeypatch.setattr(indexes, "tail_limit", lambda base_size: 40)
    spec = IndexSpec(kind=kind, ivf_min_vectors=100, ivf_lists=4, ivf_probe=4, hnsw_ef_search=512)
    vectors = unit_vectors(260, seed=5)
    index = VectorIndex.build(spec, vectors[:200], 16).extended(vectors[200:230])  # 30 in the tail
    # a document in the middle of the main index, and one that spans the end of it and the tail's start
    smaller = index.without(50, 70).without(170, 190)
    rest = np.concatenate([vectors[:50], vectors[70:190], vectors[210:230]])
    assert smaller._index is index._index and smaller.size == len(rest) == 190 and index.size == 230
    assert np.array_equal(smaller.vectors(), rest) and list(smaller.removed_ids) == list(range(50, 70)) + list(range(190, 200))
    queries = np.concatenate([unit_vectors(6, seed=6), vectors[[10, 80, 205, 215]]])
    exact = VectorIndex.build(IndexSpec(), rest, 16)
    for k in (1, 5, 300):
        (scores, rows), (expected_scores, expected_rows) = smaller.search(queries, k), exact.search(queries, k)
        assert rows.shape == expected_rows.shape == (10, min(k, 190))
        assert np.array_equal(rows, expected_rows) and np.allclose(scores, expected_scores, atol=1e-5)
    grown = smaller.extended(vectors[230:260])  # 50 in the tail: merged into a copy, the removed ids kept
    assert grown._tail is None and grown.size == 220
    assert np.array_equal(grown.vectors(), np.concatenate([rest, vectors[230:260]]))
    assert np.array_equal(grown.search(vectors[[0, 100, 250]], 1)[1][:, 0], [0, 80, 210])
    grown.write(tmp_path / "index.faiss")
    read = VectorIndex.read(spec, tmp_path / "index.faiss", kind, grown.removed_ids)
    assert read.size == 220 and np.array_equal(read.vectors(), grown.vectors())
    assert np.array_equal(read.search(queries, 5)[1], grown.search(queries, 5)[1])
    with pytest.raises(ValueError, match="removed ids"):
        VectorIndex.read(spec, tmp_path / "index.faiss", kind, np.asarray([5, 3]))
    compacted = grown.without(0, 40)  # 70 of 260 removed: past a quarter, rebuilt
    assert compacted._index is not grown._index and len(compacted.removed_ids) == 0 and compacted.size == 180
    assert np.array_equal(compacted.vectors(), grown.vectors()[40:])
    assert index.size == 230 and smaller.size == 190  # the older ones are unchanged


def test_with_faiss_cpu_every_index_stays_on_the_cpu_and_says_why(caplog):
    from orchestrator.knowledge.storage import indexes

    if indexes.gpu_count() > 0:
        pytest.skip("faiss sees a GPU here: test_on_a_gpu_the_results_are_the_cpu_results covers it")
    cpu_build = not hasattr(indexes.faiss, "StandardGpuResources")
    where = indexes.placement(IndexSpec(), "flat")
    assert where.device is None
    assert ("faiss-cpu" if cpu_build else "faiss-gpu sees no GPU") in where.reason
    assert indexes.placement(IndexSpec(kind="hnsw"), "hnsw").reason == "HNSW has no GPU index in faiss"
    assert indexes.placement(IndexSpec(use_gpu=False), "flat").reason == "index.use_gpu is off"
    indexes._announce.cache_clear()
    with caplog.at_level("INFO", logger="thinkserve.index"):
        built = VectorIndex.build(IndexSpec(kind="ivf", ivf_min_vectors=100, ivf_lists=4), unit_vectors(300), 16)
    assert built.device is None and built.kind == "ivf"
    assert [record.getMessage() for record in caplog.records] == [f"FAISS indexes: {where.reason}"]


def test_the_placement_decision_takes_the_configured_device_only(monkeypatch):
    """The decision alone, with faiss made to report two GPUs (no index is copied anywhere)."""
    from orchestrator.knowledge.storage import indexes

    monkeypatch.setattr(indexes.faiss, "StandardGpuResources", object, raising=False)
    monkeypatch.setattr(indexes, "gpu_count", lambda: 2)
    assert indexes.placement(IndexSpec(), "flat") == indexes.Placement(0, "GPU 0 of the 2 faiss sees")
    assert indexes.placement(IndexSpec(gpu_device=1), "ivf").device == 1
    beyond = indexes.placement(IndexSpec(gpu_device=2), "flat")
    assert beyond.device is None and beyond.reason == "index.gpu_device is 2 but faiss sees 2 GPU(s)"
    assert indexes.placement(IndexSpec(gpu_device=1), "hnsw").device is None


def test_the_device_budget_holds_the_indexes_together_and_frees_what_is_garbage():
    import gc

    from orchestrator.knowledge.storage.indexes import _DeviceBudget

    class Owner:  # stands for faiss's GPU index object
        pass

    budget = _DeviceBudget(100)
    first, second = Owner(), Owner()
    assert budget.reserve(60)
    budget.hold(first, 60)
    assert not budget.reserve(50)  # 110 > 100: that index stays on the CPU
    assert budget.reserve(40)
    budget.hold(second, 40)
    assert budget.used == 100
    del first
    gc.collect()
    assert budget.used == 40 and budget.reserve(60)
    assert _DeviceBudget(0).reserve(10**15)  # 0: no limit


def test_the_device_bytes_of_an_index_are_its_vectors_and_centroids():
    from orchestrator.knowledge.storage.indexes import device_bytes

    flat = VectorIndex.build(IndexSpec(), unit_vectors(50), 16)
    assert device_bytes(flat._index) == 50 * 16 * 4
    ivf = VectorIndex.build(IndexSpec(kind="ivf", ivf_min_vectors=100, ivf_lists=4), unit_vectors(300), 16)
    assert device_bytes(ivf._index) == (300 + 4) * 16 * 4


def test_stored_indexes_do_not_depend_on_where_an_index_runs():
    from orchestrator.knowledge.storage.stored_indexes import _settings

    assert _settings(IndexSpec()) == _settings(IndexSpec(use_gpu=False, gpu_device=3, gpu_temp_memory_mb=1, gpu_memory_mb=1))
    assert _settings(IndexSpec()) != _settings(IndexSpec(hnsw_ef_search=64))


def test_the_settings_section_is_the_spec():
    from orchestrator.config import IndexSettings
    from orchestrator.knowledge.storage.indexes import index_spec

    settings = IndexSettings(kind="ivf", gpu_device=1, gpu_temp_memory_mb=64, gpu_memory_mb=512)
    assert index_spec(settings) == IndexSpec(kind="ivf", gpu_device=1, gpu_temp_memory_mb=64, gpu_memory_mb=512)


@pytest.mark.parametrize("hide", ["faiss", "both"])
def test_the_faiss_extras_are_named_when_faiss_is_missing_or_doubled(hide):
    """Neither extra installed, or both (faiss-cpu and faiss-gpu write the same module): an ImportError that says
    which extras to install, when the index module is imported."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    setup = (
        "import sys; sys.modules['faiss'] = None\n" if hide == "faiss" else
        "import importlib.metadata as m\n"
        "real = m.distribution\n"
        "m.distribution = lambda name: real('faiss-cpu') if name.startswith('faiss-gpu') else real(name)\n"
    )
    probe = setup + "import orchestrator.knowledge.storage.indexes\n"
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ") and "thinkserve[cpu]" in last and "thinkserve[gpu]" in last
    assert ("both faiss-cpu and faiss-gpu are installed" in last) == (hide == "both")


@pytest.mark.skipif(
    __import__("orchestrator.knowledge.storage.indexes", fromlist=["gpu_count"]).gpu_count() == 0,
    reason="needs faiss-gpu and a GPU it sees (the `gpu` extra on a GPU machine); the CPU choice is tested above",
)
@pytest.mark.parametrize("kind", ["flat", "ivf"])
def test_on_a_gpu_the_results_are_the_cpu_results(kind, tmp_path):
    import dataclasses
    import gc

    gc.collect()  # the other kind's indexes give their device memory back
    vectors = unit_vectors(3000, seed=7)
    queries = unit_vectors(20, seed=8)
    spec = IndexSpec(kind=kind, ivf_min_vectors=1000, ivf_lists=16, ivf_probe=16)
    on_gpu, on_cpu = VectorIndex.build(spec, vectors, 16), VectorIndex.build(dataclasses.replace(spec, use_gpu=False), vectors, 16)
    assert on_gpu.device == 0 and on_cpu.device is None
    (scores, rows), (cpu_scores, cpu_rows) = on_gpu.search(queries, 10), on_cpu.search(queries, 10)
    assert np.array_equal(rows, cpu_rows) and np.allclose(scores, cpu_scores, atol=1e-4)
    smaller = on_gpu.without(100, 200).extended(vectors[:50])  # no ID selectors on a GPU: rebuilt there
    assert smaller.device == 0 and np.array_equal(smaller.vectors(), np.concatenate([vectors[:100], vectors[200:], vectors[:50]]))
    on_gpu.write(tmp_path / "index.faiss")
    read = VectorIndex.read(spec, tmp_path / "index.faiss", kind)
    assert read.device == 0 and np.array_equal(read.search(queries, 10)[1], cpu_rows)
    # about 190 KB each: five fit in a budget of 1 MB, the sixth stays on the CPU with the same results
    held = [VectorIndex.build(dataclasses.replace(spec, gpu_memory_mb=1), vectors, 16) for _ in range(6)]
    assert [index.device for index in held] == [0] * 5 + [None]
    assert np.array_equal(held[-1].search(queries, 10)[1], cpu_rows)


def test_searches_of_indexes_on_one_gpu_are_serialised_by_its_lock():
    """FAISS's GPU resources are not safe for concurrent use: a search of an index on device 0 waits while another
    holds that device's lock (here a CPU index stands in for the GPU copy; the lock is what is checked)."""
    import threading

    import faiss

    from orchestrator.knowledge.storage.indexes import device_lock

    vectors = np.eye(4, dtype=np.float32)
    cpu = faiss.IndexFlatIP(4)
    cpu.add(vectors)
    on_device = VectorIndex(IndexSpec(), 4, cpu, device=0)
    done = threading.Event()
    with device_lock(0):
        worker = threading.Thread(target=lambda: (on_device.search(vectors[:1], 1), done.set()))
        worker.start()
        assert not done.wait(0.3)  # blocked behind the lock
    worker.join(5)
    assert done.is_set()
    assert VectorIndex(IndexSpec(), 4, cpu).search(vectors[:1], 1)[1].tolist() == [[0]]  # a CPU index takes no lock
