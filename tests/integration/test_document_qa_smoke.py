"""The real-document benchmark's core on two generated PDFs in MMLongBench-Doc's layout: MinerU alone, ingest
over gRPC, both baselines, Retrieve and Query per question, the ablations, scores worked out by hand, and the
results file scored again by --rescore."""

from __future__ import annotations

import asyncio
import json

import pytest

from benchmarks.document_qa import ABLATIONS, evaluate, parse_only, report, rescore, settings_record
from benchmarks.qa_dataset import load_questions
from orchestrator.config import Settings
from orchestrator.bench.generated import pdf_factory

pytestmark = pytest.mark.integration


def test_the_benchmark_scores_retrieval_answers_and_refusals(running_orchestrator, triton, model_repository, tmp_path):
    documents = tmp_path / "dataset" / "documents"
    documents.mkdir(parents=True)
    pdf_factory.write_long_chunk_report(documents / "review.pdf", fact_page=2)
    pdf_factory.write_sample_report(documents / "report.pdf")
    rows = [
        {"doc_id": "review.pdf", "question": "How much was the Halvorsen turbine contract signed for?",
         "answer": "7.4 million kroner", "evidence_pages": "[3]", "evidence_sources": "['Pure-text (Plain-text)']",
         "answer_format": "Str"},
        {"doc_id": "report.pdf", "question": "How much did Northwind Traders grow its annual revenue to in 2024?",
         "answer": "48 million euros", "evidence_pages": "[1]", "evidence_sources": "['Pure-text (Plain-text)']",
         "answer_format": "Str"},
        {"doc_id": "report.pdf", "question": "What is the phone number of the Northwind head office?",
         "answer": "Not answerable", "evidence_pages": "[]", "evidence_sources": "[]", "answer_format": "None"},
    ]
    (tmp_path / "dataset" / "questions.json").write_text(json.dumps(rows))
    questions = load_questions(tmp_path / "dataset")
    paths = [documents / "review.pdf", documents / "report.pdf"]
    settings = Settings.load(None, {"triton.model_repository": str(model_repository)})

    parsed = parse_only(settings, paths, tmp_path / "parse", lambda _: None)
    assert [parsed[p.name]["pages"] for p in paths] == [5, 3] and pdf_factory.DEEP_FACT in parsed["review.pdf"]["texts"][2]
    stats = asyncio.run(evaluate(running_orchestrator.address, triton.endpoints.grpc, settings, paths, questions, parsed,
                                 top_k=10, concurrency=2, ablations=True, progress=lambda _: None))

    assert stats["pages"] == 8 and stats["ingested_documents"] == 2 and stats["ingest_pages_per_s"] > 0
    fact, revenue, unanswerable = (stats["runs"][str(q.id)] for q in questions)
    assert fact["ranked_pages"][0] == 2 and revenue["ranked_pages"][0] == 0  # the page each fact is printed on
    assert stats["baselines"]["0"]["bm25_pages"][0] == 2 and stats["baselines"]["1"]["dense_passages"][0] == 0
    assert set(fact["ablations"]) == set(ABLATIONS) and all(fact["ablations"].values())
    assert fact["citations"][0]["page"] == 2 and len(fact["citations"][0]["regions"]) == 1
    assert "7.4 million kroner" in fact["answer"] and "48 million euros" in revenue["answer"]

    scores = stats["scores"]
    assert (scores["questions"], scores["answerable_with_pages"]) == (3, 2)
    for system in ("thinkserve", "bm25_pages", "dense_passages", "ablation: graph off"):
        assert scores["retrieval"]["all"][system]["recall@10"] == 1.0, system
    assert scores["retrieval"]["all"]["thinkserve"] == {"recall@1": 1.0, "recall@5": 1.0, "recall@10": 1.0, "mrr@10": 1.0}
    assert scores["first_citation"] == {"answerable": 2, "cited": 2, "on_evidence_page_of_cited": 1.0, "on_evidence_page_of_answerable": 1.0}
    assert scores["answer_accuracy"]["short_answers"] == 2 and scores["answer_accuracy"]["contains_answer"] == 1.0
    refusal = scores["refusal"]["declined (refusal or nothing cited)"]
    assert refusal["unanswerable"] == 1 and refusal["declined"] == int(unanswerable["answer_source"] == "refusal" or not unanswerable["citations"])
    assert sum(scores["routes"].values()) == 3 and scores["latency_ms"]["retrieve"]["p50"] > 0
    sweep = scores["refusal_by_best_cosine"]
    assert sweep["thresholds"]["0.2"]["unanswerable"] == 1 and 0.0 <= sweep["auc"] <= 1.0

    stats = {**stats, "parse_only_seconds": 1.0, "parse_only_pages_per_s": 8.0}  # what measure() adds
    payload, markdown = report(stats, settings_record(settings), tmp_path / "dataset", "document_qa", 10, 2, 1.0, {})
    assert "default settings" in markdown and "Refusing when Retrieve's best cosine is below t" in markdown
    results = tmp_path / "document_qa.json"
    results.write_text(json.dumps(payload))
    again, markdown_again = rescore(results, questions, tmp_path / "dataset", "document_qa --rescore document_qa.json")
    assert again["stats"]["scores"] == json.loads(json.dumps(scores))
    assert "(scored again; measured by `document_qa`" in markdown_again
