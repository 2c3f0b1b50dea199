"""The document-QA benchmark's arithmetic: pages, answer containment, refusal precision and recall."""

import json

import pytest

from thinkserve_bench.scripts.document_qa import _own_time_lines, collection_name, own_time
from thinkserve_bench.scripts.qa_dataset import (Question, contains_answer, load_questions, normalize_answer, page_hits, refusal_scores,
                                   separation_auc)


def test_questions_load_with_zero_based_pages_and_keep_pages_past_the_end(tmp_path):
    rows = [
        {"doc_id": "a.pdf", "question": "How  many?", "answer": "3", "evidence_pages": "[2, 40]",
         "evidence_sources": "['Table', 'Chart']", "answer_format": "Int"},
        {"doc_id": "a.pdf", "question": "Who?", "answer": "Not answerable", "evidence_pages": "[]",
         "evidence_sources": "[]", "answer_format": "None"},
        {"doc_id": "b.pdf", "question": "Which?", "answer": "a rather long answer of seven words", "evidence_pages": "[1]",
         "evidence_sources": "['Pure-text (Plain-text)']", "answer_format": "Str"},
    ]
    (tmp_path / "questions.json").write_text(json.dumps(rows))
    first, unanswerable, long = load_questions(tmp_path)
    assert (first.id, first.text, first.evidence_pages, first.evidence_sources) == (0, "How many?", (1, 39), ("Table", "Chart"))
    assert first.answerable and first.short_answer
    assert not unanswerable.answerable and unanswerable.evidence_pages == () and not unanswerable.short_answer
    assert long.answerable and not long.short_answer  # a sentence, not a value to find


def test_page_hits_count_distinct_pages_in_order():
    assert page_hits([4, 4, 7, 1], {1}) == {"recall@1": 0.0, "recall@5": 1.0, "recall@10": 1.0, "mrr@10": pytest.approx(1 / 3)}
    assert page_hits([9], {9, 2}) == {"recall@1": 1.0, "recall@5": 1.0, "recall@10": 1.0, "mrr@10": 1.0}
    assert page_hits(list(range(20)), {15}) == {"recall@1": 0.0, "recall@5": 0.0, "recall@10": 0.0, "mrr@10": 0.0}
    assert page_hits([], {0})["recall@10"] == 0.0


def test_answers_are_compared_after_normalisation_as_whole_words():
    assert normalize_answer("  $1,234.50 (USD)! ") == "1234.50 usd"
    assert normalize_answer("29.6%") == "29.6" and normalize_answer("End.") == "end"
    assert contains_answer("The capitalization ratio was 29.6 percent in 2023.", "29.6%")
    assert contains_answer("Revenue: 1,234 million", "1234")
    assert contains_answer("It was conceived by the BERLIN School of Experimental Psychology.", "Berlin School of Experimental Psychology")
    assert not contains_answer("In 2012 it rose.", "12")  # not inside another number
    assert not contains_answer("anything", "") and not contains_answer("2.5", "25")


def test_refusal_precision_and_recall_take_unanswerable_questions_as_positives():
    declined = [True, True, False, False, True]
    unanswerable = [True, False, True, False, True]
    assert refusal_scores(declined, unanswerable) == {
        "declined": 3, "unanswerable": 3, "precision": pytest.approx(2 / 3), "recall": pytest.approx(2 / 3),
        "f1": pytest.approx(2 / 3),
    }
    assert refusal_scores([False], [True]) == {"declined": 0, "unanswerable": 1, "precision": None, "recall": 0.0, "f1": 0.0}


def test_collection_names_are_valid_and_distinct():
    names = [collection_name(n, d) for n, d in enumerate(["3M_2018_10K.pdf", "PG_2021.03.04_US-Views-on-China_FINAL.pdf",
                                                         "x" * 200 + ".pdf"])]
    assert names[:2] == ["d00-3m-2018-10k", "d01-pg-2021-03-04-us-views-on-china-final"]
    assert len(names[2]) == 64 and len(set(names)) == 3


def test_separation_auc_counts_positives_scoring_below_negatives_with_ties_half():
    # positives 0.1 and 0.5 against negatives 0.3 and 0.5: 0.1 wins both, 0.5 loses to 0.3 and ties 0.5
    assert separation_auc([0.1, 0.5, 0.3, 0.5], [True, True, False, False]) == pytest.approx(2.5 / 4)
    assert separation_auc([0.1, 0.2], [True, False]) == 1.0
    assert separation_auc([0.1, 0.2], [True, True]) is None


def test_the_own_time_summary_sets_each_collections_first_query_apart():
    questions = [Question(i, doc, f"q{i}", "1", (0,), ("Pure-text",), "Int") for i, doc in enumerate(["a", "a", "a", "b", "b"])]
    own = [40.0, 3.0, 5.0, 30.0, 4.0]
    runs = {i: {"own_ms": ms, "own_ms_by_stage": {"dense": ms / 2, "fusion": 0.1}, "route": "complex" if i == 2 else "simple"}
            for i, ms in enumerate(own)}
    summary = own_time(questions, runs)
    assert summary["first_per_collection"]["questions"] == 2 and summary["first_per_collection"]["p50"] == 35.0
    assert summary["all"]["questions"] == 3 and summary["all"]["p50"] == 4.0 and summary["all"]["stages_p50"]["dense"] == 2.0
    assert summary["simple"]["p50"] == 3.5 and summary["complex"]["p50"] == 5.0
    assert own_time(questions, {i: {"route": "simple"} for i in range(5)}) == {}  # a run recorded before: nothing
    assert "first question of each collection" in _own_time_lines(summary)[0] and _own_time_lines({}) == []
