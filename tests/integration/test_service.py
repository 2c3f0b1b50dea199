"""The service a production team runs, over real gRPC and HTTP in front of the real Triton: tokens scoped to
tenants, every limit, admission under overload, cancellation reaching the LLM, server-side paths confined to
their roots, the rest of the API, metrics, spans, request ids and the OpenAI-compatible endpoint."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import httpx
import pytest
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from orchestrator.api.security import new_token
from orchestrator.client import AsyncThinkServeClient, ThinkServeClient, query_request
from orchestrator.server.deployment import Deployment
from orchestrator.observability.metrics import catalogue
from tests.conftest import settings_with
from tests.deploy_checks import queried_families
from tests.integration.conftest import BackgroundLoop, event_of, tokens_before_cancellation

pytestmark = pytest.mark.integration

SAMPLE = Path("samples/northwind-2024-annual-report.md")
QUESTION = "What was Northwind's total revenue in 2024?"
TOKENS = {name: new_token() for name in ("alpha", "beta", "reader", "narrow")}


def grant(name: str, collections: list[str], write: bool, max_concurrent: int = 8) -> dict:
    return {"name": name, "sha256": TOKENS[name][1], "collections": collections, "write": write, "max_concurrent": max_concurrent}


class Secured:
    def __init__(self, deployment: Deployment, loop: BackgroundLoop, spans: InMemorySpanExporter, roots: Path, outside: Path):
        self.deployment, self.loop, self.spans, self.roots, self.outside = deployment, loop, spans, roots, outside

    @property
    def address(self) -> str:
        return self.deployment.address

    @property
    def http(self) -> str:
        return self.deployment.http_address

    def client(self, who: str, **kwargs) -> ThinkServeClient:
        return ThinkServeClient(self.address, token=TOKENS[who][0] if who else "", **kwargs)


@pytest.fixture(scope="module")
def secured(triton, triton_settings, tmp_path_factory):
    """A deployment with tokens for two tenants, a read-only one and a narrow one (one request at a time),
    one query running and one waiting at most, and an ingest root."""
    root = tmp_path_factory.mktemp("ingest-root")
    outside = tmp_path_factory.mktemp("outside")
    settings = settings_with(
        triton_settings.model_copy(update={"url": triton.endpoints.grpc}),
        tmp_path_factory.mktemp("secured-data"),
        server={"max_concurrent_queries": 1, "max_queued_queries": 1, "max_question_chars": 200,
                "max_upload_bytes": 200_000, "ingest_roots": [str(root)], "max_message_bytes": 1_000_000},
        auth={"tokens": [
            grant("alpha", ["alpha"], True), grant("beta", ["beta"], True), grant("reader", ["alpha"], False),
            grant("narrow", ["alpha"], False, max_concurrent=1),
        ]},
        ingest={"chunk_tokens": 200, "chunk_overlap_tokens": 20},
    )
    spans = InMemorySpanExporter()
    loop = BackgroundLoop()
    deployment = Deployment(settings, span_exporter=spans)
    loop.run(deployment.start(progress=lambda _: None))
    service = Secured(deployment, loop, spans, root, outside)
    with service.client("alpha") as alpha:
        alpha.ingest_file("alpha", SAMPLE)
    with service.client("beta") as beta:
        beta.ingest("beta", b"# Contoso\n\nContoso grew its annual revenue to 9 million euros in 2024.", "contoso.md")
    yield service
    loop.run(deployment.stop())
    loop.close()


def status_of(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as raised:
        result = call()
        if hasattr(result, "__next__"):
            list(result)
    return raised.value.code(), raised.value.details()


# ---------------------------------------------------------------------- auth and tenants


def test_calls_without_a_valid_token_are_unauthenticated(secured):
    with secured.client("") as anonymous:
        code, details = status_of(lambda: anonymous.list_documents("alpha"))
    assert code == grpc.StatusCode.UNAUTHENTICATED and "bearer token" in details
    with ThinkServeClient(secured.address, token="ts_not-a-real-token") as forged:
        code, _ = status_of(lambda: forged.query("alpha", QUESTION))
    assert code == grpc.StatusCode.UNAUTHENTICATED


def test_a_tenant_can_neither_read_nor_write_another_tenants_collection(secured):
    with secured.client("beta") as beta:
        for call in (
            lambda: beta.query("alpha", QUESTION),
            lambda: beta.retrieve("alpha", QUESTION),
            lambda: beta.list_documents("alpha"),
            lambda: beta.get_document("alpha", SAMPLE.name),
            lambda: beta.ingest("alpha", b"# Planted\n\nBeta writes here.", "planted.md"),
            lambda: beta.delete_document("alpha", SAMPLE.name),
            lambda: beta.delete_collection("alpha"),
        ):
            code, details = status_of(call)
            assert code == grpc.StatusCode.PERMISSION_DENIED and "'beta'" in details
        assert [c.name for c in beta.list_collections()] == ["beta"]
        assert [c.name for c in beta.stats().collections] == ["beta"]
        # Its own collection answers from its own document only.
        final = event_of(list(beta.query("beta", "How much revenue did the company have in 2024?")), "final")
        assert {c.document_name for c in final.citations} == {"contoso.md"}
    with secured.client("alpha") as alpha:
        assert [d.name for d in alpha.list_documents("alpha")] == [SAMPLE.name]


def test_a_read_only_token_reads_but_cannot_change(secured):
    with secured.client("reader") as reader:
        assert event_of(list(reader.query("alpha", QUESTION)), "final").citations
        code, details = status_of(lambda: reader.ingest("alpha", b"# x\n\ny", "x.md"))
        assert code == grpc.StatusCode.PERMISSION_DENIED and "may read but not change" in details
        code, _ = status_of(lambda: reader.create_collection("alpha-2"))
        assert code == grpc.StatusCode.PERMISSION_DENIED


# ---------------------------------------------------------------------- the rest of the API


def test_retrieve_get_document_collections_and_stats(secured):
    with secured.client("alpha") as alpha:
        retrieved = alpha.retrieve("alpha", QUESTION)
        assert retrieved.route.label and retrieved.evidence.items
        assert retrieved.evidence.items[0].document_name == SAMPLE.name
        assert {t.stage for t in retrieved.timings} >= {"route", "embed", "retrieval", "total"}
        assert not any(u.model == "llm" for u in retrieved.cost.models)  # no answer was generated

        document = alpha.get_document("alpha", SAMPLE.name)
        assert document.chunks > 1 and document.name == SAMPLE.name
        code, _ = status_of(lambda: alpha.get_document("alpha", "missing.md"))
        assert code == grpc.StatusCode.NOT_FOUND

        code, details = status_of(lambda: alpha.create_collection("alpha"))
        assert code == grpc.StatusCode.ALREADY_EXISTS

        stats = alpha.stats()
        pools = {p.pool: p for p in stats.pools}
        assert pools["queries"].capacity == 1 and pools["queries"].queue_depth == 1
        (collection,) = stats.collections
        assert (collection.name, collection.documents, collection.chunks) == ("alpha", 1, document.chunks)
        assert collection.entities > 0
        embedder = next(m for m in stats.models if m.name == "text_embedder")
        assert embedder.inference_count > 0 and embedder.compute_ms > 0 and embedder.batch_executions
        assert stats.triton.ready and stats.triton.url.startswith("127.0.0.1:")


def test_a_collection_is_created_empty_and_deleted_with_its_files(triton, triton_settings, tmp_path_factory):
    """With write on every collection ('*'): create, ingest, delete; the folder is gone from disk."""
    data = tmp_path_factory.mktemp("collections-data")
    token, digest = new_token()
    settings = settings_with(
        triton_settings.model_copy(update={"url": triton.endpoints.grpc}), data,
        auth={"tokens": [{"name": "admin", "sha256": digest, "collections": ["*"], "write": True}]},
        http={"enabled": False},
    )
    loop = BackgroundLoop()
    deployment = Deployment(settings)
    address = loop.run(deployment.start(progress=lambda _: None))
    try:
        with ThinkServeClient(address, token=token) as admin:
            created = admin.create_collection("scratch")
            assert (created.name, created.documents) == ("scratch", 0)
            assert [c.name for c in admin.list_collections()] == ["scratch"]
            refused = event_of(list(admin.query("scratch", QUESTION)), "final")
            assert refused.answer_source == "refusal"
            admin.ingest_file("scratch", SAMPLE)
            deleted = admin.delete_collection("scratch")
            assert deleted.documents == 1 and deleted.chunks > 0
            assert admin.list_collections() == []
            code, _ = status_of(lambda: admin.list_documents("scratch"))
            assert code == grpc.StatusCode.NOT_FOUND
        assert not any((data / "collections").iterdir())
    finally:
        loop.run(deployment.stop())
        loop.close()


# ---------------------------------------------------------------------- limits


def test_every_limit_is_named_when_it_is_hit(secured):
    with secured.client("alpha") as alpha:
        code, details = status_of(lambda: alpha.query("alpha", "why " * 100))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "server.max_question_chars" in details
        code, details = status_of(lambda: alpha.ingest("alpha", b"# Big\n\n" + b"word " * 60_000, "big.md"))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "server.max_upload_bytes" in details
        code, details = status_of(lambda: alpha.query("alpha", QUESTION, top_k=10_000))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "top_k" in details
        # One message over server.max_message_bytes: refused by gRPC itself before it reaches us.
        code, _ = status_of(lambda: alpha.ingest("alpha", b"x" * 1_200_000, "huge.txt"))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert [d.name for d in alpha.list_documents("alpha")] == [SAMPLE.name]  # nothing was stored


async def _gather_queries(address: str, token: str, count: int, **options) -> list:
    """`count` queries sent at once; each result is its final event or the RpcError it ended with."""

    async def one(client):
        try:
            return event_of([e async for e in client.query("alpha", QUESTION, **options)], "final")
        except grpc.RpcError as error:
            return error

    async with AsyncThinkServeClient(address, token=token, timeout_s=120) as client:
        return await asyncio.gather(*(one(client) for _ in range(count)))


def test_overload_is_refused_at_once_while_admitted_queries_finish(secured):
    started = time.monotonic()
    results = asyncio.run(_gather_queries(secured.address, TOKENS["alpha"][0], 8, answerer="llm", max_tokens=48))
    answered = [r for r in results if not isinstance(r, grpc.RpcError)]
    refused = [r for r in results if isinstance(r, grpc.RpcError)]
    # one running and one queued at most: at least 6 of the 8 sent together are refused
    assert 2 <= len(answered) and len(refused) >= 6 - (len(answered) - 2)
    assert all(r.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "server.max_concurrent_queries" in r.details() for r in refused)
    assert all(a.answer_source == "llm" for a in answered)
    assert time.monotonic() - started < 60
    with secured.client("alpha") as alpha:
        queries = next(p for p in alpha.stats().pools if p.pool == "queries")
    assert queries.rejected["queue_full"] >= len(refused) and queries.running == 0


def test_a_token_over_its_own_concurrency_is_refused(secured):
    results = asyncio.run(_gather_queries(secured.address, TOKENS["narrow"][0], 3, answerer="llm", max_tokens=48))
    refused = [r for r in results if isinstance(r, grpc.RpcError)]
    assert refused and all(
        r.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "'narrow'" in r.details() and "max_concurrent = 1" in r.details()
        for r in refused
    )


# ---------------------------------------------------------------------- deadlines and cancellation


def test_a_cancelled_client_cancels_its_generation_in_the_llm(secured, triton):
    request_id = f"cancel-{time.time_ns()}"
    with secured.client("alpha", timeout_s=120) as alpha:
        events = alpha.query("alpha", QUESTION, request_id=request_id, answerer="llm", max_tokens=400, route="simple", perception="off")
        for event in events:
            if event.WhichOneof("event") == "delta":
                break  # leaving the loop cancels the call
        events.close()
    produced = tokens_before_cancellation(triton, request_id)
    assert produced is not None, "the LLM never saw the cancellation"
    assert produced < 400


def test_a_deadline_that_expires_during_generation_cancels_it_in_the_llm(secured, triton):
    """The client's deadline bounds the Triton stream: the LLM is cancelled, the extractive answer stands in.

    The tiny LLM has random weights and may end its answer early on its own; it samples (temperature 1) so that
    is unlikely, and another seed is tried when it happens. On a fast machine it may also write all its tokens
    before a 3 s deadline: then the next try gives it less time."""
    for seed, deadline_s in enumerate((3.0, 3.0, 2.0, 1.5)):
        request_id = f"deadline-{time.time_ns()}"
        started = time.monotonic()
        with secured.client("alpha", timeout_s=deadline_s) as alpha:
            try:
                events = list(alpha.query("alpha", QUESTION, request_id=request_id, answerer="llm", max_tokens=1000,
                                          temperature=1.0, seed=seed, route="simple", perception="off"))
                final = event_of(events, "final")
                if final.answer_source == "llm":
                    continue  # the model stopped by itself, or wrote every token, before the deadline: nothing was cut
                assert final.answer_source == "extractive" and final.degraded and "the LLM failed" in final.degraded_reason
            except grpc.RpcError as error:  # on a busy machine the fallback itself may not fit in what is left
                assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < deadline_s + 1.0  # the call ended at its deadline, not when the LLM would have
        break
    else:
        pytest.fail("the LLM ended every answer before the deadline; no cancellation to observe")
    line, deadline = "", time.monotonic() + 20
    while time.monotonic() < deadline and not line:
        line = next((logged for logged in triton.log_path.read_text().splitlines()
                     if request_id in logged and "cancelled" in logged), "")
        time.sleep(0.2)
    assert line and int(line.split("cancelled after ")[1].split()[0]) < 1000


def test_a_deadline_that_expires_in_the_queue_is_deadline_exceeded(secured):
    async def scenario():
        async with AsyncThinkServeClient(secured.address, token=TOKENS["alpha"][0], timeout_s=120) as client:
            # 1,000 tokens: long enough to hold the slot past the waiting query's deadline on a fast machine too
            slow = asyncio.ensure_future(_drain(client.query("alpha", QUESTION, answerer="llm", max_tokens=1000,
                                                            temperature=1.0, seed=0)))
            await asyncio.sleep(0.3)  # the slow query holds the only slot
            try:
                await _drain(client.query("alpha", QUESTION, timeout_s=0.5))
                return None
            except grpc.RpcError as error:
                return error
            finally:
                await slow

    error = asyncio.run(scenario())
    assert error is not None and error.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def _drain(events) -> list:
    return [event async for event in events]


# ---------------------------------------------------------------------- server-side paths


def test_server_side_paths_are_confined_to_the_ingest_roots(secured):
    inside = secured.roots / "reports" / "memo.md"
    inside.parent.mkdir(exist_ok=True)
    inside.write_text("# Memo\n\nThe Leipzig plant switched to solar power in March 2024.")
    secret = secured.outside / "secret.md"
    secret.write_text("# Secret\n\nNot for ingest.")
    (secured.roots / "link.md").symlink_to(secret)
    with secured.client("alpha") as alpha:
        report = alpha.ingest_server_path("alpha", str(inside))
        assert report.document.name == "memo.md" and report.document.chunks == 1
        for path in (str(secret), str(secured.roots / "link.md"), str(secured.roots / ".." / secured.outside.name / "secret.md")):
            code, details = status_of(lambda: alpha.ingest_server_path("alpha", path))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "not under an allowed ingest root" in details
            assert str(secured.outside) not in details.replace(path, "")  # nothing beyond what the client sent
        code, details = status_of(lambda: alpha.ingest_server_path("alpha", str(secured.roots / "absent.md")))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "does not exist" in details
        alpha.delete_document("alpha", "memo.md")
        assert [d.name for d in alpha.list_documents("alpha")] == [SAMPLE.name]


# ---------------------------------------------------------------------- observability


def test_request_ids_metrics_and_spans(secured):
    secured.spans.clear()
    with secured.client("alpha") as alpha:
        events = list(alpha.query("alpha", QUESTION, request_id="trace-me-1"))
    assert {e.request_id for e in events} == {"trace-me-1"}
    with secured.client("alpha") as alpha:  # the id comes back first (initial metadata), answered or refused
        streamed = alpha._call("Query", query_request("alpha", QUESTION), 60.0, "meta-query")
        assert dict(streamed.initial_metadata())["x-request-id"] == "meta-query" and list(streamed)
        with pytest.raises(grpc.RpcError) as refused:
            alpha._call("Retrieve", query_request("no-such-collection", QUESTION), 60.0, "meta-refused")
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED  # not in alpha's grant
        assert dict(refused.value.initial_metadata())["x-request-id"] == "meta-refused"
        with pytest.raises(grpc.RpcError) as refused:
            list(alpha._call("Query", query_request("no-such-collection", QUESTION), 60.0, "meta-refused-stream"))
        assert dict(refused.value.initial_metadata())["x-request-id"] == "meta-refused-stream"

    spans = secured.spans.get_finished_spans()
    request = next(s for s in spans if s.name == "thinkserve.Query" and s.attributes["thinkserve.request_id"] == "trace-me-1")
    stages = [s for s in spans if s.name.startswith("stage.") and s.parent and s.parent.span_id == request.context.span_id]
    assert {s.name for s in stages} >= {"stage.route", "stage.embed", "stage.retrieval", "stage.answer"}
    assert request.attributes["thinkserve.status"] == "OK" and request.attributes["thinkserve.principal"] == "alpha"

    with secured.client("beta") as beta:
        status_of(lambda: beta.query("alpha", QUESTION))  # one refusal to count
    metrics = httpx.get(f"{secured.http}/metrics", timeout=10).text
    assert _sample(metrics, "retrieval_time_ms_count") >= 1
    assert _sample(metrics, "rag_ttft_ms_count") >= 1
    assert _sample(metrics, 'thinkserve_requests_total{code="OK",method="Query"}') >= 1
    assert _sample(metrics, 'thinkserve_requests_total{code="PERMISSION_DENIED",method="Query"}') >= 1
    assert _sample(metrics, 'thinkserve_model_tokens_total{direction="in",model="text_embedder"}') > 0
    assert _sample(metrics, 'thinkserve_orchestrator_time_ms_count{stage="fusion"}') >= 1
    assert _sample(metrics, 'thinkserve_orchestrator_time_ms_count{stage="unattributed"}') >= 1
    assert 'thinkserve_in_flight_requests{pool="queries"}' in metrics
    assert _sample(metrics, 'thinkserve_model_breaker_open{model="text_embedder"}') == 0
    assert _sample(metrics, "thinkserve_triton_retries_total") >= 0
    for series, kind, _, _ in catalogue():  # every series the README lists (generated from the registry) is served
        assert f"# TYPE {series} {kind}" in metrics, series
    ours, _ = queried_families()  # what the dashboard and alerts query of ours (Triton's: tests/deploy/test_deploy_artefacts.py)
    for family in ours:
        assert f"# TYPE {family} " in metrics, family
    external = httpx.get(f"{secured.http}/metrics/triton", timeout=10)  # this deployment did not launch its Triton
    assert external.status_code == 404 and "external triton.url" in external.text
    with secured.client("alpha") as alpha:
        queries = next(p for p in alpha.stats().pools if p.pool == "queries")
    rejected = _sample(metrics, 'thinkserve_rejected_total{pool="queries",reason="queue_full"}', default=0.0)
    assert rejected == queries.rejected["queue_full"]  # each refusal counted once (the overload test makes some)


def _sample(exposition: str, series: str, default=None) -> float:
    for line in exposition.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    if default is not None:  # a labelled counter appears once it is first counted
        return default
    family = series.split("{")[0]
    present = [entry for entry in exposition.splitlines() if entry.startswith(family)]
    raise AssertionError(f"{series} not in the metrics: {present}")


# ---------------------------------------------------------------------- OpenAI-compatible endpoint


def _headers(who: str) -> dict:
    return {"authorization": f"Bearer {TOKENS[who][0]}"} if who else {}


def test_openai_models_and_chat_completion(secured):
    with httpx.Client(base_url=secured.http, timeout=120) as http:
        models = http.get("/v1/models", headers=_headers("beta")).json()
        assert [m["id"] for m in models["data"]] == ["beta"]
        assert http.get("/v1/models").status_code == 401

        body = {"model": "alpha", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}]}
        response = http.post("/v1/chat/completions", json=body, headers={**_headers("alpha"), "x-request-id": "openai-1"})
        assert response.status_code == 200 and response.headers["x-request-id"] == "openai-1"
        completion = response.json()
        assert completion["object"] == "chat.completion" and completion["id"] == "chatcmpl-openai-1"
        answer = completion["choices"][0]["message"]["content"]
        with secured.client("alpha") as alpha:  # the same answer as over gRPC (the extractive answer is deterministic)
            assert answer == event_of(list(alpha.query("alpha", QUESTION)), "final").text
        assert completion["thinkserve"]["citations"][0]["document_name"] == SAMPLE.name

        assert http.post("/v1/chat/completions", json=body, headers=_headers("beta")).status_code == 403
        missing = http.post("/v1/chat/completions", json={**body, "model": "nowhere"}, headers=_headers("alpha"))
        assert missing.status_code == 403 and missing.json()["error"]["code"] == "PERMISSION_DENIED"
        bad = http.post("/v1/chat/completions", json={**body, "thinkserve": {"graph_hops": "two"}}, headers=_headers("alpha"))
        assert bad.status_code == 400 and "graph_hops must be an integer" in bad.json()["error"]["message"]
        assert bad.json()["error"]["param"] == "thinkserve.graph_hops"  # where the request put it
        hot = http.post("/v1/chat/completions", json={**body, "temperature": "hot"}, headers=_headers("alpha"))
        assert hot.status_code == 400 and hot.json()["error"]["param"] == "temperature"
        far = http.post("/v1/chat/completions", json={**body, "thinkserve": {"graph_hops": 9}}, headers=_headers("alpha"))
        assert far.status_code == 400 and far.json()["error"]["message"] == "graph_hops must be in 0..4, got 9"


def test_openai_streaming_sends_the_answer_as_server_sent_events(secured):
    body = {"model": "alpha", "stream": True, "messages": [{"role": "user", "content": QUESTION}], "thinkserve": {"route": "simple"}}
    chunks = []
    with httpx.Client(base_url=secured.http, timeout=120) as http:
        with http.stream("POST", "/v1/chat/completions", json=body, headers=_headers("alpha")) as response:
            assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
            for line in response.iter_lines():
                if line.startswith("data: "):
                    chunks.append(line[len("data: "):])
    assert chunks[-1] == "[DONE]"
    parsed = [json.loads(c) for c in chunks[:-1]]
    assert all(p["object"] == "chat.completion.chunk" for p in parsed)
    text = "".join(p["choices"][0]["delta"].get("content", "") for p in parsed)
    last = parsed[-1]
    assert last["choices"][0]["finish_reason"] == "stop" and last["thinkserve"]["route"] == "simple"
    assert text.strip() == last["thinkserve"]["text"].strip() and last["thinkserve"]["citations"]


# ---------------------------------------------------------------------- standard health and reflection


def test_standard_health_and_reflection_answer_probes_without_a_token(secured):
    with grpc.insecure_channel(secured.address) as channel:  # no token: what a Kubernetes probe or grpcurl sends
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", "thinkserve.v1.ThinkServe"):
            assert health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10).status == \
                health_pb2.HealthCheckResponse.SERVING
        code, _ = status_of(lambda: health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10))
        assert code == grpc.StatusCode.NOT_FOUND
        database = ProtoReflectionDescriptorDatabase(channel)
        assert {"thinkserve.v1.ThinkServe", "grpc.health.v1.Health", reflection.SERVICE_NAME} <= set(database.get_services())
        query = descriptor_pool.DescriptorPool(database).FindServiceByName("thinkserve.v1.ThinkServe").FindMethodByName("Query")
        assert query.input_type.full_name == "thinkserve.v1.QueryRequest" and query.server_streaming
    with secured.client("") as anonymous:  # the API itself still needs a token
        assert status_of(lambda: anonymous.list_documents("alpha"))[0] == grpc.StatusCode.UNAUTHENTICATED
    # the container healthcheck (deploy/compose.yaml): the CLI's probe, no token
    probe = subprocess.run([sys.executable, "-m", "orchestrator", "health", "--probe", "--address", secured.address],
                           capture_output=True, text=True, timeout=60)
    assert (probe.returncode, probe.stdout.strip()) == (0, "SERVING"), probe.stderr
    closed = subprocess.run([sys.executable, "-m", "orchestrator", "health", "--probe", "--address", "127.0.0.1:1"],
                            capture_output=True, text=True, timeout=60)
    assert closed.returncode == 1 and closed.stdout.startswith("UNREACHABLE: UNAVAILABLE")


# ---------------------------------------------------------------------- shutdown


def test_shutdown_drains_the_requests_in_flight(triton, triton_settings, tmp_path_factory):
    settings = settings_with(
        triton_settings.model_copy(update={"url": triton.endpoints.grpc}), tmp_path_factory.mktemp("drain-data"),
        server={"shutdown_grace_s": 30}, ingest={"chunk_tokens": 200, "chunk_overlap_tokens": 20},
    )
    loop = BackgroundLoop()
    deployment = Deployment(settings)
    address = loop.run(deployment.start(progress=lambda _: None))
    outcome: dict = {}
    try:
        with ThinkServeClient(address, timeout_s=120) as client:
            client.ingest_file("drain", SAMPLE)

            def ask():
                try:
                    outcome["final"] = event_of(list(client.query("drain", QUESTION, answerer="llm", max_tokens=200)), "final")
                except grpc.RpcError as error:
                    outcome["error"] = error

            statuses: list[int] = []

            def watch():  # what a load balancer watching the standard health sees
                with grpc.insecure_channel(address) as channel:
                    try:
                        for reply in health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service="")):
                            statuses.append(reply.status)
                    except grpc.RpcError:
                        pass  # the server went away

            asker, watcher = threading.Thread(target=ask), threading.Thread(target=watch)
            watcher.start()
            asker.start()
            time.sleep(0.8)  # the query is running
            loop.run(deployment.stop())
            asker.join(60)
            watcher.join(60)
        assert "error" not in outcome, outcome.get("error")
        assert outcome["final"].answer_source == "llm"
        serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
        assert statuses[0] == serving and statuses[-1] == not_serving, statuses  # told before the server went
    finally:
        loop.run(deployment.stop())
        loop.close()


# ---------------------------------------------------------------------- TLS


def test_mutual_tls_admits_only_clients_with_a_certificate(triton, triton_settings, tmp_path_factory):
    from orchestrator.client import Connection
    from tests.tls_factory import write_tls_files

    tls = write_tls_files(tmp_path_factory.mktemp("tls"))
    settings = settings_with(
        triton_settings.model_copy(update={"url": triton.endpoints.grpc}), tmp_path_factory.mktemp("tls-data"),
        server={"tls_cert_file": str(tls.server_cert), "tls_key_file": str(tls.server_key), "tls_client_ca_file": str(tls.ca)},
    )
    loop = BackgroundLoop()
    deployment = Deployment(settings)
    address = loop.run(deployment.start(progress=lambda _: None))
    try:
        ca = tls.ca.read_bytes()
        with_certificate = Connection(tls=True, root_certificates=ca, client_certificate=tls.client_cert.read_bytes(),
                                      client_key=tls.client_key.read_bytes())
        with ThinkServeClient(address, connection=with_certificate) as client:
            assert client.health().version
        for connection in (Connection(tls=True, root_certificates=ca), Connection()):  # no client cert; plaintext
            with ThinkServeClient(address, connection=connection) as refused:
                code, _ = status_of(lambda: refused.health(timeout_s=5))
                assert code == grpc.StatusCode.UNAVAILABLE
        assert deployment.http_address.startswith("https://")
        trusted = ssl.create_default_context(cafile=str(tls.ca))
        with pytest.raises(httpx.HTTPError):  # no client certificate
            httpx.get(f"{deployment.http_address}/healthz", verify=trusted)
        trusted.load_cert_chain(str(tls.client_cert), str(tls.client_key))
        assert httpx.get(f"{deployment.http_address}/healthz", verify=trusted).status_code == 200
    finally:
        loop.run(deployment.stop())
        loop.close()
