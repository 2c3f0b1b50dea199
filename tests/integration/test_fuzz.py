"""Fuzzing the API of a real deployment: generated Query, Retrieve and Ingest messages over gRPC and generated
bodies for the OpenAI-compatible endpoint; then, with the benchmark's generators (thinkserve_bench.fuzzing, a few
examples each here; `thinkserve-bench fuzz` runs thousands), messages of every RPC built from
the .proto and raw bytes that are none, every HTTP operation of the OpenAPI description through Schemathesis, and
hostile files through both upload paths. Whatever arrives, the answer is a result or a client error with a
cause; never INTERNAL/UNKNOWN, never an HTTP 500, and the server keeps serving."""

from __future__ import annotations

import json
import math

import grpc
import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from orchestrator.client import ThinkServeClient
from orchestrator.server.deployment import Deployment
from orchestrator.pipeline.plan import QueryOptions
from tests.conftest import settings_with
from tests.integration.conftest import BackgroundLoop
from thinkserve_bench.fuzzing.runner import SERVICE, FileFuzzer, GrpcFuzzer, RestFuzzer, Tally, health_probe

pytestmark = pytest.mark.integration

COLLECTION = "fuzz"
# Outcomes a client may legitimately get for a generated request; anything else is a server defect.
CLIENT_ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
HTTP_CLIENT_ERRORS = {400, 403, 404, 429, 504}
FUZZ_DOCUMENT = b"# Fuzz\n\nAcme sold 12 robots in 2024. Bolt Ltd bought three of them."
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def fuzz_deployment(triton, triton_settings, tmp_path_factory):
    """(gRPC address, HTTP base URL) of the deployment under fuzzing, with the fuzz collection loaded."""
    config = settings_with(
        triton_settings.model_copy(update={"url": triton.endpoints.grpc}), tmp_path_factory.mktemp("fuzz-data"),
        server={"max_upload_bytes": 64_000, "max_queued_queries": 64},
        ingest={"chunk_tokens": 200, "chunk_overlap_tokens": 20},
        generation={"max_tokens_limit": 64},  # keeps a generated LLM request short
    )
    loop = BackgroundLoop()
    deployment = Deployment(config)
    address = loop.run(deployment.start(progress=lambda _: None))
    with ThinkServeClient(address, timeout_s=120) as client:
        client.ingest(COLLECTION, FUZZ_DOCUMENT, "fuzz.md")
    yield address, deployment.http_address
    loop.run(deployment.stop())
    loop.close()


@pytest.fixture(scope="module")
def fuzzed(fuzz_deployment):
    address, http = fuzz_deployment
    with ThinkServeClient(address, timeout_s=120) as client:
        yield client, http


def _option_strategy(kind: str):
    if "bool" in kind:
        return st.booleans()
    if "int" in kind:
        return st.integers(min_value=-(2**31), max_value=2**31 - 1)
    if "float" in kind:
        return st.floats(allow_nan=True, allow_infinity=True, width=32)
    return st.one_of(st.sampled_from(["simple", "moderate", "complex", "features", "model", "fixed", "dpr", "end_to_end",
                                      "off", "extractive", "llm", ""]), st.text(max_size=20))


OPTIONS = st.fixed_dictionaries({}, optional={
    name: _option_strategy(str(field.annotation)) for name, field in QueryOptions.model_fields.items() if name != "seed"
} | {"seed": st.integers(min_value=0, max_value=2**64 - 1)})
COLLECTIONS = st.one_of(st.just(COLLECTION), st.text(max_size=80))
QUESTIONS = st.one_of(st.text(max_size=300), st.just("How many robots did Acme sell?"), st.text(min_size=3990, max_size=4100))


def _expect_client_error_or_answer(call) -> None:
    try:
        result = call()
        if hasattr(result, "__next__"):
            list(result)
    except grpc.RpcError as error:
        assert error.code() in CLIENT_ERRORS, f"{error.code().name}: {error.details()}"


@FUZZ
@given(collection=COLLECTIONS, question=QUESTIONS, options=OPTIONS)
def test_generated_queries_get_answers_or_client_errors(fuzzed, collection, question, options):
    client, _ = fuzzed
    _expect_client_error_or_answer(lambda: client.query(collection, question, timeout_s=15, **options))


@FUZZ
@given(collection=COLLECTIONS, question=QUESTIONS, options=OPTIONS)
def test_generated_retrievals_get_evidence_or_client_errors(fuzzed, collection, question, options):
    client, _ = fuzzed
    _expect_client_error_or_answer(lambda: client.retrieve(collection, question, timeout_s=15, **options))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    collection=st.one_of(st.just("fuzz-ingest"), st.text(max_size=70)),
    filename=st.one_of(st.sampled_from(["a.md", "b.txt", "c.pdf", "d.png", "e.zip", "", "../../etc/passwd"]), st.text(max_size=40)),
    media_type=st.one_of(st.just(""), st.text(max_size=30)),
    data=st.one_of(st.binary(max_size=4000), st.sampled_from([b"%PDF-1.7\n broken", b"PK\x03\x04 broken zip", b"\x89PNG\r\n\x1a\n"])),
)
def test_generated_uploads_are_stored_or_refused_with_a_cause(fuzzed, collection, filename, media_type, data):
    client, _ = fuzzed
    _expect_client_error_or_answer(lambda: client.ingest(collection, data, filename, media_type))


JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30)),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(st.text(max_size=12), children, max_size=4)),
    max_leaves=12,
)
CHAT_BODIES = st.one_of(
    JSON,
    st.fixed_dictionaries(
        {"model": st.one_of(st.just(COLLECTION), JSON), "messages": st.one_of(
            st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", 7]),
                                            "content": st.one_of(st.text(max_size=200), JSON)}), max_size=3), JSON)},
        optional={"stream": st.one_of(st.booleans(), JSON), "max_tokens": JSON, "temperature": JSON,
                  "thinkserve": st.one_of(OPTIONS, JSON)},
    ),
)


@FUZZ
@given(body=CHAT_BODIES)
@example(body={"model": "fuzz", "messages": [], "stream": False, "thinkserve": {"top_k": 0, "seed": 0, "top_p": math.inf}})
@example(body={"model": COLLECTION, "messages": [{"role": "user", "content": "hi"}], "thinkserve": {"temperature": math.nan}})
def test_generated_chat_requests_never_get_a_server_error(fuzzed, body):
    _, http = fuzzed
    # json.dumps writes NaN and Infinity as JavaScript does (the generated options include them): the server must
    # refuse those with a client error too, where httpx's json= would refuse to send them
    response = httpx.post(f"{http}/v1/chat/completions", content=json.dumps(body).encode(), timeout=30,
                          headers={"x-request-timeout": "15", "content-type": "application/json"})
    assert response.status_code == 200 or response.status_code in HTTP_CLIENT_ERRORS, response.text[:300]
    if response.status_code != 200:
        assert response.json()["error"]["message"]


def test_malformed_http_bodies_are_client_errors(fuzzed):
    _, http = fuzzed
    for raw in (b"{", b"\xff\xfe", b"[]", b"null", b'{"model": "fuzz", "messages": "hi"}', b"x" * (2 << 20),
                b'{"model": "fuzz", "messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}'):
        response = httpx.post(f"{http}/v1/chat/completions", content=raw, timeout=30)
        assert response.status_code == 400, (raw[:20], response.text[:200])


def _generated(fuzz_deployment, run) -> None:
    """Run one of the benchmark's fuzzers; every case must pass and every health check too. Generated requests
    may delete the collection they name (DeleteCollection "fuzz"): it is put back after."""
    address, http = fuzz_deployment
    tally = Tally()
    run(address, http, tally, health_probe(address, COLLECTION, "How many robots did Acme sell?"))
    summary = tally.summary()
    with ThinkServeClient(address, timeout_s=120) as client:
        client.ingest(COLLECTION, FUZZ_DOCUMENT, "fuzz.md")
    assert summary["cases"] > 0
    # as text: pytest shortens the repr of an object in an assertion, and the cause is in the details it cuts
    assert not summary["defect_examples"], json.dumps(summary["defect_examples"], indent=1, default=str)
    assert summary["health_checks"] == 0 or not summary["health_failures"], json.dumps(summary["health_failures"], default=str)


def test_generated_messages_of_every_rpc_and_raw_bytes_get_results_or_client_errors(fuzz_deployment):
    def run(address, http, tally, health):
        fuzzer = GrpcFuzzer(address, tally, health, timeout_s=60)
        try:
            fuzzer.run(examples_per_method=6, run_seed=54, raw_examples=30)
        finally:
            fuzzer.close()
        assert {o.family for o in tally.outcomes} >= {m.name for m in SERVICE.methods}

    _generated(fuzz_deployment, run)


def test_every_http_operation_of_the_openapi_description_under_schemathesis(fuzz_deployment):
    def run(address, http, tally, health):
        fuzzer = RestFuzzer(http, tally, health, timeout_s=60)
        assert len(fuzzer.operations()) >= 19
        fuzzer.run(examples_per_operation=4, run_seed=54)

    _generated(fuzz_deployment, run)


def test_hostile_files_are_stored_or_refused_with_a_cause(fuzz_deployment):
    def run(address, http, tally, health):
        fuzzer = FileFuzzer(address, http, tally, health, max_upload_bytes=64_000, timeout_s=120)
        try:
            fuzzer.run(examples=30, run_seed=54)
        finally:
            fuzzer.close()

    _generated(fuzz_deployment, run)


def test_the_server_still_answers_after_the_fuzzing(fuzzed):
    client, _ = fuzzed
    assert client.health().version
    assert [e for e in client.query(COLLECTION, "How many robots did Acme sell?") if e.WhichOneof("event") == "final"]
