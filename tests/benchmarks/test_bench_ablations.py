"""Ablation comparisons on synthetic records: ratios to the baseline over the questions both answered, and a
failed query's recall counted as nothing found."""

from __future__ import annotations

import pytest

from thinkserve_bench.modes.ablations import BASELINE, compare_configurations
from thinkserve_bench.record import OK, TIMEOUT, QueryRecord
from thinkserve_bench.workload import ExpectedPage, WorkloadQuestion

QUESTIONS = [WorkloadQuestion(id=f"q{n}", question=f"question {n}", type="lookup",
                              expected_pages=(ExpectedPage(document="report.pdf", page=n),)) for n in (1, 2)]


def _record(question: str, status: str = OK, latency_ms: float = 0.0, pages: tuple[int, ...] = ()) -> QueryRecord:
    record = QueryRecord(question, "lookup", "c", started_s=0.0, ended_s=latency_ms / 1000, status=status)
    if status == OK:
        record.client_ms = latency_ms
        record.evidence_pages = [("report.pdf", [page]) for page in pages]
    return record


def test_ratios_use_the_questions_both_answered_and_failures_find_nothing():
    records = {
        BASELINE: [_record("q1", latency_ms=1000.0, pages=(1,)), _record("q2", latency_ms=3000.0, pages=(2,))],
        "no rerank": [_record("q1", latency_ms=500.0, pages=(1,)), _record("q2", TIMEOUT)],
    }
    options = {BASELINE: {"route": "complex"}, "no rerank": {"route": "complex", "rerank": False}}
    configs = compare_configurations(records, options, QUESTIONS)
    ablated = configs["no rerank"]
    # q1 alone on both sides: 500 vs 1000 ms, not 500 against the baseline's p50 over both questions (2000)
    assert ablated["versus_baseline"]["questions"] == 1
    assert ablated["versus_baseline"]["latency_p50"] == pytest.approx(0.5)
    assert ablated["summary"]["ok"] == 1 and ablated["summary"]["queries"] == 2
    # the timed-out question delivered none of its expected pages
    assert ablated["recall"]["recall"] == pytest.approx(0.5) and ablated["recall"]["questions"] == 2
    assert configs[BASELINE]["recall"]["recall"] == 1.0
    assert configs[BASELINE]["versus_baseline"]["latency_p50"] == 1.0
