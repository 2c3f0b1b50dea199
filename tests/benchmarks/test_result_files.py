"""Committed benchmark results: raw JSON over the limit is committed gzipped (benchmarks/results/README.md) so the tree
stays small enough to travel to the GPU machine, and every reader finds a result by the name the run wrote."""

from __future__ import annotations

import gzip
import json
import subprocess

from thinkserve_bench.result_files import COMMITTED_RAW_LIMIT, committed_path, read_json
from tests.conftest import ROOT


def _tracked(pattern: str) -> list[str]:
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "benchmarks/results"], capture_output=True, check=True)
    return [name for name in listed.stdout.decode().split("\0") if name.endswith(pattern)]


def test_no_committed_raw_json_is_over_the_limit():
    large = [name for name in _tracked(".json") if (ROOT / name).stat().st_size > COMMITTED_RAW_LIMIT]
    assert large == [], f"gzip these (gzip -9n FILE): {large}"


def test_every_committed_gzipped_result_reads_back():
    packed = _tracked(".json.gz")
    assert len(packed) >= 30  # the ablations, cost, latency, retrieval and document_qa runs among them
    for name in packed:
        assert isinstance(read_json(ROOT / name), dict), name


def test_a_result_is_found_by_the_name_its_run_wrote(tmp_path):
    plain, payload = tmp_path / "bench-cost.json", {"result": {"mode": "cost"}}
    (tmp_path / "bench-cost.json.gz").write_bytes(gzip.compress(json.dumps(payload).encode()))
    assert committed_path(plain).name == "bench-cost.json.gz" and read_json(plain) == payload
    plain.write_text(json.dumps({"newer": True}))  # a fresh run's plain file wins over the committed one
    assert committed_path(plain) == plain and read_json(plain) == {"newer": True}
    assert read_json(tmp_path / "bench-cost.json.gz") == payload
