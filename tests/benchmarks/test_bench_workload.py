"""The question-mix generator (deterministic, every type, substitutions said) and the JSONL replay format."""

from __future__ import annotations

import dataclasses
import json

import pytest

from thinkserve_bench.workload import (
    QUESTION_TYPES,
    ExpectedPage,
    Passage,
    WorkloadQuestion,
    generate_mix,
    load_jsonl,
    write_jsonl,
)
from orchestrator.errors import ConfigurationError

PASSAGES = [
    Passage("d1:c0", "report-a.pdf", 0, "text", "Overview",
            "Northwind opened a new factory in Porto during March. Helena Varga leads the Porto site and its 400 workers."),
    Passage("d1:c1", "report-a.pdf", 1, "text", "Energy",
            "Energy use at the Leeds warehouse fell by twelve percent after Helena Varga ordered solar panels for the roof."),
    Passage("d1:u0", "report-a.pdf", 2, "table", "Revenue", "Region | Revenue\nEurope | 1,200\nAsia | 930\nAmericas | 410"),
    Passage("d1:u1", "report-a.pdf", 2, "chart", "Revenue", "Figure 2: quarterly shipments of industrial pumps by region"),
    Passage("d2:c0", "notes.md", -1, "text", "Risks",
            "Currency swings and the semiconductor shortage delayed deliveries of the pump controllers to Asian customers."),
]


def test_the_same_passages_and_seed_give_the_same_mix_in_any_order():
    first = generate_mix(PASSAGES, 24, seed=5, collection="c")
    again = generate_mix(list(reversed(PASSAGES)), 24, seed=5, collection="c")
    other = generate_mix(PASSAGES, 24, seed=6, collection="c")
    assert [q.question for q in first.questions] == [q.question for q in again.questions]
    assert [q.question for q in first.questions] != [q.question for q in other.questions]
    assert len(first.questions) == 24 and len({q.id for q in first.questions}) == 24
    assert all(q.collection == "c" for q in first.questions)
    # the same content re-ingested from new bytes (a PDF with a new timestamp): new ids, the same questions
    renamed = [dataclasses.replace(p, passage_id=f"{'f' * (i + 1)}{p.passage_id}") for i, p in enumerate(reversed(PASSAGES))]
    assert [q.question for q in generate_mix(renamed, 24, seed=5, collection="c").questions] == [q.question for q in first.questions]


def test_every_type_with_its_expected_pages():
    mix = generate_mix(PASSAGES, 20, seed=1)
    # 20 x (0.30, 0.15, 0.15, 0.15, 0.10, 0.15) = 6, 3, 3, 3, 2, 3
    assert mix.requested == {"lookup": 6, "comparison": 3, "calculation": 3, "multi_hop": 3, "visual": 2, "unanswerable": 3}
    assert mix.produced == mix.requested and mix.substituted == {}
    by_type = {t: [q for q in mix.questions if q.type == t] for t in QUESTION_TYPES}
    for q in by_type["visual"]:
        assert q.expected_pages == (ExpectedPage(document="report-a.pdf", page=2),) and "chart" in q.question
    for q in by_type["multi_hop"]:  # the only name two passages share
        assert "Helena Varga" in q.question and {p.page for p in q.expected_pages} == {0, 1}
    for q in by_type["comparison"]:
        assert len(q.expected_pages) == 2
    for q in by_type["unanswerable"]:
        assert not q.answerable and q.expected_pages == ()
    assert all(q.answerable and q.expected_pages for t in QUESTION_TYPES if t != "unanswerable" for q in by_type[t])


def test_types_the_collection_lacks_become_lookups_and_say_so():
    text_only = [p for p in PASSAGES if p.block_type == "text" and p.document == "report-a.pdf"]
    mix = generate_mix(text_only, 10, seed=3, mix={"visual": 1.0})
    assert mix.substituted == {"visual": 10} and mix.produced["lookup"] == 10
    with pytest.raises(ConfigurationError):
        generate_mix([], 5, seed=1)
    with pytest.raises(ConfigurationError):
        generate_mix(PASSAGES, 5, seed=1, mix={"riddles": 1.0})


def test_jsonl_round_trip_and_validation(tmp_path):
    mix = generate_mix(PASSAGES, 8, seed=2, collection="c")
    path = write_jsonl(tmp_path / "mix.jsonl", mix.questions)
    assert load_jsonl(path) == mix.questions
    own = tmp_path / "own.jsonl"
    own.write_text(
        "# our questions\n"
        + json.dumps({"question": "Who leads Porto?", "route": "simple", "options": {"rerank": False},
                      "expected_pages": [{"document": "report-a.pdf", "page": 0}]}) + "\n\n"
        + json.dumps({"question": "And Leeds?"}) + "\n"
    )
    loaded = load_jsonl(own, collection="reports")
    assert [q.id for q in loaded] == ["q00002", "q00004"] and {q.collection for q in loaded} == {"reports"}
    assert loaded[0].query_options({"graph": False}) == {"rerank": False, "route": "simple", "graph": False}
    for bad in ({"question": "x", "options": {"rerankk": True}}, {"question": "x", "route": "fast"}, {"text": "x"}):
        own.write_text(json.dumps(bad) + "\n")
        with pytest.raises(ConfigurationError, match="own.jsonl:1"):
            load_jsonl(own)
    with pytest.raises(ValueError):
        WorkloadQuestion(question="")
