"""The answerability model: the shipped file, its features as serving computes them and as the training reads
them (the Retrieve response), and the decision the query takes from them."""

from __future__ import annotations

import asyncio
import json
import math
import time

import numpy as np
import pytest

from orchestrator.api.convert import final_answer
from orchestrator.config import Settings
from orchestrator.knowledge.ingest import Ingestor
from orchestrator.knowledge.storage.registry import KnowledgeBase
from orchestrator.models.answerability import FEATURES, LEXICAL_FEATURES, MODEL_FILE, SEMANTIC_FEATURES, AnswerabilityModel, load_models
from orchestrator.pipeline.answerability import answerability_features
from orchestrator.pipeline.events import EvidenceEvent, FinalAnswerEvent
from orchestrator.pipeline.fusion import ScoredCandidate
from orchestrator.pipeline.plan import QueryOptions
from orchestrator.pipeline.query import QueryInput, QueryPipeline
from orchestrator.models.tokens import PlainTokenizer
from tests.conftest import MODEL_REPOSITORY
from tests.model_double import InProcessModels

REPORT = ("# Northwind annual report\n\nNorthwind's revenue was 412 million euros in 2024, up from 380 million.\n\n"
          "## Staff\n\nNorthwind employed 1,250 people at the end of the year in Lisbon.")


def test_the_shipped_file_holds_a_full_and_a_lexical_model_over_the_known_features():
    shipped = load_models()
    assert shipped.version.startswith("v1-")
    assert set(shipped.models) == {"full", "lexical"}
    assert shipped.model("full").features == FEATURES
    assert shipped.model("lexical").features == LEXICAL_FEATURES
    assert not set(SEMANTIC_FEATURES) & set(shipped.model("lexical").features)
    for model in shipped.models.values():
        assert 0 < model.threshold < 1 and np.isfinite(model.coefficients).all()


def test_a_file_with_an_unknown_feature_or_a_bad_threshold_is_refused(tmp_path):
    data = json.loads(MODEL_FILE.read_text())
    data["models"]["full"]["features"][0] = "moon_phase"
    broken = tmp_path / "unknown.json"
    broken.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="moon_phase"):
        load_models(broken)
    data = json.loads(MODEL_FILE.read_text())
    data["models"]["lexical"]["threshold"] = 1.5
    broken = tmp_path / "threshold.json"
    broken.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="not a probability"):
        load_models(broken)


def test_the_probability_is_the_logistic_of_the_standardised_features():
    model = AnswerabilityModel(("best_semantic", "best_lexical"), np.array([0.5, 0.2]), np.array([0.1, 0.4]),
                               np.array([2.0, -1.0]), 0.25, 0.5)
    z = 2.0 * (0.7 - 0.5) / 0.1 - 1.0 * (0.6 - 0.2) / 0.4 + 0.25
    assert model.probability({"best_semantic": 0.7, "best_lexical": 0.6, "ignored": 9.0}) == pytest.approx(1 / (1 + math.exp(-z)))
    assert AnswerabilityModel.from_json(json.loads(json.dumps(model.to_json()))).to_json() == model.to_json()


def test_features_read_the_best_page_the_rare_words_the_numbers_and_the_asked_type(tmp_path):
    config = Settings.load(overrides={"triton": {"model_repository": str(MODEL_REPOSITORY)}})
    knowledge = KnowledgeBase(tmp_path / "data")
    models = InProcessModels()
    asyncio.run(Ingestor(knowledge, models, config.ingest, config.tokenizer_file).ingest("c", "report.md", REPORT.encode()))
    snapshot = knowledge.collection("c").snapshot
    rows = [row for row in range(len(snapshot.evidence)) if "412 million" in snapshot.evidence[row].text]
    ranked = [ScoredCandidate(rows[0], 0.8, 0.9, 0.0, 0.0, 0.7, ("dense", "sparse"), final=0.7, page_lexical=0.5)]
    idf, frequency = snapshot.lexical.idf, snapshot.lexical.document_frequency
    asked = answerability_features("What was Northwind's revenue in 2024?", ranked, 0.8, snapshot, "simple", idf, frequency)
    assert set(asked) == set(FEATURES)
    assert asked["best_semantic"] == 0.8 and asked["best_lexical"] == 0.9 and asked["route_simple"] == 1.0
    assert asked["numbers_asked"] == 1.0 and asked["numbers_on_best_page"] == 1.0  # 2024 is on the page
    assert asked["asked_type_missing"] == 0.0 and asked["top_pages_agree"] == 1.0
    assert asked["rare_terms_on_best_page"] == pytest.approx(1.0)
    assert asked["unseen_terms"] == 0.0 and asked["numbers_in_collection"] == 1.0
    absent = answerability_features("How many penguins did Northwind count in 1987?", ranked, 0.8, snapshot, "moderate", idf, frequency)
    assert absent["numbers_on_best_page"] == 0.0 and absent["numbers_in_collection"] == 0.0 and absent["route_moderate"] == 1.0
    assert absent["rare_terms_on_best_page"] < 0.6 and absent["unseen_terms"] > 0.3
    none = answerability_features("Who founded Contoso?", [], 0.0, snapshot, "simple", idf, frequency)
    assert none["best_semantic"] == 0.0 and none["asked_type_missing"] == 1.0


@pytest.mark.parametrize("lexical", [False, True])
def test_serving_reports_the_features_it_decided_on_and_the_response_carries_them_to_the_training(tmp_path, lexical):
    """What the training reads (the Retrieve response's features) is what the query decided on: the probability
    recomputed from the reported features is the reported one, and the features recomputed on the snapshot are
    the reported ones."""
    config = Settings.load(overrides={"triton": {"model_repository": str(MODEL_REPOSITORY)}})
    knowledge = KnowledgeBase(tmp_path / "data")
    models = InProcessModels()
    pipeline = QueryPipeline(config, models, knowledge, PlainTokenizer(config.tokenizer_file, "ingest.tokenizer"))
    question = "What was Northwind's revenue in 2024?"

    async def go():
        await Ingestor(knowledge, models, config.ingest, config.tokenizer_file).ingest("c", "report.md", REPORT.encode())
        return [event async for event in pipeline.run(QueryInput("c", question, QueryOptions(lexical=lexical or None)),
                                                      time.monotonic() + 30, answer=False)]

    try:
        events = asyncio.run(go())
    finally:
        pipeline.close()
    final = events[-1]
    assert isinstance(final, FinalAnswerEvent)
    report = final.answerability
    mode = "lexical" if lexical else "full"
    assert report.model == f"{load_models().version}/{mode}"
    assert report.probability == pytest.approx(load_models().model(mode).probability(report.features))
    assert report.answerable == (report.probability >= load_models().model(mode).threshold)
    sent = final_answer(final).answerability  # what the Retrieve response carries
    assert dict(sent.features) == pytest.approx(report.features) and sent.model == report.model
    evidence = next(event for event in events if isinstance(event, EvidenceEvent))
    assert evidence.items and set(report.features) == set(FEATURES)


def test_the_similarity_rule_stays_available_and_says_so(tmp_path):
    config = Settings.load(overrides={"triton": {"model_repository": str(MODEL_REPOSITORY)},
                                      "retrieval": {"answerability": "similarity", "min_similarity": 0.99}})
    knowledge = KnowledgeBase(tmp_path / "data")
    models = InProcessModels()
    pipeline = QueryPipeline(config, models, knowledge, PlainTokenizer(config.tokenizer_file, "ingest.tokenizer"))

    async def go():
        await Ingestor(knowledge, models, config.ingest, config.tokenizer_file).ingest("c", "report.md", REPORT.encode())
        return [event async for event in pipeline.run(QueryInput("c", "What was Northwind's revenue?"), time.monotonic() + 30)]

    try:
        final = asyncio.run(go())[-1]
    finally:
        pipeline.close()
    assert final.answer_source == "refusal" and final.finish_reason == "refusal"
    assert final.answerability.model == "similarity" and final.answerability.threshold == 0.99
    assert final.answerability.probability == -1.0 and not final.answerability.answerable


@pytest.mark.parametrize("answer, refused", [
    ("The evidence does not contain the answer to this question.", True),
    ("I cannot answer this from the documents provided.", True),
    ("There is no information about penguins in the evidence.", True),
    ("Not enough information is given to say.", True),
    ("The provided documents do not mention the 2019 budget.", True),
    ("Revenue was 412 million euros [1].", False),
    ("The report says no dividend was paid in 2024 [2].", False),
])
def test_a_generated_answer_that_says_the_evidence_lacks_the_answer_is_recognised(answer, refused):
    from orchestrator.prompts import states_no_answer

    assert states_no_answer(answer) == refused
