"""Every `thinkserve-bench` mode for a few seconds against the real deployment (session Triton + orchestrator over
gRPC): the reports exist and their figures hang together (pipeline time within client time, Triton's counters
attributed, forced routes honoured, rates positive, the ceiling measured)."""

from __future__ import annotations

import asyncio
import json

import pytest

from thinkserve_bench.prices import BenchSettings, LoadSettings
from thinkserve_bench.runner import Run
from thinkserve_bench.target import Target, ingest
from orchestrator.config import Settings
from tests.conftest import SAMPLE_DOCUMENT

pytestmark = pytest.mark.integration
COLLECTION = "bench-smoke"
# Cheap queries: no page images, no perception (the VLM dominates a query's time on CPU).
FAST = {"page_images": False, "perception": "off"}
BENCH = BenchSettings(warmup_queries=1, load=LoadSettings(level_seconds=2.0, warmup_seconds=0.5, ceiling_concurrency_max=4))


@pytest.fixture(scope="module")
def target(running_orchestrator, triton):
    asyncio.run(ingest(running_orchestrator.address, COLLECTION, [SAMPLE_DOCUMENT], progress=lambda _: None))
    return Target(running_orchestrator.address, triton.endpoints.grpc, in_process=True)


@pytest.fixture(scope="module")
def workload(target, tmp_path_factory):
    """The generated mix, written as JSONL by the workload mode; every other mode replays it."""
    out = tmp_path_factory.mktemp("bench")
    run = Run("workload", Settings(), BENCH, COLLECTION, questions=2, seed=3, out=out, name="mix",
              mix={"lookup": 1.0, "unanswerable": 1.0}, progress=lambda _: None)
    [path] = asyncio.run(run.against(target, {}))
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and {json.loads(line)["type"] for line in lines} == {"lookup", "unanswerable"}
    return path


def _run(target, workload, tmp_path, mode: str, **fields) -> dict:
    run = Run(mode, Settings(), BENCH, COLLECTION, workload=workload, options=dict(FAST), out=tmp_path, name=mode,
              progress=lambda _: None, **fields)
    paths = asyncio.run(run.against(target, {"documents": [SAMPLE_DOCUMENT.name]}))
    assert (tmp_path / f"{mode}.md").read_text().startswith("# ")
    assert all(path.stat().st_size > 0 for path in paths)
    return json.loads((tmp_path / f"{mode}.json").read_text())


def test_latency(target, workload, tmp_path):
    payload = _run(target, workload, tmp_path, "latency", configs=["routed"], plots=True)
    assert payload["machine"]["logical_cores"] >= 1 and payload["machine"]["config_hash"]
    assert set(payload["plots"]) == {"per-stage waterfall", "latency distribution"}
    routed = payload["result"]["configs"]["routed"]
    assert len(routed["records"]) == 2 and all(r["status"] == "ok" for r in routed["records"])
    for record in routed["records"]:
        assert 0 < record["timings"]["total"] <= record["client_ms"]  # the pipeline's time is within the client's
        assert record["cost"]["hardware_usd"] > 0
        assert record["server"]["text_embedder_encode"]["requests"] >= 1  # Triton saw this query's embedding
    summary = routed["summary"]
    assert summary["client"]["p50_ms"] <= summary["client"]["p99_ms"]
    assert "triton_compute" in {source.split(":")[1] for source in summary["cost"]["sources"]}


def test_cost_routed_against_complex(target, workload, tmp_path):
    payload = _run(target, workload, tmp_path, "cost", plots=False)
    result = payload["result"]
    assert {r["route"] for r in result["configs"]["complex"]["records"]} == {"complex"}
    assert {r["route_source"] for r in result["configs"]["complex"]["records"]} == {"fixed"}
    assert set(result["saving_routed_vs_complex"]) >= {"hardware_usd_per_query", "tokens_per_query"}
    assert result["configs"]["complex"]["summary"]["cost"]["hardware_usd_per_1000_queries"] > 0


def test_load_with_ceiling(target, workload, tmp_path):
    payload = _run(target, workload, tmp_path, "load", concurrency=[1, 2], qps=[1.0], plots=True)
    result = payload["result"]
    assert [level["concurrency"] for level in result["closed_loop"]] == [1, 2]
    for level in result["closed_loop"] + result["open_loop"]:
        assert level["completed"] > 0 and level["throughput_qps"] > 0 and level["errors"] == 0
        assert level["goodput_qps"] <= level["throughput_qps"]
        assert level["generator"]["cpu_cores"] > 0 and level["generator"]["shares_process_with_server"]
        assert level["server"]["text_embedder_encode"]["executions"] > 0
    assert result["open_loop"][0]["generator"]["send_lateness"]["count"] > 0
    ceiling = result["ceiling"]
    assert ceiling["best_qps"] > 0 and 0 < ceiling["fraction"]
    # swept at least to the end-to-end best level, with the pipeline's order of calls
    assert max(lv["concurrency"] for lv in ceiling["levels"]) >= result["best_closed_loop"]["concurrency"]
    assert ceiling["schedules"] and all(s.startswith("embed:text_embedder") for s in ceiling["schedules"])
    paired = ceiling["paired"]  # end to end and ceiling alternating at their best levels
    assert [len(paired["windows"][side]) for side in ("end_to_end", "ceiling")] == [2, 2]
    assert paired["end_to_end_qps"] > 0 and paired["ceiling_qps"] > 0 and ceiling["fraction"] == paired["fraction"]
    assert ceiling["calls_per_query"]["text_embedder"]["calls"] >= 1
    assert ceiling["compute_s_per_query"]["replay"]["text_embedder_encode"] > 0  # the replay's fidelity is measured
    assert (tmp_path / "load-latency-throughput.png").stat().st_size > 0


def test_ablations(target, workload, tmp_path):
    payload = _run(target, workload, tmp_path, "ablations", ablations=["no graph"], plots=False)
    configs = payload["result"]["configs"]
    assert list(configs) == ["complex (all stages)", "no graph"]
    assert configs["complex (all stages)"]["versus_baseline"]["latency_p50"] == pytest.approx(1.0)
    assert "graph" in configs["complex (all stages)"]["summary"]["stages"]
    assert "graph" not in configs["no graph"]["summary"]["stages"]
    for data in configs.values():
        recall = data["recall"]
        assert recall["questions"] == 1 and 0.0 <= recall["recall"] <= 1.0  # the unanswerable one has no pages


def test_ablations_with_a_deployment_variant(target, workload, triton_settings, tmp_path):
    """A second Triton + orchestrator serving the repository without dynamic batching, in the same run: its
    queries are interleaved with the baseline's, and the throughput windows measure both deployments."""
    from thinkserve_bench.variants import NO_BATCHING, variant_targets
    from orchestrator.triton.client import TritonClient
    from tests.conftest import settings_with

    async def main() -> dict:
        settings = settings_with(triton_settings, tmp_path / "data")
        async with variant_targets(settings, [NO_BATCHING], [SAMPLE_DOCUMENT], COLLECTION, tmp_path, progress=lambda _: None) as variants:
            variant_target = variants[NO_BATCHING][0]
            for url, batching in ((target.triton_url, True), (variant_target.triton_url, False)):
                client = TritonClient(url, default_timeout_s=30)
                try:
                    assert (await client.model_config("text_embedder_encode")).HasField("dynamic_batching") is batching
                finally:
                    await client.close()
            run = Run("ablations", Settings(), BENCH, COLLECTION, workload=workload, options=dict(FAST), out=tmp_path,
                      name="ablations", progress=lambda _: None, ablations=[NO_BATCHING], throughput_concurrency=2, plots=False)
            run.variants = variants
            await run.against(target, {})
        return json.loads((tmp_path / "ablations.json").read_text())

    result = asyncio.run(main())["result"]
    assert list(result["configs"]) == ["complex (all stages)", NO_BATCHING] and result["deployment_variants"] == [NO_BATCHING]
    variant = result["configs"][NO_BATCHING]
    assert "text_embedder_encode" in variant["deployment"]["models_changed"]
    assert all(r["status"] == "ok" and r["route"] == "complex" for r in variant["records"])
    assert variant["records"][0]["server"]["text_embedder_encode"]["requests"] >= 1  # its own Triton's statistics
    throughput = result["throughput"]
    assert set(throughput) == {"complex (all stages)", NO_BATCHING}
    assert all(row["windows"] == 2 and row["throughput_qps"] > 0 for row in throughput.values())
    assert throughput["complex (all stages)"]["versus_baseline"] == pytest.approx(1.0)
    assert result["not_in_this_run"] == []  # the int8 variant was not asked for
