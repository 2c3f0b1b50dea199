"""The real-document benchmark's core on three generated PDFs in MMLongBench-Doc's layout (one page of one a
picture of words, no text layer): MinerU alone, ingest over gRPC, both baselines over MinerU's text and over the
stored text with OCR's, Retrieve and Query per question, the ablations, scores worked out by hand, OCR coverage
and the questions only OCR can find, and the results file scored again by --rescore."""

from __future__ import annotations

import asyncio
import gzip
import json

import pytest

from thinkserve_bench.scripts.document_qa import ABLATIONS, evaluate, parse_only, report, rescore, settings_record
from thinkserve_bench.scripts.qa_dataset import load_questions
from orchestrator.config import Settings
from thinkserve_bench.corpora import pdf_factory
from tests.integration.test_ocr import scanned_pdf

pytestmark = pytest.mark.integration


def test_the_benchmark_scores_retrieval_answers_and_refusals(running_orchestrator, triton, model_repository, tmp_path):
    documents = tmp_path / "dataset" / "documents"
    documents.mkdir(parents=True)
    pdf_factory.write_long_chunk_report(documents / "review.pdf", fact_page=2)
    pdf_factory.write_sample_report(documents / "report.pdf")
    scanned_pdf(documents / "inspection.pdf")
    rows = [
        {"doc_id": "review.pdf", "question": "How much was the Halvorsen turbine contract signed for?",
         "answer": "7.4 million kroner", "evidence_pages": "[3]", "evidence_sources": "['Pure-text (Plain-text)']",
         "answer_format": "Str"},
        {"doc_id": "report.pdf", "question": "How much did Northwind Traders grow its annual revenue to in 2024?",
         "answer": "48 million euros", "evidence_pages": "[1]", "evidence_sources": "['Pure-text (Plain-text)']",
         "answer_format": "Str"},
        {"doc_id": "report.pdf", "question": "What is the phone number of the Northwind head office?",
         "answer": "Not answerable", "evidence_pages": "[]", "evidence_sources": "[]", "answer_format": "None"},
        {"doc_id": "inspection.pdf", "question": "When did the Aarhus warehouse pass its fire inspection?",
         "answer": "14 March 2024", "evidence_pages": "[2]", "evidence_sources": "['Pure-text (Plain-text)']",
         "answer_format": "Str"},
    ]
    (tmp_path / "dataset" / "questions.json").write_text(json.dumps(rows))
    questions = load_questions(tmp_path / "dataset")
    paths = [documents / "review.pdf", documents / "report.pdf", documents / "inspection.pdf"]
    settings = Settings.load(None, {"triton.model_repository": str(model_repository),
                                    "storage.data_dir": str(running_orchestrator.data_dir)})

    parsed = parse_only(settings, paths, tmp_path / "parse", lambda _: None)
    assert [parsed[p.name]["pages"] for p in paths] == [5, 3, 2] and pdf_factory.DEEP_FACT in parsed["review.pdf"]["texts"][2]
    assert parsed["inspection.pdf"]["texts"][1] == ""  # MinerU alone reads nothing on the picture of words
    stats = asyncio.run(evaluate(running_orchestrator.address, triton.endpoints.grpc, settings, paths, questions, parsed,
                                 top_k=10, concurrency=2, ablations=True, progress=lambda _: None))

    assert stats["pages"] == 10 and stats["ingested_documents"] == 3 and stats["ingest_pages_per_s"] > 0
    fact, revenue, unanswerable, inspection = (stats["runs"][str(q.id)] for q in questions)
    scanned = stats["documents"]["inspection.pdf"]
    assert scanned["pages_without_text_layer"] == [1] and scanned["ocr_text_pages"] == [1] and scanned["ocr"]["pages"] == 1
    assert inspection["ranked_pages"][0] == 1 and "14 March 2024" in inspection["answer"]
    only_ocr = stats["baselines"][str(questions[3].id)]
    assert only_ocr["bm25_pages"] == [] and only_ocr["bm25_pages_ocr"][0] == 1  # the baseline over the stored text finds it
    assert fact["ranked_pages"][0] == 2 and revenue["ranked_pages"][0] == 0  # the page each fact is printed on
    assert stats["baselines"]["0"]["bm25_pages"][0] == 2 and stats["baselines"]["1"]["dense_passages"][0] == 0
    assert set(fact["ablations"]) == set(ABLATIONS) and all(fact["ablations"].values())
    assert fact["citations"][0]["page"] == 2 and len(fact["citations"][0]["regions"]) == 1
    assert "7.4 million kroner" in fact["answer"] and "48 million euros" in revenue["answer"]
    assert revenue["short_answer"] == "48 million euros"  # "how much ... revenue": the amount alone

    scores = stats["scores"]
    assert (scores["questions"], scores["answerable_with_pages"]) == (4, 3)
    for system in ("thinkserve", "bm25_pages_ocr", "dense_passages_ocr", "ablation: graph off"):
        assert scores["retrieval"]["all"][system]["recall@10"] == 1.0, system
    without_text = scores["retrieval_without_text_layer"]
    assert without_text["questions"] == 1 and without_text["thinkserve"]["recall@1"] == 1.0
    assert without_text["bm25_pages"]["recall@10"] == 0.0 and without_text["bm25_pages_ocr"]["recall@1"] == 1.0
    assert scores["retrieval"]["all"]["thinkserve"] == {"recall@1": 1.0, "recall@5": 1.0, "recall@10": 1.0, "mrr@10": 1.0}
    assert scores["first_citation"] == {"answerable": 3, "cited": 3, "on_evidence_page_of_cited": 1.0, "on_evidence_page_of_answerable": 1.0}
    assert scores["answer_accuracy"]["short_answers"] == 3 and scores["answer_accuracy"]["contains_answer"] == 1.0
    refusal = scores["refusal"]["declined (refusal or nothing cited)"]
    assert refusal["unanswerable"] == 1 and refusal["declined"] == int(unanswerable["answer_source"] == "refusal" or not unanswerable["citations"])
    assert sum(scores["routes"].values()) == 4 and scores["latency_ms"]["retrieve"]["p50"] > 0
    sweep = scores["refusal_by_best_cosine"]
    assert sweep["thresholds"]["0.2"]["unanswerable"] == 1 and 0.0 <= sweep["auc"] <= 1.0

    stats = {**stats, "parse_only_seconds": 1.0, "parse_only_pages_per_s": 8.0}  # what measure() adds
    payload, markdown = report(stats, settings_record(settings), tmp_path / "dataset", "document_qa", 10, 2, 1.0, {})
    assert "default settings" in markdown and "Refusing when Retrieve's best cosine is below t" in markdown
    # the review's last page has no text layer either (a picture): OCR reads both
    assert "- 2 of 10 pages have no text layer; 2 of them (100.0%) got OCR text" in markdown
    results = tmp_path / "document_qa.json"
    results.write_text(json.dumps(payload))
    again, markdown_again = rescore(results, questions, tmp_path / "dataset", "document_qa --rescore document_qa.json")
    assert again["stats"]["scores"] == json.loads(json.dumps(scores))
    assert "(scored again; measured by `document_qa`" in markdown_again
    packed = tmp_path / "document_qa.json.gz"  # how the larger results are committed
    packed.write_bytes(gzip.compress(results.read_bytes()))
    assert rescore(packed, questions, tmp_path / "dataset", "again")[0]["stats"]["scores"] == again["stats"]["scores"]
