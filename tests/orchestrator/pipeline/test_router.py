import pytest

from orchestrator.pipeline.router import INSTRUCTIONS, decide, label_from_score, matched_entities, query_features, sub_questions

ENTITIES = {"northwind", "asia-pacific", "aurora spectrometer", "brno"}


def test_a_plain_lookup_is_simple():
    features = query_features("Who became chief executive in 2024?", ENTITIES)
    assert (features.intent, features.intents, features.entities) == ("lookup", (), ())
    assert (features.visual_references, features.constraints, features.dependency_cues, features.questions) == (0, 1, 0, 1)
    assert features.score == 0.0 and features.modalities == {}  # a date alone makes no lookup harder
    decision = decide("Who became chief executive in 2024?", features, "features")
    assert (decision.label, decision.source, decision.probabilities) == ("simple", "features", (1.0, 0.0, 0.0))
    assert decision.sub_questions == () and decision.instruction == INSTRUCTIONS["simple"]


def test_written_lookups_with_dates_numbers_entities_and_charts_stay_simple():
    for question in (
        "What was the total amount of accrued liabilities of Northwind as of December 31, 2022?",
        "How much revenue did the Aurora Spectrometer line earn in Brno in fiscal 2023, in millions of dollars?",
        "According to the chart on page 14, how much time was spent with family and friends in 2010?",
        "What is the value of the Asia-Pacific segment in Table 3 for the year ended 2021?",
    ):
        features = query_features(question, ENTITIES)
        assert features.intent == "lookup" and features.questions == 1, question
        assert features.constraints >= 1 and features.score == 0.0, question  # reported, but no reasoning to weigh
        assert decide(question, features, "features").label == "simple", question
    # the same elements raise a question that reasons: a comparison naming a year, two entities and a table
    comparison = query_features("Did Northwind earn more than Brno in 2023, according to Table 3?", ENTITIES)
    assert comparison.intent == "comparison" and comparison.entities == ("northwind", "brno")
    assert comparison.score == pytest.approx(1.5 + 0.5 + 0.75 + 1.0)  # intent, a second entity, a table, constraints
    assert decide("Did Northwind earn more than Brno in 2023, according to Table 3?", comparison, "features").label == "moderate"


def test_causal_and_superlative_cues_make_a_question_complex():
    features = query_features("Which region grew the fastest, and why?", ENTITIES)
    assert features.intent == "causal" and features.intents == ("causal", "comparison")
    # causal 2.0 + a second intent 0.5 + two wh-words 2.0
    assert features.score == pytest.approx(4.5)
    assert decide("Which region grew the fastest, and why?", features, "features").label == "complex"


def test_two_questions_in_one_are_moderate_and_split():
    question = "Where is the new factory and when did it start production?"
    features = query_features(question, ENTITIES)
    assert features.questions == 2 and features.score == pytest.approx(2.0)
    decision = decide(question, features, "features")
    assert decision.label == "moderate"
    assert decision.sub_questions == ("Where is the new factory?", "When did it start production?")


def test_entities_are_hard_matched_longest_first_and_possessives_dropped():
    assert matched_entities("What did Northwind's Aurora Spectrometer line earn in Brno?", ENTITIES) == (
        "northwind", "aurora spectrometer", "brno",
    )
    assert matched_entities("What did the aurora earn?", ENTITIES) == ()  # "aurora" alone is not an entity
    assert matched_entities("anything", set()) == ()


def test_visual_references_give_the_modality_preference():
    features = query_features("Compare the revenue of the North and South regions in Table 1 and Figure 2.", ENTITIES)
    assert features.visual_references == 2 and features.intent == "comparison"
    assert features.modalities == {"table": 1.0, "image": 1.0, "chart": 1.0}
    chart = query_features("What does the chart show?", ENTITIES)
    assert chart.modalities == {"chart": 1.0, "image": 0.8}


def test_thresholds_and_the_other_modes():
    assert [label_from_score(s, 2.0, 4.0) for s in (0.0, 1.99, 2.0, 3.99, 4.0, 9.0)] == [
        "simple", "simple", "moderate", "moderate", "complex", "complex",
    ]
    features = query_features("What is the margin?", ENTITIES)
    fixed = decide("What is the margin?", features, "fixed", fixed_route="complex")
    assert (fixed.label, fixed.source, fixed.probabilities) == ("complex", "fixed", (0.0, 0.0, 1.0))
    model = decide("What is the margin?", features, "model", model_probabilities=[0.2, 0.5, 0.3])
    assert (model.label, model.source, model.probabilities) == ("moderate", "model", (0.2, 0.5, 0.3))
    with pytest.raises(ValueError, match="three probabilities"):
        decide("What is the margin?", features, "model")


def test_decomposition_follows_the_route_policy_and_its_limit():
    question = "Where is the new factory and when did it start production?"
    features = query_features(question, ENTITIES)
    assert decide(question, features, "features", decompose={"moderate": False}).sub_questions == ()
    assert sub_questions(question, 1) == ("Where is the new factory?",)
    assert sub_questions("What is the margin?", 3) == ()
