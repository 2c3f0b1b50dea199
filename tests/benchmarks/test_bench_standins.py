"""The stand-in cost model: call shapes from a cost run's usage, seconds per query, and the mode end to end on
toy-size stand-ins (the same transformers classes as the realistic ones, built and run in torch)."""

from __future__ import annotations

import json

import pytest

from thinkserve_bench.call_shapes import (
    CallShape,
    distinct_shapes,
    query_calls,
    query_seconds,
    routed_saving,
    row_shape,
    series_cost,
)
from thinkserve_bench.modes.standin_costs import device_deployment, source_image_tokens
from thinkserve_bench.prices import PriceTable
from thinkserve_build.standins import image_positions, standins
from orchestrator.pipeline.accounting import ModelUsage


def test_row_shapes_by_kind():
    # encoder: 15 pairs of 1,905 tokens in one call -> 127 tokens per row, rounded up to 128
    assert row_shape(ModelUsage("reranker", "rerank", 1, 15, 1905, 0, 1.0), 36) == CallShape("reranker", 15, 128)
    # two calls of 3 items: the mean call
    assert row_shape(ModelUsage("text_embedder", "answer", 2, 6, 60, 0, 1.0), 36) == CallShape("text_embedder", 3, 16)
    # relevance: one image per row, the question's tokens
    assert row_shape(ModelUsage("vlm_relevance", "vlm_filter", 1, 11, 165, 0, 1.0), 36) == CallShape("vlm_relevance", 11, 16, 1)
    # generation: 4 calls of 1 prompt + 1 image each (8 items); 848 prompt tokens hold 4 x 36 image positions:
    # (848 - 144) / 4 = 176 text tokens -> 192; 384 generated / 4 = 96 per call
    assert row_shape(ModelUsage("vlm", "perception", 4, 8, 848, 384, 1.0), 36) == CallShape("vlm", 1, 192, 1, 96)
    assert row_shape(ModelUsage("llm", "llm", 1, 1, 1450, 64, 1.0), 36) == CallShape("llm", 1, 1472, 0, 64)
    assert row_shape(ModelUsage("page_image_clip", "ingest", 2, 32, 0, 0, 1.0), 36) == CallShape("page_image_clip", 16, 0, 1)
    assert row_shape(ModelUsage("llm", "llm", 0, 0, 0, 0, 0.0), 36) is None


def test_query_seconds_batch_concurrent_queries_and_charge_each_its_share():
    usage = [ModelUsage("reranker", "rerank", 1, 10, 1000, 0, 1.0), ModelUsage("vlm", "perception", 2, 4, 200, 20, 1.0)]
    calls = query_calls(usage, source_image_tokens=0)
    # a timer whose cost is 1 ms per row-token plus 5 ms per call: batching saves the fixed part
    timer = lambda s: 0.005 + 0.001 * s.batch * (s.tokens + s.new_tokens)  # noqa: E731
    alone = query_seconds(calls, timer)
    assert alone["reranker"] == pytest.approx(0.005 + 0.001 * 10 * 112)
    assert alone["vlm"] == pytest.approx(2 * (0.005 + 0.001 * (128 + 10)))  # two calls of 100 tokens (-> 128) + 10
    four = query_seconds(calls, timer, concurrency=4)
    assert four["reranker"] == pytest.approx((0.005 + 0.001 * 40 * 112) / 4)
    assert four["vlm"] < alone["vlm"]
    shapes = distinct_shapes([calls], [1, 4])
    assert CallShape("reranker", 40, 112) in shapes and CallShape("vlm", 1, 128, 1, 10) in shapes and len(shapes) == 4


def test_series_cost_means_raw_queries_and_prices_them():
    routed = series_cost([{"vlm": 1.0}, {"reranker": 0.5}], usd_per_model_second=0.001)
    complex_ = series_cost([{"vlm": 2.0, "reranker": 0.5}, {"vlm": 2.0, "reranker": 0.5}], usd_per_model_second=0.001)
    assert routed.seconds_per_query == pytest.approx(0.75)
    assert routed.seconds_by_model == pytest.approx({"vlm": 0.5, "reranker": 0.25})
    assert routed.usd_per_1000_queries == pytest.approx(0.75)
    assert routed_saving(routed, complex_) == pytest.approx(1 - 0.75 / 2.5)
    assert routed_saving(series_cost([], 0.001), complex_) is None


def test_standins_mirror_the_hf_profile_and_price_by_device(tmp_path):
    from thinkserve_build.profiles import hf

    profile = hf()
    served = {"text_embedder": profile.embedder, "reranker": profile.reranker, "router": profile.llm,  # the LLM asked
              "llm": profile.llm, "vlm": profile.vlm, "vlm_relevance": profile.vlm}
    served.update({f"page_{tower}_{p.family}": p for p in profile.page_encoders for tower in ("text", "image")})
    spec = standins("hf")
    assert set(spec) == set(served)
    for role, model in served.items():
        assert spec[role].mirrors == model.checkpoint.hub_id, role
        if role in ("text_embedder", "reranker") or role.startswith("page_text_"):
            assert spec[role].max_length == model.max_length, role  # the truncation the served model applies
    assert spec["router"].max_length == profile.router.max_question_tokens and spec["router"].prefix_tokens > 50
    assert image_positions(spec["vlm"]) == 729  # SigLIP-so400m at 384 px, patch 14
    prices = PriceTable()
    assert device_deployment("NVIDIA H100 80GB HBM3", prices) == "h100"
    assert device_deployment("cpu", prices) == "cpu"
    repo = tmp_path / "tiny" / "vlm"
    repo.mkdir(parents=True)
    (repo / "config.pbtxt").write_text('parameters {\n  key: "image_tokens_per_image"\n  value {\n    string_value: "36"\n  }\n}\n')
    assert source_image_tokens("tiny", tmp_path) == 36
    assert source_image_tokens("hf", tmp_path) is None


def _cost_payload() -> dict:
    def record(route, usage):
        return {"status": "ok", "route": route, "usage": [dict(model=m, stage=s, calls=c, items=i, tokens_in=t, tokens_out=o,
                                                               model_ms=1.0) for m, s, c, i, t, o in usage]}

    simple = [("text_embedder", "embed", 1, 1, 15, 0), ("reranker", "rerank", 1, 10, 1300, 0)]
    complex_ = simple + [("vlm_relevance", "vlm_filter", 1, 6, 90, 0), ("vlm", "perception", 2, 4, 400, 40),
                         ("llm", "llm", 1, 1, 900, 24)]
    return {"command": "thinkserve-bench cost", "machine": {"cpu": "x", "profile": "tiny"},
            # the third question timed out on the Complex path: it is left out of both series
            "result": {"mode": "cost", "configs": {
                "routed": {"records": [record("simple", simple), record("complex", complex_), record("simple", simple)]},
                "complex": {"records": [record("complex", complex_)] * 2 + [{"status": "timeout", "usage": []}]}}}}


def test_thinkserve_bench_standins_times_toy_standins_end_to_end(tmp_path):
    from thinkserve_bench.command import main

    source = tmp_path / "cost.json"
    source.write_text(json.dumps(_cost_payload()))
    code = main(["standins", "--from-cost", str(source), "--preset", "test", "--device", "cpu", "--repeats", "1",
                 "--source-image-tokens", "36", "--standin-concurrency", "1", "2", "--out", str(tmp_path)])
    assert code == 0
    result = json.loads((tmp_path / "bench-standins.json").read_text())["result"]
    assert result["device"] == "cpu" and result["deployment"] == "cpu"
    assert set(result["standins"]) == {"text_embedder", "reranker", "vlm_relevance", "vlm", "llm"}
    level = result["concurrency"]["1"]
    routed, complex_ = level["series"]["routed"], level["series"]["complex"]
    assert routed["queries"] == complex_["queries"] == 2 and result["source"]["questions"] == 2
    # the simple query ran no VLM or LLM, so routed is cheaper than always-complex on the same calls
    assert 0 < level["saving_routed_vs_complex"] < 1
    assert set(complex_["model_seconds_per_query_by_model"]) == {"text_embedder", "reranker", "vlm_relevance", "vlm", "llm"}
    assert level["routed_by_route"]["simple"]["model_seconds_per_query_by_model"].keys() == {"text_embedder", "reranker"}
    assert routed["usd_per_1000_queries"] > 0
    shapes = {(t["model"], t["batch"]) for t in result["timings"]}
    assert ("reranker", 10) in shapes and ("reranker", 20) in shapes  # alone and two queries batched
    assert all(t["seconds"] > 0 for t in result["timings"])
    text = (tmp_path / "bench-standins.md").read_text()
    assert "Stand-ins, not the served engines" in text and "BAAI/bge-reranker-v2-m3" in text
    assert "Preset `test`: toy dimensions" in text and result["standins"]["vlm"]["class"] == "Qwen2ForCausalLM + SiglipVisionModel"


def test_standins_refuses_a_file_that_is_not_a_cost_result(tmp_path):
    from thinkserve_bench.command import main

    source = tmp_path / "latency.json"
    source.write_text(json.dumps({"result": {"mode": "latency"}}))
    assert main(["standins", "--from-cost", str(source), "--preset", "test", "--out", str(tmp_path)]) != 0
