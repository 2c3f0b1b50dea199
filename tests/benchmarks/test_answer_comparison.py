"""document_qa's side-by-side answerers and routers: scored per answerer on the same questions, and routers on
MMLongBench-Doc's single-page / cross-page split."""

from thinkserve_bench.scripts.answer_comparison import certainty_signal, report_lines, score_answerers, score_routers
from thinkserve_bench.scripts.qa_dataset import Question

QUESTIONS = [
    Question(0, "a.pdf", "What was revenue?", "412", (2,), ("Table",), "Int"),
    Question(1, "a.pdf", "Who leads?", "Amara Osei", (0, 3), ("Pure-text (Plain-text)",), "Str"),
    Question(2, "a.pdf", "What is the phone number?", "Not answerable", (), (), "None"),
]


def run(answer: str, source: str = "llm", citations=(), finish: str = "eos", short: str = "", llm_ms=None) -> dict:
    return {"answer": answer, "answer_source": source, "finish_reason": finish, "short_answer": short,
            "citations": list(citations), "query_ms": 100.0, "llm_ms": llm_ms}


def test_each_answerer_is_scored_on_the_same_questions_and_the_pairs_say_where_they_differ():
    records = {
        0: {"extractive": run("Revenue was 412 million [1] and costs 300.", "extractive", [2], "extracted", "412 million"),
            "hybrid": run("412 [1]", "hybrid", [5], short="412", llm_ms=800.0)},
        1: {"extractive": run("The board met.", "extractive", [0], "extracted"),
            "hybrid": run("Amara Osei leads it.", "hybrid", [], short="Amara Osei leads it.", llm_ms=1200.0)},
        2: {"extractive": run("Call us.", "extractive", [1], "extracted"),
            "hybrid": run("The evidence does not contain it.", "hybrid", [], "refusal", llm_ms=600.0)},
    }
    scores = score_answerers(QUESTIONS, records)
    extractive, hybrid = scores["answerers"]["extractive"], scores["answerers"]["hybrid"]
    assert (extractive["contains_answer"], hybrid["contains_answer"]) == (0.5, 1.0)
    assert (extractive["short_answer_contains"], hybrid["short_answer_contains"]) == (0.5, 1.0)  # the extractive has none for q 1
    assert extractive["first_citation_on_evidence_of_cited"] == 1.0 and hybrid["first_citation_on_evidence_of_cited"] == 0.0
    assert hybrid["refusal"]["precision"] == 1.0 and hybrid["refusal"]["recall"] == 1.0 and hybrid["false_refusals"] == 0.0
    assert extractive["refusal"]["declined"] == 0 and extractive["llm_ms"] is None
    assert hybrid["llm_ms"]["p50"] == 800.0 and hybrid["llm_ms"]["answers"] == 3
    assert scores["pairs"]["extractive / hybrid"] == {"only_extractive": 0, "only_hybrid": 1, "both": 1}
    assert "| hybrid | 1.000 |" in "\n".join(report_lines(scores, {}))


def test_routers_are_scored_on_single_and_cross_page_evidence():
    records = {0: {"features": {"label": "simple", "probabilities": [], "retrieve_ms": 20.0},
                   "model": {"label": "moderate", "probabilities": [0.2, 0.7, 0.1], "retrieve_ms": 400.0}},
               1: {"features": {"label": "simple", "probabilities": [], "retrieve_ms": 20.0},
                   "model": {"label": "complex", "probabilities": [0.1, 0.2, 0.7], "retrieve_ms": 400.0}},
               2: {"features": {"label": "simple", "probabilities": [], "retrieve_ms": 20.0},
                   "model": {"label": "simple", "probabilities": [0.8, 0.1, 0.1], "retrieve_ms": 400.0}}}
    scores = score_routers(QUESTIONS, records)
    features, model = scores["modes"]["features"], scores["modes"]["model"]
    assert (features["split_accuracy"], model["split_accuracy"]) == (0.5, 0.5)  # the unanswerable one is not scored
    assert (features["single_page_simple"], model["cross_page_not_simple"]) == (1.0, 1.0)
    assert scores["agreement"]["features / model"] == 1 / 3 and model["retrieve_ms_p50"] == 400.0
    assert "| model | complex 1, moderate 1, simple 1 | 0.500 |" in "\n".join(report_lines({}, scores))


def test_a_generated_answers_certainty_is_scored_as_a_refusal_signal_by_document():
    """Forty questions over ten documents, a quarter unanswerable: the answers to those are less certain (lower
    log-probabilities), the served answerability probability says nothing. The certainty separates them, held out
    by document; nothing is scored where nothing was generated."""
    questions, answers, answerability = [], {}, {}
    for i in range(40):
        unanswerable = i % 4 == 0
        questions.append(Question(i, f"doc{i % 10}.pdf", "q", "Not answerable" if unanswerable else "412", () if unanswerable else (1,), (), "Int"))
        log_prob = (-3.0 if unanswerable else -0.5) - 0.01 * i
        answers[i] = {"token_log_probs": [log_prob, log_prob - 0.2], "token_entropies": [0.5, 0.5]}
        answerability[i] = 0.5
    signal = certainty_signal(questions, answers, answerability)
    assert signal["questions"] == 40 and signal["unanswerable"] == 10 and signal["documents"] == 10
    assert signal["features"]["mean_log_prob"] == {"auc": 1.0, "unanswerable": "lower"}
    assert signal["models"]["certainty"]["cv_auc"] > 0.95 and signal["models"]["certainty"]["best_f1"] > 0.9
    assert signal["models"]["answerability"]["cv_auc"] <= 0.6  # a constant says nothing
    assert certainty_signal(questions, {i: {"token_log_probs": []} for i in range(40)}, answerability) is None
    lines = "\n".join(report_lines({**score_answerers(questions[:3], {i: {"llm": run("x")} for i in range(3)}),
                                     "certainty_signal": {"llm": signal}}, {}))
    assert "### What the llm answer's own certainty says of answerability" in lines and "| certainty | " in lines
