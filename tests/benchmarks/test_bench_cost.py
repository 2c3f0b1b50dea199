"""Cost per query: model-seconds from Triton's compute deltas or the orchestrator's call times, priced by the table."""

from __future__ import annotations

import pytest

from thinkserve_bench.query_costs import (
    ORCHESTRATOR,
    TRITON,
    Usage,
    model_seconds,
    query_cost,
    savings,
    summarize_costs,
    usd_per_query_at_rate,
)
from thinkserve_bench.prices import BenchSettings, DeploymentPrice, PriceTable, TokenPrice, config_hash
from orchestrator.api.convert import model_stats
from orchestrator.triton.models import model_statistics
from thinkserve_bench.record import QueryRecord
from thinkserve_bench.summary import paired_ok, server_totals
from thinkserve_bench.triton_stats import ModelCounters, Snapshot, Topology, parse_statistics
from orchestrator.errors import ConfigurationError

# $3.60 per core-hour, one core per model: exactly $0.001 per model-second.
PRICES = PriceTable(
    deployment="test",
    deployments={"test": DeploymentPrice(unit="cpu_core", usd_per_unit_hour=3.6, units_per_model=1, units_per_deployment=2)},
    hosted={
        "llm": TokenPrice(input_usd_per_million=0.15, output_usd_per_million=0.60),
        "text_embedder": TokenPrice(input_usd_per_million=0.02),
    },
)
USAGE = [
    Usage("text_embedder", "embed", 1, 1, 10, 0, 10.0),
    Usage("text_embedder", "answer", 1, 16, 40, 0, 30.0),
    Usage("llm", "llm", 1, 1, 1000, 100, 1000.0),
    Usage("reranker", "rerank", 1, 4, 500, 0, 120.0),  # no hosted price: listed as unpriced
]


def test_model_seconds_prefer_triton_compute_except_for_streaming_models():
    server = {"text_embedder": ModelCounters(requests=2, compute_ns=25_000_000), "llm": ModelCounters(requests=1, compute_ns=80_000_000)}
    seconds, sources = model_seconds(USAGE, server, decoupled={"llm"})
    # text_embedder: Triton's 25 ms, not the orchestrator's 40 ms; llm: Triton sees 80 ms of a 1 s stream
    assert seconds == pytest.approx({"text_embedder": 0.025, "llm": 1.0, "reranker": 0.12})
    assert sources == {"text_embedder": TRITON, "llm": ORCHESTRATOR, "reranker": ORCHESTRATOR}
    seconds, sources = model_seconds(USAGE)
    assert seconds == pytest.approx({"text_embedder": 0.04, "llm": 1.0, "reranker": 0.12})
    assert set(sources.values()) == {ORCHESTRATOR}


def test_query_cost_hand_computed():
    server = {"text_embedder": ModelCounters(requests=2, compute_ns=25_000_000), "reranker": ModelCounters(requests=1, compute_ns=100_000_000)}
    cost = query_cost(USAGE, PRICES, server, decoupled={"llm"})
    # 0.025 + 1.0 + 0.100 model-seconds at $0.001
    assert cost.hardware_usd == pytest.approx(0.001125)
    # llm 1000 x 0.15/1M + 100 x 0.60/1M, embedder 50 x 0.02/1M
    assert cost.hosted_usd == pytest.approx(0.00015 + 0.00006 + 0.000001)
    assert (cost.tokens_in, cost.tokens_out, cost.tokens) == (1550, 100, 1650)
    assert cost.generative_tokens == 1100  # the LLM's 1000 in + 100 out; the encoders' 550 are not billed tokens
    assert cost.unpriced_models == ("reranker",)


def test_summaries_savings_and_capacity():
    cheap = query_cost([Usage("llm", "llm", 1, 1, 100, 10, 200.0)], PRICES)
    dear = query_cost([Usage("llm", "llm", 1, 1, 300, 10, 600.0)], PRICES)
    routed, complex_ = summarize_costs([cheap, dear]), summarize_costs([dear, dear])
    assert routed["hardware_usd_per_query"] == pytest.approx(0.0004)  # (0.2 + 0.6) / 2 s at $0.001
    assert routed["hardware_usd_per_1000_queries"] == pytest.approx(0.4)
    assert routed["tokens_per_query"] == pytest.approx(210.0)  # (110 + 310) / 2
    saved = savings(routed, complex_)
    assert saved["hardware_usd_per_query"] == pytest.approx(1 / 3)
    assert saved["tokens_per_query"] == pytest.approx(1 - 210 / 310)
    # With an encoder's tokens beside the LLM's, the two token figures part: only the LLM's count as generative.
    encoder = Usage("reranker", "rerank", 1, 10, 1000, 0, 50.0)
    light = query_cost([encoder, Usage("llm", "llm", 1, 1, 100, 0, 100.0)], PRICES)
    heavy = query_cost([encoder, Usage("llm", "llm", 1, 1, 400, 0, 400.0)], PRICES)
    saved = savings(summarize_costs([light]), summarize_costs([heavy]))
    assert saved["tokens_per_query"] == pytest.approx(1 - 1100 / 1400)
    assert saved["generative_tokens_per_query"] == pytest.approx(1 - 100 / 400)
    # $7.20/h for the deployment (2 units) at 2 queries/s: 7.2 / 7200
    assert usd_per_query_at_rate(PRICES, 2.0) == pytest.approx(0.001)
    assert usd_per_query_at_rate(PRICES, 0.0) is None
    assert summarize_costs([]) == {"queries": 0}


def _stats(encode_ns: int, tokenize_ns: int, llm_ns: int, batches: dict[int, int], count: int) -> dict:
    def model(name, ns, count, batch_stats=()):
        return {
            "name": name, "version": "1", "execution_count": str(count), "inference_count": str(count),
            "inference_stats": {"success": {"count": str(count)}, "queue": {"ns": "1000000"},
                                "compute_input": {"ns": "0"}, "compute_infer": {"ns": str(ns)}, "compute_output": {"ns": "0"}},
            # the execution time all on the first batch size: only the sum matters here
            "batch_stats": [{"batch_size": str(size), "compute_infer": {"count": str(n), "ns": str(ns if i == 0 else 0)}}
                            for i, (size, n) in enumerate(batch_stats)],
        }
    return {"model_stats": [
        model("text_embedder", encode_ns + tokenize_ns, count),
        model("text_embedder_encode", encode_ns, count, batches.items()),
        model("text_embedder_tokenize", tokenize_ns, count),
        model("llm", llm_ns, 1),
    ]}


def test_series_are_compared_over_the_questions_both_answered():
    def record(question: str, status: str = "ok") -> QueryRecord:
        return QueryRecord(question, "lookup", "c", started_s=0.0, ended_s=1.0, status=status)

    routed = [record("a"), record("b"), record("c", "timeout")]
    complex_ = [record("a"), record("b", "error"), record("c")]
    kept_routed, kept_complex = paired_ok(routed, complex_)
    assert [r.question_id for r in kept_routed] == [r.question_id for r in kept_complex] == ["a"]
    with pytest.raises(ValueError, match="same questions"):
        paired_ok(routed, list(reversed(complex_)))


def test_compute_time_counts_a_batched_execution_once():
    """Triton adds a batched execution's duration to every request's inference_stats; busy time is batch_stats'."""
    # two requests merged into one 30 ms execution: 60 ms per-request compute, 30 ms of busy time
    merged = {"name": "text_embedder_encode", "execution_count": "1", "inference_count": "2",
              "inference_stats": {"success": {"count": "2"}, "queue": {"ns": "4000000"},
                                  "compute_input": {"ns": "2000000"}, "compute_infer": {"ns": "56000000"},
                                  "compute_output": {"ns": "2000000"}},
              "batch_stats": [{"batch_size": "2", "compute_input": {"count": "1", "ns": "1000000"},
                               "compute_infer": {"count": "1", "ns": "28000000"},
                               "compute_output": {"count": "1", "ns": "1000000"}}]}
    ensemble = {"name": "text_embedder", "inference_stats": {"success": {"count": "2"}, "compute_infer": {"ns": "70000000"}}}
    counters = parse_statistics({"model_stats": [merged, ensemble]})
    assert counters["text_embedder_encode"].compute_ms == pytest.approx(30.0)
    assert counters["text_embedder_encode"].request_compute_ns == 60_000_000
    assert counters["text_embedder_encode"].batches == {2: 1}
    assert counters["text_embedder"].compute_ms == pytest.approx(70.0)  # no batch statistics: per-request sums
    row = server_totals([counters])["text_embedder_encode"]
    assert row["compute_ms_per_request"] == pytest.approx(30.0)
    assert row["queue_share"] == pytest.approx(4 / 64)
    # the Stats RPC reports the same busy time
    assert model_stats(model_statistics(merged)).compute_ms == pytest.approx(30.0)
    assert dict(model_stats(model_statistics(merged)).batch_executions) == {2: 1}


def test_triton_snapshots_subtract_and_attribute_leaves_to_public_models():
    before = Snapshot(0.0, parse_statistics(_stats(10_000_000, 1_000_000, 5_000_000, {1: 2, 4: 1}, 3)))
    after = Snapshot(1.0, parse_statistics(_stats(40_000_000, 3_000_000, 5_000_000, {1: 2, 4: 3, 8: 1}, 6)))
    delta = after.since(before)
    assert "llm" not in delta  # no change: left out
    assert delta["text_embedder_encode"].compute_ms == pytest.approx(30.0)
    assert delta["text_embedder_encode"].batches == {4: 2, 8: 1}
    assert delta["text_embedder_encode"].requests == 3 and delta["text_embedder_encode"].queue_ms == 0.0
    topology = Topology({"text_embedder": ("text_embedder_tokenize", "text_embedder_encode")}, frozenset({"llm"}))
    public = topology.by_public_model(delta)
    # the ensemble's own counters are not added to its steps'
    assert set(public) == {"text_embedder"}
    assert public["text_embedder"].compute_ms == pytest.approx(32.0)
    assert topology.owner("llm") == "llm"


def test_bench_settings_file(tmp_path):
    path = tmp_path / "prices.toml"
    path.write_text('deployment = "h100"\n[deployments.h100]\nunit = "gpu"\nusd_per_unit_hour = 2.0\n')
    settings = BenchSettings.load_file(path)
    assert settings.prices.hardware.usd_per_model_second == pytest.approx(2.0 / 3600)
    assert BenchSettings.load_file(None).prices.deployment == "cpu"
    path.write_text('deployment = "tpu"\n')
    with pytest.raises(ConfigurationError, match="tpu"):
        BenchSettings.load_file(path)
    assert config_hash(PRICES) == config_hash(PRICES) != config_hash(PriceTable())
