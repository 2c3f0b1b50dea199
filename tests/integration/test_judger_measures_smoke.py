"""The judger-measures benchmark on two generated PDFs, over the torch target's LLM as the repository serves it:
both judgers' thresholds and agreement come out, and the bytes each decoding loop moves to the host per token are
exactly the vocabulary's logits before and the three measures after."""

from __future__ import annotations

import json
import math

import pytest

from tests.conftest import ROOT
from thinkserve_bench.corpora import pdf_factory
from thinkserve_bench.command import main as benchmark

pytestmark = pytest.mark.integration

TORCH_REPOSITORY = ROOT / "model_repository" / "tiny-torch"


def test_the_benchmark_compares_the_judgers_and_counts_the_bytes(tmp_path):
    if not (TORCH_REPOSITORY / "llm" / "config.pbtxt").is_file():
        pytest.fail(f"{TORCH_REPOSITORY} is not built: run `make models-torch` (make test does it)")
    documents = tmp_path / "dataset" / "documents"
    documents.mkdir(parents=True)
    pdf_factory.write_sample_report(documents / "report.pdf")
    pdf_factory.write_long_chunk_report(documents / "review.pdf", fact_page=2)
    questions = [
        {"doc_id": "report.pdf", "question": "How much did Northwind grow its revenue to?", "evidence_pages": "[1]"},
        {"doc_id": "review.pdf", "question": "How much was the turbine contract signed for?", "evidence_pages": "[3]"},
        {"doc_id": "report.pdf", "question": "What is the head office's phone number?", "evidence_pages": "[]"},
    ]
    (tmp_path / "dataset" / "questions.json").write_text(json.dumps(questions))
    benchmark(["judger_measures", 
        "--model-repository", str(TORCH_REPOSITORY), "--dataset", str(tmp_path / "dataset"), "--seeds", "0", "1",
        "--transfer-prompts", "2", "--transfer-tokens", "5", "--transfer-repeat", "1", "--out", str(tmp_path / "out"),
    ])
    payload = json.loads((tmp_path / "out" / "judger_measures.json").read_text())
    vocabulary = payload["vocabulary"]
    assert payload["questions"] == 3 and len(payload["records"]) == 3 and payload["calibration_prompts"] >= 16
    agreement = payload["agreement"]
    assert set(agreement["sampled"]) == {"0", "1"}
    assert all(0.0 <= row["agreement"] <= 1.0 for row in agreement["sampled"].values())
    assert 0 < agreement["entropy_threshold"] < math.log(vocabulary)  # nats, below the uniform's
    transfer = payload["transfer"]
    # one step per generated token (the prompt's included, the last token's next step never run)
    assert transfer["host logits (before)"]["bytes_per_token"] == 4 * vocabulary
    assert transfer["device measures (after)"]["bytes_per_token"] == 24
    report = (tmp_path / "out" / "judger_measures.md").read_text()
    assert "agrees with the exact entropy judger" in report and "| 24 |" in report
