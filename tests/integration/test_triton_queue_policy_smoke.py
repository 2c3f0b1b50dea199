"""benchmarks/thinkserve_bench/scripts/triton_queue_policy.py, small, against the real tritonserver: both copies
served (one with the queue policy the build wrote before, one without), every burst answered, the report written."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from thinkserve_bench.command import main as benchmark
from thinkserve_bench.result_files import read_json
from thinkserve_bench.scripts.triton_queue_policy import COPIES, serve_copies

pytestmark = pytest.mark.integration


def test_the_copies_differ_only_in_the_queue_policy(model_repository, tmp_path):
    serve_copies(model_repository, tmp_path)
    parsed = {copy: text_format.Parse((tmp_path / copy / "config.pbtxt").read_text(), mc.ModelConfig()) for copy in COPIES}
    policy = parsed["with_policy"].dynamic_batching.default_queue_policy
    assert policy.max_queue_size == 1024 and policy.default_timeout_microseconds and policy.allow_timeout_override
    assert not parsed["without_policy"].dynamic_batching.HasField("default_queue_policy")
    parsed["with_policy"].dynamic_batching.ClearField("default_queue_policy")
    parsed["with_policy"].name = parsed["without_policy"].name
    assert parsed["with_policy"] == parsed["without_policy"]
    assert (tmp_path / "with_policy" / "1").is_dir() and (tmp_path / "without_policy" / "1").is_dir()


def test_the_benchmark_runs_bursts_on_both_copies(triton_settings, tmp_path):
    benchmark(["triton_queue_policy", "--bursts", "3", "--concurrency", "2", "4",
               "--model-environment", str(triton_settings.model_environment), "--output", str(tmp_path), "--name", "smoke"])
    levels = read_json(tmp_path / "smoke.json")["result"]["levels"]
    assert [level["concurrency"] for level in levels] == [2, 4]
    for level in levels:
        for copy in COPIES:
            assert level[copy]["bursts"] == 3 and 0 < level[copy]["slowest_p50_ms"] <= level[copy]["slowest_max_ms"]
            assert level[copy]["stalled_bursts"] <= 3
    assert "| 4 | without_policy |" in (tmp_path / "smoke.md").read_text()
