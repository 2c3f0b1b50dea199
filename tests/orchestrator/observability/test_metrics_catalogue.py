"""The documented list of metrics (docs/operations.md) is the registry's: generated from it, and checked here so it
cannot drift."""

from orchestrator.observability.metrics import catalogue, catalogue_markdown
from tests.conftest import ROOT


def test_the_docs_list_exactly_the_registrys_series():
    page = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    assert catalogue_markdown() in page, "docs/operations.md's metrics table is stale: make docs"


def test_the_catalogue_names_series_as_they_are_scraped():
    rows = {series: (kind, labels) for series, kind, labels, _ in catalogue()}
    assert rows["thinkserve_triton_retries_total"] == ("counter", ())  # a collector's counter: scraped with _total
    assert rows["thinkserve_requests_total"] == ("counter", ("method", "code"))
    assert rows["thinkserve_stage_time_ms"] == ("histogram", ("stage",))
    assert rows["thinkserve_model_breaker_open"] == ("gauge", ("model",))
    assert "retrieval_time_ms" in rows and "rag_ttft_ms" in rows
