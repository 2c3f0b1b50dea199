"""The orchestrator's gRPC API over a real socket, in front of the real Triton."""

from __future__ import annotations

import grpc
import pytest

from orchestrator.client import ThinkServeClient
from orchestrator.models import contracts
from tests.conftest import SAMPLE_DOCUMENT
from tests.integration.conftest import TEST_UPLOAD_LIMIT, event_of

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(orchestrator):
    with ThinkServeClient(orchestrator, timeout_s=120) as client:
        yield client


@pytest.fixture(scope="module")
def sample_collection(client):
    report = client.ingest_file("reports", SAMPLE_DOCUMENT)
    assert report.passages >= 3 and not report.already_present
    return "reports"


def test_health_lists_every_model_ready(client):
    health = client.health()
    assert health.serving and health.profile == "tiny"
    assert {m.name for m in health.models} == {c.name for c in contracts.all_contracts()}
    assert all(m.ready for m in health.models)


def test_query_streams_route_evidence_answer_then_final(client, sample_collection):
    # rerank=True: the tiny profile gives its cross-encoder no weight, so it runs only when asked for
    events = list(client.query(
        sample_collection, "What was the total revenue in 2024?", max_tokens=8, top_k=3, answerer="llm", rerank=True,
    ))
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[:2] == ["route", "evidence"] and kinds[-1] == "final"
    assert set(kinds[2:-1]) == {"delta"} and len(kinds) - 3 == 8
    assert len({e.request_id for e in events}) == 1 and events[0].request_id

    route = event_of(events, "route")
    assert route.label == "simple" and route.source == "features" and route.instruction
    assert list(route.probabilities) == [1.0, 0.0, 0.0]

    evidence = event_of(events, "evidence").items
    assert [item.rank for item in evidence] == list(range(1, len(evidence) + 1)) and len(evidence) == 3
    assert "412 million euros" in evidence[0].text  # the real embedder finds the passage with the answer
    assert evidence[0].document_name == SAMPLE_DOCUMENT.name and evidence[0].section.endswith("Financial results")
    assert evidence[0].score >= evidence[-1].score
    assert "dense" in evidence[0].signals.found_by and 0 < evidence[0].signals.semantic <= 1

    final = events[-1].final
    assert final.answer_source == "llm" and final.finish_reason == "length" and not final.degraded
    assert final.text == "".join(e.delta.text for e in events[2:-1]).strip()
    assert final.usage.completion_tokens == 8 and final.usage.prompt_tokens > 100
    stages = {t.stage: t.milliseconds for t in final.timings}
    # (no "graph": it runs when an entity seeds it; this question names none, and an entity named by only one
    # passage has no vector to match it (ingest.entity_min_mentions))
    assert {"route", "embed", "dense", "sparse", "fusion", "retrieval", "rerank", "llm_ttft", "rag_ttft", "llm_generation", "total"} <= set(stages)
    assert all(value >= 0 for value in stages.values())
    tokens = [t for e in events[2:-1] for t in e.delta.tokens]
    assert len(tokens) == 8 and all(t.log_prob <= 0 for t in tokens)
    used = {(u.model, u.stage): u for u in final.cost.models}
    assert set(used) == {("text_embedder", "embed"), ("reranker", "rerank"), ("llm", "llm")}
    assert used[("llm", "llm")].tokens_out == 8 and used[("reranker", "rerank")].items >= 3  # every fused candidate
    assert final.cost.model_ms > 0 and final.cost.orchestrator_ms > 0
    own = dict(final.cost.orchestrator_ms_by_stage)  # the orchestrator's own time, split by stage
    assert {"route", "embed", "dense", "sparse", "fusion", "rerank", "context", "llm_generation", "unattributed"} <= set(own)
    assert all(ms >= 0 for ms in own.values()) and own["embed"] < stages["embed"]  # embed waited on its model
    assert own["dense"] == pytest.approx(stages["dense"]) and own["llm_generation"] < stages["llm_generation"]


def test_the_tiny_default_answer_is_extractive_with_citations(client, sample_collection):
    events = list(client.query(sample_collection, "Which region grew the fastest, and why?"))
    final = event_of(events, "final")
    assert event_of(events, "route").label == "complex"
    assert final.answer_source == "extractive" and not final.degraded
    assert "Asia-Pacific was the fastest-growing region" in final.text and "[1]" in final.text
    assert [c.evidence_rank for c in final.citations] == [1] and final.citations[0].document_name == SAMPLE_DOCUMENT.name
    assert final.text.startswith("".join(e.delta.text for e in events if e.WhichOneof("event") == "delta").strip()[:40])


@pytest.mark.parametrize("present, absent", [
    ("What was Northwind's total revenue in 2024?", "What was the penguin colony's total krill catch in 1987?"),
    ("Who became chief executive in 2024?", "Who became abbot of the Zephyrian monastery in 1612?"),
])
def test_the_answerability_model_refuses_what_is_absent_and_answers_what_is_present(client, sample_collection, present, absent):
    """The same kind of question, about something the report holds and about something it never mentions: the
    shipped model's probability (reported with its features) separates them."""
    answered = event_of(list(client.query(sample_collection, present)), "final")
    refused = event_of(list(client.query(sample_collection, absent)), "final")
    assert answered.answer_source == "extractive" and answered.citations and answered.answerability.answerable
    assert refused.answer_source == "refusal" and refused.finish_reason == "refusal" and not refused.citations
    assert refused.answerability.probability < refused.answerability.threshold <= answered.answerability.probability
    assert refused.answerability.model.endswith("/full") and refused.answerability.features["unseen_terms"] > 0


def test_a_question_the_collection_cannot_answer_is_refused(client, sample_collection):
    final = event_of(list(client.query(sample_collection, "How do penguins keep their eggs warm in Antarctic winters?")), "final")
    assert final.answer_source == "refusal" and "do not contain enough evidence" in final.text
    assert not final.citations


def test_ingesting_the_same_bytes_again_changes_nothing(client, sample_collection):
    again = client.ingest_file(sample_collection, SAMPLE_DOCUMENT)
    assert again.already_present
    events = list(client.query(sample_collection, "Who is the chief executive?", max_tokens=1, top_k=50))
    passage_ids = [item.passage_id for item in event_of(events, "evidence").items]
    assert len(passage_ids) == len(set(passage_ids))


def test_collections_are_isolated(client, sample_collection):
    client.ingest("other", b"# Other\n\nThe cafeteria opens at eight and serves revenue reports.", "other.md")
    events = list(client.query("other", "What was the total revenue in 2024?", max_tokens=1))
    assert {item.document_name for item in event_of(events, "evidence").items} == {"other.md"}


def rpc_error(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def test_bad_requests_get_a_status_and_a_reason(client, sample_collection):
    cases = [
        (lambda: list(client.query("nope", "anything?")), grpc.StatusCode.NOT_FOUND, "collection 'nope' does not exist"),
        (lambda: list(client.query(sample_collection, "   ")), grpc.StatusCode.INVALID_ARGUMENT, "question is empty"),
        (lambda: list(client.query(sample_collection, "x" * 5000)), grpc.StatusCode.INVALID_ARGUMENT, "server.max_question_chars"),
        (lambda: list(client.query(sample_collection, "why?", top_k=500)), grpc.StatusCode.INVALID_ARGUMENT, "retrieval.max_top_k"),
        (lambda: list(client.query("Bad Name", "why?")), grpc.StatusCode.INVALID_ARGUMENT, "must match"),
        (lambda: client.ingest("reports", b"%PDF-1.7 ...", "report.pdf"), grpc.StatusCode.INVALID_ARGUMENT, "corrupt or not a PDF"),
        (lambda: client.ingest("reports", b"PK\x03\x04 broken", "bundle.zip"), grpc.StatusCode.INVALID_ARGUMENT, "not a readable zip"),
        (lambda: client.ingest("reports", b"PK\x03\x04...", "slides.pptx"), grpc.StatusCode.INVALID_ARGUMENT, "unsupported document type (.pptx)"),
        (lambda: client.ingest("reports", b"\x00\x01", "tool.exe"), grpc.StatusCode.INVALID_ARGUMENT, "unsupported document type"),
        (lambda: client.ingest("reports", b"\xff\xfe\x00bad", "bad.txt"), grpc.StatusCode.INVALID_ARGUMENT, "not UTF-8"),
        (lambda: client.ingest("reports", b"a" * (TEST_UPLOAD_LIMIT + 1), "big.txt"), grpc.StatusCode.INVALID_ARGUMENT, "server.max_upload_bytes"),
    ]
    for call, code, reason in cases:
        error = rpc_error(call)
        assert error.code() == code, (reason, error.details())
        assert reason in error.details()
    # none of it touched what was stored
    assert client.ingest_file(sample_collection, SAMPLE_DOCUMENT).already_present


def test_an_expired_deadline_is_deadline_exceeded(orchestrator, sample_collection):
    # an answerable question on a fixed route, the LLM writing up to 500 tokens: 0.8 s on the 2-core machine, far past
    # the 50 ms deadline (a question the router sent to Complex was refused for weak evidence in 10 ms, inside it)
    with ThinkServeClient(orchestrator, timeout_s=0.05) as impatient:
        error = rpc_error(lambda: list(impatient.query(sample_collection, "What was the total revenue in 2024?", max_tokens=500,
                                                       answerer="llm", route="simple")))
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
