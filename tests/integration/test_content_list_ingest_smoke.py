"""The content-list ingest benchmark end to end on one generated PDF: MinerU once (then the cache), the full ingest
and the plain loop against the session's real Triton, over the same pages, and a report with the goal lines."""

from __future__ import annotations

import json

import pytest

from thinkserve_bench.command import main as benchmark
from thinkserve_bench.scripts import content_list_ingest
from thinkserve_bench.corpora import pdf_factory

pytestmark = pytest.mark.integration


def test_both_passes_ingest_the_same_pages_and_the_report_says_whether_the_goals_hold(triton, model_repository, tmp_path):
    documents = tmp_path / "dataset" / "documents"
    documents.mkdir(parents=True)
    pdf_factory.write_long_chunk_report(documents / "review.pdf", fact_page=2)
    config = tmp_path / "settings.toml"
    config.write_text(f'[triton]\nmodel_repository = "{model_repository}"\n')
    arguments = ["--dataset", str(tmp_path / "dataset"), "--rounds", "1", "--concurrency", "1", "--config", str(config),
                 "--triton-url", triton.endpoints.grpc, "--cache", str(tmp_path / "cache"), "--output", str(tmp_path),
                 "--name", "smoke"]
    assert benchmark(["content_list_ingest", *arguments]) == 0
    cached = json.loads((tmp_path / "cache" / content_list_ingest.PARSE_RECORD).read_text())
    assert cached["review.pdf"]["pdf_pages"] == 5 and (tmp_path / "cache" / "review.zip").is_file()

    stats = json.loads((tmp_path / "smoke.json").read_text())["stats"]
    full, plain = stats["passes"]  # one round, one document in flight: A then B, no B'
    assert (full["pass"], plain["pass"]) == ("full", "plain") and full["pages"] == plain["pages"] == 5
    assert plain["vectors"] > 0 and full["passages"] > 0 and full["already_present"] == 0
    assert full["triton_batch_sizes"]["text_embedder_encode"] and not full["triton_batch_sizes"]["page_image_clip_encode"]
    summary = stats["summary"]
    assert summary["full_vs_plain"] == pytest.approx(full["pages_per_s"] / plain["pages_per_s"])
    assert stats["collection"]["loaded"]["evidence"] == full["passages"] + full["units"]
    markdown = (tmp_path / "smoke.md").read_text()
    assert "3.5 pages/s" in markdown and ("**met**" in markdown or "**not met**" in markdown)

    # a second run finds the cached content list and parses nothing again
    assert benchmark(["content_list_ingest", *arguments]) == 0
    assert json.loads((tmp_path / "cache" / content_list_ingest.PARSE_RECORD).read_text()) == cached
