"""What a question asks for, the values of that type in a sentence, and the short answer cut from the chosen one."""

import numpy as np
import pytest

from orchestrator.pipeline.answer_types import expected_type, short_value, values
from orchestrator.pipeline.extractive import Sentence, choose, content_terms, short_answer


@pytest.mark.parametrize("question, answer_type", [
    ("How many employees did the company have in 2019?", "number"),
    ("How long is the warranty period?", "number"),
    ("What percentage of adults own a smartphone?", "percentage"),
    ("What share of the vote did the party win?", "percentage"),
    ("How much revenue did Amazon make in 2017?", "money"),
    ("What was the total revenue in 2018?", "money"),
    ("When was the agreement signed?", "date"),
    ("In what year did the survey take place?", "date"),
    ("Who is the chief executive of 3M?", "person"),
    ("Which company acquired Whole Foods?", "organisation"),
    ("Where is the company headquartered?", "place"),
    ("Which country has the highest score?", "place"),
    ("Does the headset support Bluetooth 5.0?", "yes_no"),
    ("Is the proposed method better than the baseline?", "yes_no"),
    ("What is total liabilities for Costco in FY 2021?", "money"),
    ("What is the company's FY2017 cash balance to total liability ratio?", "number"),
    ("What was the effective tax rate? Round your answer to three decimal places.", "number"),
    ("What is the change of gross margin? Answer in percentage terms.", "percentage"),
    ("What is the main contribution of the paper?", "other"),
    ("Describe the setup of the experiment.", "other"),
])
def test_the_expected_answer_type_is_read_from_the_questions_wording(question, answer_type):
    assert expected_type(question) == answer_type


SALES = "Net sales were $177.9 billion in 2017, up 31% from $136.0 billion in 2016, said Jeff Bezos in Seattle."


@pytest.mark.parametrize("answer_type, found", [
    ("money", ["$177.9 billion", "$136.0 billion"]),
    ("percentage", ["31%"]),
    ("date", ["2017", "2016"]),
    ("number", ["177.9 billion", "31", "136.0 billion"]),  # years are dates, not counts
    ("person", ["Jeff Bezos"]),
    ("yes_no", []),
    ("other", []),
])
def test_values_of_each_type_are_found_with_their_units_and_scales(answer_type, found):
    assert [v.text for v in values(SALES, answer_type)] == found
    assert all(SALES[v.start:v.end] == v.text for v in values(SALES, answer_type))


@pytest.mark.parametrize("sentence, answer_type, found", [
    ("The contract was signed on March 3, 2021 in Oslo.", "date", ["March 3, 2021"]),
    ("Results for Q3 2015 and FY2016 are shown.", "date", ["Q3 2015", "FY2016"]),
    ("About 4.5 per cent of staff left.", "percentage", ["4.5 per cent"]),
    ("The fund holds EUR 12 million and 300 dollars.", "money", ["EUR 12 million", "300 dollars"]),
    ("Twelve people attended, and three left early.", "number", ["Twelve", "three"]),
    ("Total liabilities 41,190 in 2021 against 36,851 in 2020.", "money", ["41,190", "36,851"]),  # no sign in tables
])
def test_values_in_the_forms_documents_write_them(sentence, answer_type, found):
    assert [v.text for v in values(sentence, answer_type)] == found


def test_the_short_value_is_the_one_closest_to_the_questions_words_and_not_one_the_question_names():
    question = "How much were net sales in 2017?"
    value = short_value(SALES, "money", content_terms(question))
    assert (value.text, SALES[value.start:value.end]) == ("$177.9 billion", "$177.9 billion")
    # the question names 2017: a date answer is the other year, not the one it repeats
    assert short_value(SALES, "date", content_terms("When were net sales $136.0 billion, before 2017?")).text == "2016"
    assert short_value("Nothing of the kind here.", "money", content_terms(question)) is None


def test_the_short_answer_comes_with_its_sentence_and_span_and_yes_no_only_when_plainly_stated():
    chosen = [(Sentence("Revenue grew across the regions.", 1, 0), 0.9), (Sentence("Revenue reached $4.2 million in 2024.", 2, 0), 0.8)]
    short = short_answer("How much revenue did the company make?", chosen)
    assert (short.text, short.answer_type, short.citation) == ("$4.2 million", "money", 1)
    assert chosen[1][0].text[short.start:short.end] == "$4.2 million"
    assert short_answer("What is the main theme?", chosen) is None  # "other": no short answer

    supports = [(Sentence("The headset supports Bluetooth 5.0 and USB-C charging.", 1, 0), 0.9)]
    lacks = [(Sentence("The headset does not support Bluetooth 5.0 pairing.", 1, 0), 0.9)]
    unrelated = [(Sentence("The box holds a cable and a manual.", 1, 0), 0.9)]
    question = "Does the headset support Bluetooth 5.0?"
    yes, no = short_answer(question, supports), short_answer(question, lacks)
    assert (yes.text, yes.answer_type, yes.start, yes.end) == ("Yes", "yes_no", 0, len(supports[0][0].text))
    assert no.text == "No"
    assert short_answer(question, unrelated) is None  # it says nothing plainly about the question


def test_the_extractive_answer_and_its_short_answer_on_a_sentence_set():
    sentences = [Sentence("The survey asked 1,500 adults about the economy.", 1, 0),
                 Sentence("Of them, 62% said the economy was getting worse.", 1, 1),
                 Sentence("The survey was fielded in May 2018.", 2, 0)]
    similarities = np.array([0.55, 0.50, 0.30])
    question = "What percentage of adults said the economy was getting worse?"
    chosen = choose(question, sentences, similarities, 3, 0.3, 0.15)
    assert [(s.rank, s.position) for s, _ in chosen] == [(1, 0), (1, 1)]
    short = short_answer(question, chosen)  # the best-scoring chosen sentence holding a percentage
    assert (short.text, short.citation) == ("62%", 1)
    when = choose("When was the survey fielded?", sentences, np.array([0.40, 0.35, 0.60]), 3, 0.3, 0.15)
    assert short_answer("When was the survey fielded?", when).text == "May 2018"
