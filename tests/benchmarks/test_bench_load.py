"""Load accounting on synthetic records: what ends inside the window counts, rejections are not errors, goodput
honours the SLO, and the sweep stops at saturation."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from thinkserve_bench.query_costs import Usage
from thinkserve_bench.modes.load import level_report, saturated
from thinkserve_bench.prices import BenchSettings
from thinkserve_bench.record import ERROR, OK, REJECTED, QueryRecord
from thinkserve_bench.triton_stats import Topology


class _Window:
    t0, t1 = 10.0, 20.0
    server = None
    wall_s = 10.0

    def generator(self, in_process: bool) -> dict:
        return {"cpu_cores": 0.1, "shares_process_with_server": in_process}


def _record(ended: float, status: str = OK, latency_ms: float = 100.0) -> QueryRecord:
    record = QueryRecord("q", "lookup", "c", started_s=ended - latency_ms / 1000, ended_s=ended, status=status)
    if status == OK:
        record.client_ms = latency_ms
        record.timings = {"total": latency_ms * 0.9, "rag_ttft": latency_ms * 0.8}
        record.usage = [Usage("text_embedder", "embed", 1, 1, 10, 0, 36.0)]
    return record


def test_level_counts_only_the_window_and_separates_rejections():
    session = SimpleNamespace(settings=BenchSettings(slo_ms=1000.0), topology=Topology({}, frozenset()), target_in_process=False)
    records = [
        _record(9.5),  # ended before the window: warm-up
        *[_record(11.0 + i) for i in range(6)],
        _record(17.5, latency_ms=2500.0),  # over the SLO
        _record(18.0, REJECTED), _record(18.5, REJECTED),
        _record(19.0, ERROR),
        _record(21.0),  # ended after the window
    ]
    report = level_report(session, records, _Window(), "closed c=4", {"concurrency": 4})
    assert (report["completed"], report["rejected"], report["errors"]) == (7, 2, 1)
    assert report["throughput_qps"] == pytest.approx(0.7)
    assert report["goodput_qps"] == pytest.approx(0.6) and report["goodput_share"] == pytest.approx(6 / 7)
    assert report["latency"]["client"]["count"] == 7 and report["latency"]["statuses"] == {"ok": 7, "rejected": 2, "error": 1}
    # no Triton statistics: every model-second is the orchestrator's measured call time (36 ms per query)
    assert report["cost"]["model_seconds_per_query"] == pytest.approx(0.036)
    # c7i default: $0.0892/h for the 2-core machine over 0.7 q/s
    assert report["cost"]["usd_per_query_at_throughput"] == pytest.approx(0.0446 * 2 / (0.7 * 3600))


def test_the_sweep_stops_at_saturation_or_failures():
    def level(c, qps, rejected=0, errors=0):
        return {"concurrency": c, "throughput_qps": qps, "completed": 100, "rejected": rejected, "errors": errors}

    assert saturated(None, level(1, 1.0), 0.10) is None
    assert saturated(level(1, 1.0), level(2, 1.5), 0.10) is None
    assert "less than 10%" in saturated(level(2, 1.5), level(4, 1.6), 0.10)
    assert "rejected" in saturated(level(2, 1.5), level(4, 3.0, rejected=10), 0.10)
    # levels that finish nothing inside their windows (a window shorter than a query) stop the sweep too
    def nothing(c):
        return {"concurrency": c, "throughput_qps": 0.0, "completed": 0, "rejected": 0, "errors": 0}

    assert "less than 10%" in saturated(nothing(1), nothing(2), 0.10)


def test_open_loop_latency_follows_the_queries_due_in_the_window():
    """Under overload the latest arrivals wait longest and end after the window: they must stay in the sample."""
    session = SimpleNamespace(settings=BenchSettings(slo_ms=1000.0), topology=Topology({}, frozenset()), target_in_process=False)
    served_early = _record(10.5, latency_ms=2000.0)  # due at 8.5, in the warm-up
    queued = [_record(12.0 + i, latency_ms=1000.0 * (i + 1)) for i in range(6)]  # all due at 11.0, ending one by one
    late = [_record(24.0 + i, latency_ms=9000.0 + 1000.0 * i) for i in range(3)]  # due at 15.0, ended after the window
    records = [served_early, *queued, *late]
    due = [r for r in records if _Window.t0 <= r.started_s <= _Window.t1]
    by_end = level_report(session, records, _Window(), "open", {})
    by_due = level_report(session, records, _Window(), "open", {}, latency_records=due)
    assert by_end["completed"] == by_due["completed"] == 7  # throughput still counts what ended inside the window
    assert by_due["latency"]["client"]["count"] == 9
    assert by_due["latency"]["client"]["max_ms"] == 11000.0
    assert by_end["latency"]["client"]["max_ms"] == 6000.0  # what choosing by end time would have reported
