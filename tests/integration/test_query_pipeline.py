"""The whole query pipeline over real gRPC, in front of the real Triton, on PDFs MinerU parses.

Triton's own statistics prove which models a route called; citations are checked against the page each fact
was printed on; a second Triton without the LLM proves the degraded answer.
"""

from __future__ import annotations

import asyncio
import math

import pytest

from orchestrator.client import ThinkServeClient
from orchestrator.server.deployment import Deployment
from orchestrator.models import contracts
from orchestrator.triton.client import TritonClient
from thinkserve_bench.corpora import pdf_factory
from tests.conftest import MODEL_REPOSITORY, settings_with
from tests.integration.conftest import BackgroundLoop, event_of, repository_subset
from thinkserve_build.model_config import parse

pytestmark = pytest.mark.integration

COLLECTION = "pipeline"


def llm_parameter(name: str) -> float:
    """A parameter of the built LLM's config.pbtxt, as the build wrote it."""
    return float(parse((MODEL_REPOSITORY / contracts.LLM.name / "config.pbtxt").read_text()).parameters[name].string_value)


@pytest.fixture(scope="module")
def client(running_orchestrator):
    with ThinkServeClient(running_orchestrator.address, timeout_s=300) as client:
        yield client


@pytest.fixture(scope="module")
def report(client, tmp_path_factory):
    """The three-page report (prose on page 1, a table on page 2, a chart on page 3) and, in another
    collection, a document of a different company that answers the same questions differently."""
    folder = tmp_path_factory.mktemp("pipeline")
    sample = pdf_factory.write_sample_report(folder / "northwind-report.pdf")
    client.ingest_file(COLLECTION, sample.path)
    client.ingest(f"{COLLECTION}-other", b"# Contoso\n\nContoso grew its annual revenue to 9 million euros in 2024.", "contoso.md")
    return sample


def successes(statistics: dict) -> int:
    return int(statistics["model_stats"][0].get("inference_stats", {}).get("success", {}).get("count", 0))


def model_counts(triton) -> dict[str, int]:
    async def read():
        async with TritonClient(triton.endpoints.grpc) as client:
            return {c.name: successes(await client.model_statistics(c.name)) for c in contracts.all_contracts()}

    return asyncio.run(read())


def test_every_model_the_complex_route_configures_is_called(client, report, triton):
    before = model_counts(triton)
    events = list(client.query(
        COLLECTION, "Compare the revenue of the regions in the table and explain why East leads.",
        router="model", answerer="llm", max_tokens=8, page_top_m=3, page_top_k=3, rerank=True,
        page_images=True, perception="dpr",  # the tiny profile runs its random page encoders and VLM only when asked
    ))
    called = {name for name, count in model_counts(triton).items() if count > before[name]}

    route = event_of(events, "route")
    assert route.source == "model" and len(route.probabilities) == 3 and sum(route.probabilities) == pytest.approx(1.0, abs=1e-5)
    assert route.intent == "causal" and route.modalities["table"] == 1.0  # features are reported in model mode too
    final = event_of(events, "final")
    stages = {(u.model, u.stage) for u in final.cost.models}
    expected = {"router", "text_embedder", "reranker", *(f"page_text_{f}" for f in contracts.PAGE_ENCODER_FAMILIES), "vlm_relevance", "vlm", "llm"}
    if route.label == "simple":  # the router model has random weights: the simple route skips pages and the loop
        expected -= {*(f"page_text_{f}" for f in contracts.PAGE_ENCODER_FAMILIES), "vlm_relevance"}
    assert called == expected  # Triton's statistics, not the orchestrator's word
    assert {model for model, _ in stages} == expected
    assert ("vlm", "perception") in stages  # the table's image was described (DPR) ...
    evidence = event_of(events, "evidence").items
    described = [item for item in evidence if item.perception]
    assert described and all(item.kind == "unit" and item.asset for item in described)  # ... and the text is there
    assert next(item for item in evidence if item.block_type == "table").page == 1
    if route.label == "complex":
        assert final.HasField("uncertainty") and len(final.uncertainty.entropies) == final.uncertainty.iterations + 1
        ceiling = math.log(llm_parameter(contracts.VOCABULARY_PARAMETER))  # the uniform distribution's entropy
        assert final.uncertainty.iterations <= 2 and 0 <= final.uncertainty.entropies[0] <= ceiling + 1e-3
    assert final.answer_source == "llm" and final.cost.model_ms > 0


def test_the_fixed_complex_route_runs_the_page_filter_and_the_uncertainty_loop(client, report):
    events = list(client.query(COLLECTION, "What does the chart show?", route="complex", answerer="llm", max_tokens=4, page_top_m=3,
                               page_images=True, perception="dpr"))
    route, final = event_of(events, "route"), event_of(events, "final")
    assert (route.label, route.source) == ("complex", "fixed")
    stages = {u.stage: u for u in final.cost.models}
    assert stages["vlm_filter"].model == "vlm_relevance" and stages["vlm_filter"].items == 3  # one page per item, one call
    assert final.answer_source == "llm", final.degraded_reason
    assert {"page_images", "vlm_filter", "uncertainty", "perception", "llm_ttft", "llm_generation"} <= {t.stage for t in final.timings}
    loop = final.uncertainty
    threshold = llm_parameter(contracts.JUDGER_THRESHOLD_PARAMETER)  # calibrated by the build, in nats
    pages = [item for item in event_of(events, "evidence").items if item.kind == "page"]
    assert loop.evidence_used >= 1 + len(pages)  # every page the filter kept reaches the answerer
    assert loop.threshold == pytest.approx(threshold, rel=1e-6)
    assert len(loop.entropies) == loop.iterations + 1 and (loop.iterations == 2 or loop.entropies[-1] <= threshold)


def test_the_tiny_profiles_random_page_encoders_and_vlm_are_not_called_unless_asked(client, report, triton):
    """Its page encoders and VLM have random weights: by default a Complex question calls only the embedder (Triton's
    statistics say so), runs no page-image, page-filter or perception stage, and keeps no page as evidence."""
    before = model_counts(triton)
    events = list(client.query(COLLECTION, "What does the chart show about revenue by region?", route="complex"))
    called = {name for name, count in model_counts(triton).items() if count > before[name]}
    final = event_of(events, "final")
    assert called == {"text_embedder"}
    assert not {"page_images", "vlm_filter", "perception"} & {t.stage for t in final.timings}
    evidence = event_of(events, "evidence").items
    assert evidence and not [item for item in evidence if item.kind == "page" or item.perception]
    assert final.answer_source == "extractive" and not final.degraded


def test_a_unit_brings_the_text_next_to_it_on_its_page(client, report):
    evidence = event_of(list(client.query(COLLECTION, "Table 1: Revenue by region in thousands of euros", top_k=1)), "evidence")
    (table,) = evidence.items
    assert (table.kind, table.block_type, table.page) == ("unit", "table", 1)
    assert any("Sales in the East region remain the largest" in text for text in table.context)


def cited_page(final, fact: str) -> tuple[str, int]:
    """(document, page) of the citation that follows the sentence stating `fact` in the answer."""
    after = final.text[final.text.index(fact):]
    rank = int(after[after.index("[") + 1 : after.index("]")])
    citation = next(c for c in final.citations if c.evidence_rank == rank)
    return citation.document_name, citation.page


def test_citations_point_at_the_page_the_fact_is_printed_on(client, report):
    cases = [
        ("How much did annual revenue grow in the fiscal year 2024?", "48 million euros", 0),
        ("Which distribution centres did the company open during the spring?", "Lyon, Porto and Gdansk", 0),
        ("What do the quarterly shipments in thousands of units show?", "Quarterly shipments in thousands of units", 2),
    ]
    for question, fact, page in cases:
        final = event_of(list(client.query(COLLECTION, question)), "final")
        assert final.answer_source == "extractive" and fact in final.text, (question, final.text)
        assert cited_page(final, fact) == ("northwind-report.pdf", page), (question, final.text)


def test_the_extractive_answer_gives_the_asked_for_value_alone_with_its_place_in_the_quote(client, report):
    """Over gRPC from the real service: the short answer is the amount the question asks for, cut from the quoted
    sentence of the citation it names; a question asking for no particular kind of value gets none."""
    final = event_of(list(client.query(COLLECTION, "How much did annual revenue grow in the fiscal year 2024?")), "final")
    short = final.short_answer
    assert (short.text, short.answer_type) == ("48 million euros", "money")
    quote = final.citations[short.citation].quote
    assert quote[short.start:short.end] == "48 million euros" and "48 million euros" in final.text
    described = event_of(list(client.query(COLLECTION, "Describe the regional table.")), "final")
    assert not described.HasField("short_answer")


def test_each_collection_answers_from_its_own_documents(client, report):
    question = "What was the annual revenue in 2024?"
    own = event_of(list(client.query(COLLECTION, question)), "final")
    other = event_of(list(client.query(f"{COLLECTION}-other", question)), "final")
    assert "48 million euros" in own.text and {c.document_name for c in own.citations} == {"northwind-report.pdf"}
    assert "9 million euros" in other.text and {c.document_name for c in other.citations} == {"contoso.md"}


def test_the_vlm_can_answer_end_to_end_instead(client, report):
    events = list(client.query(COLLECTION, "What does the table of revenue by region show?", perception="end_to_end", max_tokens=6))
    final = event_of(events, "final")
    assert final.answer_source == "vlm" and final.usage.completion_tokens == 6
    assert {u.stage for u in final.cost.models if u.model == "vlm"} == {"vlm_answer"}  # no separate perception step


def test_an_emptied_collection_and_an_unrelated_question_are_refused(client, report):
    client.ingest("emptied", b"# Memo\n\nThe canteen opens at eight.", "memo.md")
    client.delete_document("emptied", "memo.md")
    empty = list(client.query("emptied", "When does the canteen open?"))
    assert event_of(empty, "final").answer_source == "refusal" and not event_of(empty, "evidence").items
    unrelated = event_of(list(client.query(COLLECTION, "How do penguins keep their eggs warm?", answerer="llm")), "final")
    assert unrelated.answer_source == "refusal" and not unrelated.citations
    assert not any(u.model == "llm" for u in unrelated.cost.models)  # no guess was generated


def test_a_deadline_too_close_for_the_llm_gets_the_flagged_extractive_answer(running_orchestrator, report):
    with ThinkServeClient(running_orchestrator.address, timeout_s=0.9) as hurried:
        final = event_of(list(hurried.query(COLLECTION, "How much did annual revenue grow in 2024?", answerer="llm", route="simple", perception="off")), "final")
    assert final.answer_source == "extractive" and final.degraded
    assert "answer.llm_reserve_s" in final.degraded_reason and final.citations


MISSING = {"llm", "vlm_relevance"}


@pytest.fixture(scope="module")
def partial(triton_settings, tmp_path_factory):
    """A second deployment whose Triton serves everything but the LLM and the VLM's page filter."""
    source = triton_settings.model_repository
    names = [p.name for p in source.iterdir() if (p / "config.pbtxt").is_file() and p.name not in MISSING]
    repository = repository_subset(source, tmp_path_factory.mktemp("partial-repo"), names)
    settings = settings_with(
        triton_settings.model_copy(update={"model_repository": repository}), tmp_path_factory.mktemp("partial-data"),
        # the models are down, their files are there: the orchestrator still counts in their tokens
        ingest={"tokenizer": source / "text_embedder_tokenize" / "1" / "tokenizer.json"},
        generation={"llm_tokenizer": source / "llm" / "1" / "tokenizer.json"},
    )
    loop = BackgroundLoop()
    deployment = Deployment(settings, tuple(c for c in contracts.all_contracts() if c.name not in MISSING))
    address = loop.run(deployment.start(progress=lambda _: None))
    yield address
    loop.run(deployment.stop())
    loop.close()


def test_with_models_down_stages_are_skipped_and_the_answer_is_extractive_and_flagged(partial, report):
    with ThinkServeClient(partial, timeout_s=120) as client:
        client.ingest_file("reports", report.path)
        events = list(client.query("reports", "How much did annual revenue grow in 2024?", answerer="llm", route="complex",
                                   page_images=True))
    final = event_of(events, "final")
    assert final.answer_source == "extractive" and final.degraded
    reasons = final.degraded_reason.split("; ")
    assert any(r.startswith("page images skipped: ") and "vlm_relevance" in r for r in reasons)
    assert any(r.startswith("the LLM failed: ") and "'llm'" in r for r in reasons)
    assert not [i for i in event_of(events, "evidence").items if i.kind == "page"]
    assert cited_page(final, "48 million euros") == ("northwind-report.pdf", 0)
