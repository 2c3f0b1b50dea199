"""The retrieval-quality benchmark's core, end to end on one small generated document: ingest, every
configuration over gRPC, scores in range, and each configuration's evidence found by its own signals only."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from thinkserve_bench.corpora.quality_corpus import Question, write_quality_corpus
from thinkserve_bench.scripts.retrieval_quality import CONFIGURATIONS, KS, TOP_K, evaluate

pytestmark = pytest.mark.integration

# The retrieval signals each configuration may report in an item's found_by.
ALLOWED_SIGNALS = {"hybrid": {"dense", "sparse", "page_lexical", "graph"}, "dense": {"dense"}, "bm25": {"sparse", "page_lexical"}}


def test_the_benchmark_scores_every_configuration(running_orchestrator, tmp_path):
    corpus = write_quality_corpus(tmp_path, documents=1, pages=3, seed=7)
    first_of_each_type: dict[str, Question] = {}
    for question in corpus.questions:
        first_of_each_type.setdefault(question.type, question)
    corpus = dataclasses.replace(corpus, questions=list(first_of_each_type.values()))
    assert {"paraphrase", "identifier", "entity"} <= {question.type for question in corpus.questions}

    stats = asyncio.run(evaluate(running_orchestrator.address, "quality-smoke", corpus))

    assert set(stats["configurations"]) == set(CONFIGURATIONS)
    assert [d["pages"] for d in stats["documents"]] == [3]
    assert len(stats["questions"]) == len(corpus.questions) and stats["queries"] == len(corpus.questions) * len(CONFIGURATIONS)
    for result in stats["questions"]:
        assert set(result["configurations"]) == set(CONFIGURATIONS)
        for name, run in result["configurations"].items():
            assert run["route"] in ("simple", "moderate", "complex")
            assert len(run["ranked"]) <= TOP_K
            assert run["ranked"] or name == "bm25"  # BM25 alone finds nothing when only stop words are shared
            for item in run["ranked"]:
                assert item["document"] == corpus.files[0].name and all(0 <= page < 3 for page in item["pages"])
                assert item["found_by"] and set(item["found_by"]) <= ALLOWED_SIGNALS[name]
                assert all(0.0 <= value <= 1.0 for value in item["signals"].values())
            assert run["hit@1"] <= run["hit@5"]
    recall = stats["recall"]
    assert recall["all"]["questions"] == len(corpus.questions)
    for row in recall.values():
        for name in CONFIGURATIONS:
            assert all(0.0 <= row[name][f"recall@{k}"] <= 1.0 for k in KS)
    assert recall["all"]["hybrid"]["recall@5"] > 0
    assert set(stats["hybrid_versus_single"]) == {f"{name}@{k}" for name in ("dense", "bm25") for k in KS}
