"""The collection benchmarks run end to end at a small size and report what they promise (real files, no models)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT


def run(module: str, tmp_path, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "thinkserve_bench", module, *args, "--output", str(tmp_path), "--name", "smoke"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "smoke.md").read_text().startswith("# ")
    return json.loads((tmp_path / "smoke.json").read_text())


def test_collection_restart_loads_what_the_first_start_built(tmp_path):
    result = run("collection_restart", tmp_path, "--documents", "3", "--chunks-per-document", "400", "--restarts", "1")
    first, restart = result["starts"]
    assert first["vectors"] == restart["vectors"] == 1200 and restart["kind"] == "hnsw"
    assert result["same_rows"] and result["index_gib"] > 0
    assert "bm25_build_s" in restart and "graph_build_s" in restart


def test_incremental_commit_adds_and_deletes_a_document(tmp_path):
    result = run("incremental_commit", tmp_path, "--documents", "3", "--chunks-per-document", "300", "--rounds", "1",
                 "--queries", "5", "--bulk", "3")
    assert result["evidence"] == 900  # the added document was deleted again
    assert result["bulk"]["documents"] == 3 and result["bulk"]["wall_s"] >= result["bulk"]["commits_s"] > 0
    assert result["bulk_durable"]["documents"] == 3 and result["bulk_durable"]["wall_s"] >= result["bulk_durable"]["commits_s"] > 0
    (round_,) = result["rounds"]
    assert round_["commit_s"] > 0 and round_["first_query_ms"] > 0 and round_["first_query_after_delete_ms"] > 0
    assert set(result["cold_builds_s"]) == {"lexical", "page_lexical", "graph", "node_evidence"}


def test_own_time_reports_every_route_the_first_queries_and_a_profile(tmp_path):
    result = run("own_time", tmp_path, "--documents", "3", "--chunks-per-document", "200", "--queries", "12", "--profile",
                 "--index", "flat", "--commits", "2")
    assert result["evidence"] == 760  # 3 x 200, and the two 80-chunk documents committed during the run
    assert len(result["commits"]) == 2 and all(r["published_s"] >= r["commit_s"] > 0 for r in result["commits"])
    for route in ("simple", "moderate", "complex"):
        summary = result["routes"][route]
        assert summary["own"]["count"] == 12 and summary["own"]["p50_ms"] > 0
        assert summary["evidence_p50"] >= 1  # the stand-in embedder makes the extractive answer cite something
        assert {"dense", "answer", "fusion"} <= set(summary["stages_p50_ms"]) and summary["conversion_p50_ms"] > 0
    assert result["simple_at_once"]["own"]["count"] == 12
    assert result["first_after_start_ms"] > 0 and result["first_after_commit_ms"] > 0
    assert result["first_question_steady_ms"] > 0 and all(r["same_question_steady_ms"] > 0 for r in result["commits"])
    assert result["first_after_commit_vs_same_question"] > 0
    assert all(result["sentences_ab"][variant]["count"] == 12 for variant in ("stored", "cut"))
    for route in ("moderate", "complex"):  # numba is a project dependency
        assert all(result["pagerank_ab"][route][variant]["count"] == 12 for variant in ("compiled", "scipy"))
    assert "retrieve" in result["profile_simple"]["retrieval"] and "QueryPipeline.run" in result["profile_simple"]["pipeline"]
    for route in ("simple", "complex"):  # through the real gRPC service, from a client in another process
        through = result["through_grpc"][route]
        assert through["seen_by_client"]["count"] == through["server_own"]["count"] == 12
        assert through["wall"]["p50_ms"] > through["seen_by_client"]["p50_ms"] > 0 and through["server_own"]["p50_ms"] > 0
