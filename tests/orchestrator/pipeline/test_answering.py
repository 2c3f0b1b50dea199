"""The pure parts of answering: the extractive answerer's choice, the pruner and judger arithmetic, prompts."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from orchestrator.knowledge.parsing.chunking import Span
from orchestrator.knowledge.storage.segments import EvidenceRecord
from orchestrator.pipeline.events import EvidenceItem
from orchestrator.pipeline.extractive import Sentence, candidate_sentences, choose, compose, shortlist, word_overlap
from orchestrator.prompts import answer_prompt, cited_ranks, decoupler_prompt, evidence_block
from orchestrator.config import UncertaintySettings
from orchestrator.errors import TritonUnavailableError
from orchestrator.pipeline.accounting import QueryLedger, StageModels
from orchestrator.pipeline.evidence import answering_order
from orchestrator.pipeline.uncertainty import deliberate, judger_threshold, prune
from orchestrator.models.protocol import GenerationOptions
from orchestrator.models.protocol import GeneratorFacts, mean_entropy_nats
from thinkserve_backend.sampling import choose_token
from tests.model_double import CHATML, InProcessModels


def item(rank: int, text: str, kind: str = "chunk", section: str = "", perception: str = "", page: int = 0) -> EvidenceItem:
    record = EvidenceRecord(f"d:{kind[0]}{rank}", "d", "report.pdf", kind, "text" if kind == "chunk" else "table", text,
                            section, (Span(rank, page, (0, 0, 1000, 100)),))
    return EvidenceItem(rank, 1.0 / rank, record, perception=perception)


def test_candidate_sentences_skip_headings_fragments_and_repeats():
    items = [
        item(1, "Financial results\n\nTotal revenue was 412 million euros in 2024. Net profit was 44 million euros.",
             section="Report > Financial results"),
        item(2, "Letter from the chief executive\n\nTotal revenue was 412 million euros in 2024. It rose.",
             perception="The table lists revenue by region for three regions."),
    ]
    sentences = candidate_sentences(items, headings={"Letter from the chief executive"})
    assert [(s.rank, s.position, s.text) for s in sentences] == [
        (1, 0, "Total revenue was 412 million euros in 2024."),
        (1, 1, "Net profit was 44 million euros."),
        (2, 0, "The table lists revenue by region for three regions."),  # the VLM's description counts too
    ]


def test_shortlist_prefers_shared_words_then_evidence_order():
    sentences = [Sentence("The weather was fine all year.", 1, 0), Sentence("Revenue grew in Asia.", 2, 0),
                 Sentence("Revenue and profit grew in Asia.", 3, 0)]
    assert word_overlap("Where did revenue grow?", "Revenue grew in Asia.") == 0.5  # revenue yes, grow != grew
    assert [s.rank for s in shortlist("Where did revenue grow?", sentences, 2)] == [2, 3]


def test_choose_keeps_the_best_sentences_near_the_top_in_evidence_order():
    sentences = [Sentence(f"Sentence number {i} about revenue.", rank, i) for i, rank in enumerate([3, 1, 2, 1])]
    similarities = np.array([0.70, 0.60, 0.20, 0.65])
    chosen = choose("revenue?", sentences, similarities, count=3, floor=0.3, margin=0.15)
    # every sentence shares "revenue" (bonus 0.15); 0.20 + 0.15 is more than 0.15 below the best (0.85)
    assert [(s.rank, s.position) for s, _ in chosen] == [(1, 1), (1, 3), (3, 0)]
    assert [round(score, 2) for _, score in chosen] == [0.75, 0.8, 0.85]
    assert compose(chosen) == (
        "Sentence number 1 about revenue. [1] Sentence number 3 about revenue. [1] Sentence number 0 about revenue. [3]", (1, 3),
    )
    assert choose("revenue?", sentences, np.array([0.0, 0.0, 0.0, 0.0]), 3, floor=0.3, margin=1.0) == []
    # without an embedder: shared words alone, sentences sharing none are left out
    lexical = choose("profit?", sentences + [Sentence("Profit rose sharply this year.", 4, 0)], None, 3, 0.3, 0.15)
    assert [s.rank for s, _ in lexical] == [4]


def test_pruner_keeps_the_smallest_sufficient_prefix_within_capacity():
    assert prune([0.9, 0.7, 0.5, 0.4], capacity=4, sufficiency=1.5) == (2, pytest.approx(1.6))
    assert prune([0.3, 0.3, 0.3], capacity=2, sufficiency=1.5) == (2, pytest.approx(0.6))  # never past capacity
    assert prune([0.2, -0.5, 0.2], capacity=5, sufficiency=1.5) == (3, pytest.approx(0.4))  # negatives add nothing
    assert prune([2.0], capacity=0, sufficiency=1.5) == (1, 2.0)  # at least one


def test_judger_entropy_is_the_mean_token_entropy_in_nats():
    vocabulary = 1000
    assert mean_entropy_nats([0.9, 0.7, 0.8], vocabulary) == pytest.approx(0.8 * np.log(vocabulary))
    assert mean_entropy_nats([], vocabulary) == pytest.approx(np.log(vocabulary))  # no tokens: as uncertain as can be


def test_the_judger_threshold_means_the_same_with_a_real_size_vocabulary():
    """Qwen2's 151,936 logits, as the served generator's sampler reads them: a confident step (90% on one token,
    the rest on 20 others) and a lost one (spread evenly over 2,000 tokens). Divided by ln(151,936) = 11.93, the
    lost step is 0.64, under the old 0.8: it was never flagged. In nats the two are 0.55 and 7.6, either side
    of any threshold a build calibrates (thinkserve_build.calibration)."""
    vocabulary = 151_936
    rng = np.random.default_rng(0)
    confident = np.full(vocabulary, -1e9, np.float32)
    confident[:21] = np.log([0.9] + [0.1 / 20] * 20)
    lost = np.full(vocabulary, -1e9, np.float32)
    lost[:2000] = 0.0
    steps = {name: choose_token(logits, 0.0, 1.0, rng).normalized_entropy for name, logits in (("confident", confident), ("lost", lost))}
    assert steps["lost"] == pytest.approx(np.log(2000) / np.log(vocabulary), abs=1e-6) and steps["lost"] < 0.8
    nats = {name: mean_entropy_nats([value] * 16, vocabulary) for name, value in steps.items()}
    assert nats["confident"] == pytest.approx(-(0.9 * np.log(0.9) + 0.1 * np.log(0.1 / 20)), abs=1e-4)  # 0.55
    assert nats["lost"] == pytest.approx(np.log(2000), abs=1e-4)  # 7.60
    threshold = judger_threshold(UncertaintySettings(), GeneratorFacts(8192, vocabulary=vocabulary, judger_entropy_nats=2.0))
    assert nats["confident"] < threshold < nats["lost"]


def test_the_judger_threshold_comes_from_the_setting_else_from_the_model():
    facts = GeneratorFacts(2048, vocabulary=4099, judger_entropy_nats=4.2)
    assert judger_threshold(UncertaintySettings(), facts) == 4.2
    assert judger_threshold(UncertaintySettings(threshold_nats=1.5), facts) == 1.5
    with pytest.raises(TritonUnavailableError, match="judger_entropy_nats.*rebuild the model repository"):
        judger_threshold(UncertaintySettings(), GeneratorFacts(2048, vocabulary=4099))


def test_prompts_carry_the_evidence_its_perception_and_the_instruction():
    evidence = [item(1, "Revenue was 412 million euros.", section="Results", page=2),
                item(2, "Table: Revenue by region", kind="unit", perception="North 1250, South 980.")]
    assert evidence_block(evidence[0]) == "[1] (report.pdf, page 3, Results)\nRevenue was 412 million euros."
    assert evidence_block(evidence[1]) == "[2] (report.pdf, page 1, table)\nTable: Revenue by region\nVisual description: North 1250, South 980."
    words = lambda text: len(text.split())  # noqa: E731 - a token counter for the arithmetic
    prompt, used = answer_prompt(CHATML, "How much?", evidence, 1000, words, "Show the steps.", ("What is A?",), notes="[1] 412 M")
    assert used == evidence and "Show the steps." in prompt and "It breaks down into: What is A?" in prompt
    assert prompt.index("Details found in the evidence:\n[1] 412 M") < prompt.index("Question: How much?")
    whole, _ = answer_prompt(CHATML, "How much?", evidence, 1000, words)
    tight, used = answer_prompt(CHATML, "How much?", evidence, words(whole) - 3, words)
    assert used == evidence[:1]  # the second entry did not fit: dropped whole, never cut
    assert "Do not answer the question" in decoupler_prompt(CHATML, "How much?", evidence, "", 1000, words)
    assert cited_ranks("As [2] and [1] say, and [2] again, not [9].", {1, 2}) == [2, 1]


def page_item(rank: int, page: int, relevance: float = 0.9) -> EvidenceItem:
    record = EvidenceRecord(f"d:p{page}", "d", "report.pdf", "page", "page", "", "", (Span(-1, page, (0, 0, 1000, 1000)),),
                            asset=f"d/page-{page:04d}.jpg")
    return EvidenceItem(rank, relevance, record)


def test_pages_the_filter_kept_come_right_after_the_best_text_and_keep_their_ranks():
    items = [item(1, "a"), item(2, "b"), item(3, "c"), page_item(4, 7), page_item(5, 9)]
    assert [i.rank for i in answering_order(items)] == [1, 4, 5, 2, 3]
    assert answering_order(items[:3]) == items[:3]
    assert [i.rank for i in answering_order(items[3:])] == [4, 5]


def test_with_eight_text_candidates_the_pages_still_reach_the_probe_and_the_answer():
    """The Complex route keeps 8 text items: before, the pruner cut at 8 items and the pages (ranked 9 and 10)
    never reached the LLM."""
    evidence = [item(rank, f"Text {rank} about revenue.") for rank in range(1, 9)] + [page_item(9, 3), page_item(10, 5)]
    models = InProcessModels(entropy=lambda prompt: 0.1)
    stage = StageModels(models, QueryLedger(), "uncertainty", lambda texts: 0)
    deliberation = asyncio.run(deliberate(
        stage, "What was revenue?", evidence, UncertaintySettings(sufficiency=100.0), 8,
        GenerationOptions(max_tokens=8), 1500, four_chars, "",  10.0,
    ))
    assert [i.rank for i in deliberation.evidence] == [1, 9, 10, 2, 3, 4, 5, 6, 7, 8]
    assert deliberation.report.evidence_used == 10
    probe = models.generations[0].prompt
    assert "[9] (report.pdf, page 4, page)" in probe and "[10] (report.pdf, page 6, page)" in probe
    assert probe.index("[9] (") < probe.index("[2] (")  # reserved places survive a budget cut from the end


def four_chars(text: str) -> int:
    return -(-len(text) // 4)


def test_a_generator_without_entropies_is_an_error_not_a_certain_answer():
    """An engine that measures no entropy streams NaN (thinkserve_backend.trtllm): the judger must not read that as
    confident (NaN > threshold is False); the query then answers extractively, saying why."""
    from orchestrator.errors import ModelExecutionError

    models = InProcessModels(entropy=lambda prompt: float("nan"))
    stage = StageModels(models, QueryLedger(), "uncertainty", lambda texts: 0)
    with pytest.raises(ModelExecutionError, match="without entropies"):
        asyncio.run(deliberate(
            stage, "What was revenue?", [item(1, "Revenue was 4 million.")], UncertaintySettings(), 8,
            GenerationOptions(max_tokens=8), 1500, four_chars, "", 10.0,
        ))


def test_the_hybrid_answer_rests_on_the_cited_evidences_sentence_sharing_most_of_its_words():
    from orchestrator.pipeline.hybrid import grounded, reader_lines

    chosen = [(Sentence("Revenue was 412 million euros in 2024.", 1, 0), 0.9),
              (Sentence("Staff numbered 1,250 at the end of 2024.", 1, 1), 0.5),
              (Sentence("Contoso opened three warehouses.", 2, 0), 0.4)]
    assert reader_lines(chosen) == [(1, "Revenue was 412 million euros in 2024."), (1, "Staff numbered 1,250 at the end of 2024."),
                                    (2, "Contoso opened three warehouses.")]
    assert [s.text for s, _ in grounded("1,250 staff [1], and Contoso [2].", chosen)] == [
        "Staff numbered 1,250 at the end of 2024.", "Contoso opened three warehouses."]
    assert [s.text for s, _ in grounded("It had 1,250 staff.", chosen)] == ["Staff numbered 1,250 at the end of 2024."]
    assert grounded("Nobody knows.", chosen) == [] and grounded("Three [7].", chosen) == [chosen[2]]  # [7] is no evidence
