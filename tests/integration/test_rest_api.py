"""The JSON API behind the console, over real HTTP against the real Triton: each route runs the gRPC method of the
same name (same checks, same limits), page images are served by collection, document id and page under the
tenant checks, and a query streams its events as Server-Sent Events."""

from __future__ import annotations

import io
import json
import time
import urllib.parse

import httpx
import pytest
from PIL import Image

from orchestrator.api.security import new_token
from thinkserve_bench.corpora import pdf_factory
from orchestrator.server.deployment import Deployment
from tests.conftest import SAMPLE_DOCUMENT, settings_with
from tests.integration.conftest import BackgroundLoop, tokens_before_cancellation

pytestmark = pytest.mark.integration

FACT_PAGE = 1  # 0-based: the fact is printed on the second page
QUESTION = "How much was the Halvorsen turbine contract signed for?"
ALPHA, ALPHA_DIGEST = new_token()
BETA, BETA_DIGEST = new_token()
READER, READER_DIGEST = new_token()
ADMIN, ADMIN_DIGEST = new_token()


def console_settings(triton, triton_settings, data_dir, **sections):
    """Two tenants (alpha writes `alpha`, beta writes `beta`), a reader of `alpha` and an admin of every collection."""
    grants = [
        {"name": "alpha", "sha256": ALPHA_DIGEST, "collections": ["alpha"], "write": True},
        {"name": "beta", "sha256": BETA_DIGEST, "collections": ["beta"], "write": True},
        {"name": "reader", "sha256": READER_DIGEST, "collections": ["alpha"], "write": False},
        {"name": "admin", "sha256": ADMIN_DIGEST, "collections": ["*"], "write": True},
    ]
    return settings_with(triton_settings.model_copy(update={"url": triton.endpoints.grpc}), data_dir,
                         auth={"tokens": grants}, **sections)


@pytest.fixture(scope="module")
def served(triton, triton_settings, tmp_path_factory):
    loop = BackgroundLoop()
    deployment = Deployment(console_settings(triton, triton_settings, tmp_path_factory.mktemp("rest-data")))
    loop.run(deployment.start(progress=lambda _: None))
    yield deployment.http_address
    loop.run(deployment.stop())
    loop.close()


def client(base: str, token: str = ALPHA) -> httpx.Client:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=f"{base}/api/v1", headers=headers, timeout=300)


@pytest.fixture(scope="module")
def report(served, tmp_path_factory):
    path = pdf_factory.write_long_chunk_report(tmp_path_factory.mktemp("pdf") / "operations review.pdf", FACT_PAGE)
    with client(served) as http:
        response = http.put("/collections/alpha/documents/operations%20review.pdf", content=path.read_bytes(),
                            headers={"content-type": "application/pdf"})
    assert response.status_code == 200, response.text
    return response.json()


def test_an_upload_is_ingested_and_reported_as_the_ingest_rpc_reports_it(report):
    assert report["collection"] == "alpha" and report["visible"] is True and report["already_present"] is False
    document = report["document"]
    assert document["name"] == "operations review.pdf" and document["pages"] == 5 and document["passages"] >= 4
    assert {stage["stage"] for stage in report["stages"]} >= {"parse", "embed", "commit"}
    assert isinstance(document["bytes"], str) and int(document["bytes"]) > 1000  # int64: a string, as protobuf's JSON has it


def test_collections_and_documents_are_scoped_to_the_token(served, report):
    with client(served) as alpha, client(served, BETA) as beta:
        assert [c["name"] for c in alpha.get("/collections").json()["collections"]] == ["alpha"]
        assert beta.get("/collections").json() == {"collections": []}
        (listed,) = alpha.get("/collections/alpha/documents").json()["documents"]
        assert listed["document_id"] == report["document_id"]
        assert alpha.get("/collections/alpha/documents/operations review.pdf").json()["pages"] == 5
        refused = beta.get("/collections/alpha/documents")
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "PERMISSION_DENIED"
    with client(served, token="") as anonymous:
        assert anonymous.get("/collections").status_code == 401


def test_page_images_are_served_by_document_id_and_page_under_the_tenant_checks(served, report):
    document_id = report["document_id"]
    with client(served) as alpha, client(served, BETA) as beta, client(served, READER) as reader:
        page = alpha.get(f"/collections/alpha/pages/{document_id}/{FACT_PAGE}")
        assert page.status_code == 200 and page.headers["content-type"] in ("image/jpeg", "image/png")
        assert "private" in page.headers["cache-control"]
        width, height = Image.open(io.BytesIO(page.content)).size
        assert height > width > 300  # a portrait page, rendered at a readable size
        assert reader.get(f"/collections/alpha/pages/{document_id}/{FACT_PAGE}").status_code == 200
        # another tenant: refused whatever it names; through its own collection the document does not exist
        assert beta.get(f"/collections/alpha/pages/{document_id}/{FACT_PAGE}").status_code == 403
        beta.put("/collections/beta/documents/notes.md", content=SAMPLE_DOCUMENT.read_bytes()).raise_for_status()
        assert beta.get(f"/collections/beta/pages/{document_id}/{FACT_PAGE}").status_code == 404
        assert alpha.get(f"/collections/alpha/pages/{document_id}/99").status_code == 404
        # nothing that looks like a path reaches the disk
        sneaky = urllib.parse.quote("../../manifest.json", safe="")
        assert alpha.get(f"/collections/alpha/pages/{sneaky}/0").status_code == 404
    with client(served, token="") as anonymous:
        assert anonymous.get(f"/collections/alpha/pages/{document_id}/{FACT_PAGE}").status_code == 401


def test_a_units_image_is_served_by_its_evidence_id(served, report):
    with client(served) as alpha, client(served, BETA) as beta:
        items = alpha.post("/collections/alpha/retrieve", json={"question": "picture figure image", "options": {"top_k": 20}}
                           ).json()["evidence"]["items"]
        (unit,) = [item for item in items if item["kind"] == "unit"]  # the last page's picture
        passage = next(item for item in items if item["kind"] == "passage")
        image = alpha.get(f"/collections/alpha/evidence/{unit['passage_id']}/image")
        assert image.status_code == 200 and image.headers["content-type"] in ("image/jpeg", "image/png")
        assert min(Image.open(io.BytesIO(image.content)).size) > 10
        assert beta.get(f"/collections/alpha/evidence/{unit['passage_id']}/image").status_code == 403
        assert alpha.get(f"/collections/alpha/evidence/{passage['passage_id']}/image").status_code == 404  # text: no image
        assert alpha.get(f"/collections/alpha/evidence/{report['document_id']}:u999/image").status_code == 404


def events_of(response: httpx.Response) -> list:
    messages = [block.removeprefix("data: ") for block in response.text.split("\n\n") if block.strip()]
    assert messages[-1] == "[DONE]"
    return [json.loads(message) for message in messages[:-1]]


def test_a_query_streams_its_events_and_the_citation_names_the_fact_page_with_stage_start_times(served, report):
    with client(served) as alpha:
        response = alpha.post("/collections/alpha/query", json={"question": QUESTION, "options": {"route": "simple"}})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = events_of(response)
    kinds = [next(key for key in event if key != "request_id") for event in events]
    assert kinds[0] == "route" and kinds[-1] == "final" and "evidence" in kinds and "delta" in kinds
    final = events[-1]["final"]
    assert pdf_factory.DEEP_FACT in final["text"]
    first = final["citations"][0]
    assert first["page"] == FACT_PAGE and first["passage_id"].startswith(report["document_id"] + ":")
    (region,) = first["regions"]
    assert region["page"] == FACT_PAGE and len(region["bbox"]) == 4
    timings = {timing["stage"]: timing for timing in final["timings"]}
    assert timings["total"]["start_ms"] == 0.0
    total = timings["total"]["milliseconds"]
    assert 0 < timings["retrieval"]["start_ms"] < total
    # retrieval's parts are timed in a worker thread, on the same clock: inside retrieval; the BM25 search starts
    # with it, while the question is embedded, the dense search and the fusion after the embedding
    retrieval_starts = timings["retrieval"]["start_ms"]
    retrieval_ends = retrieval_starts + timings["retrieval"]["milliseconds"]
    for part in ("dense", "sparse", "fusion"):
        after = retrieval_starts if part == "sparse" else timings["embed"]["start_ms"] + timings["embed"]["milliseconds"]
        assert after <= timings[part]["start_ms"] < retrieval_ends, (part, timings)
    assert all(0 <= t["start_ms"] and t["start_ms"] + t["milliseconds"] <= total + 0.5 for t in timings.values()), timings


def _first_words(response: httpx.Response, kind: str) -> str:
    """Read a streamed answer until its first words: a REST `delta` event, or an OpenAI chunk with content."""
    for line in response.iter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[len("data: "):])
        words = event.get("delta", {}).get("text", "") if kind == "rest" else event["choices"][0]["delta"].get("content", "")
        if words:
            return words
    raise AssertionError("the answer ended before its first words")


@pytest.mark.parametrize("kind", ["rest", "openai"])
def test_a_client_that_goes_away_mid_answer_cancels_its_generation_in_the_llm(served, report, triton, kind):
    """A browser tab closed, or an OpenAI client dropped, while the answer streams: the server stops the LLM at
    once, as for a cancelled gRPC call, instead of generating for nobody. (The client leaves while the server
    waits for the next token; a client gone during a send, which EventStream covers, is not forced here.)"""
    request_id = f"gone-{kind}-{time.time_ns()}"
    options = {"answerer": "llm", "route": "simple", "perception": "off"}
    if kind == "rest":
        path, body = "/api/v1/collections/alpha/query", {"question": QUESTION, "options": {**options, "max_tokens": 400}}
    else:
        path, body = "/v1/chat/completions", {"model": "alpha", "stream": True, "max_tokens": 400, "thinkserve": options,
                                              "messages": [{"role": "user", "content": QUESTION}]}
    headers = {"authorization": f"Bearer {ALPHA}", "x-request-id": request_id}
    with httpx.Client(base_url=served, headers=headers, timeout=120) as http:
        with http.stream("POST", path, json=body) as response:
            assert response.status_code == 200, response.read()
            assert _first_words(response, kind)
        # leaving the block closes the connection mid-answer
    produced = tokens_before_cancellation(triton, request_id)
    assert produced is not None, "the LLM never saw the client go away"
    assert produced < 400
    with client(served) as alpha:  # and the server answers the next question
        assert alpha.post("/collections/alpha/retrieve", json={"question": QUESTION}).status_code == 200


def test_retrieve_answers_with_one_json_response(served, report):
    with client(served) as alpha:
        response = alpha.post("/collections/alpha/retrieve", json={"question": QUESTION, "options": {"top_k": 3}})
    items = response.json()["evidence"]["items"]
    assert response.status_code == 200 and len(items) == 3 and items[0]["page"] == FACT_PAGE


def test_bad_requests_are_clear_errors_and_lose_nothing(served, report):
    with client(served) as alpha, client(served, READER) as reader:
        corrupt = alpha.put("/collections/alpha/documents/broken.pdf", content=b"%PDF-1.7\n" + b"\x00garbage" * 64,
                            headers={"content-type": "application/pdf"})
        assert corrupt.status_code == 400 and "broken.pdf" in corrupt.json()["error"]["message"]
        unknown_option = alpha.post("/collections/alpha/query", json={"question": QUESTION, "options": {"depth": 3}})
        assert unknown_option.status_code == 400 and "depth" in unknown_option.json()["error"]["message"]
        extra_field = alpha.post("/collections/alpha/query", json={"question": QUESTION, "stream": True})
        assert extra_field.status_code == 400 and "stream" in extra_field.json()["error"]["message"]
        missing = alpha.post("/collections/nowhere/query", json={"question": QUESTION})
        assert missing.status_code == 403  # not granted: whether it exists is not said
        assert reader.delete("/collections/alpha/documents/operations review.pdf").status_code == 403
        assert alpha.get("/collections/alpha/documents/nothing.pdf").status_code == 404
        (kept,) = alpha.get("/collections/alpha/documents").json()["documents"]
        assert kept["document_id"] == report["document_id"]


def test_an_upload_over_the_limit_is_refused_before_it_is_read(triton, triton_settings, tmp_path_factory):
    loop = BackgroundLoop()
    settings = console_settings(triton, triton_settings, tmp_path_factory.mktemp("small"), server={"max_upload_bytes": 4096})
    deployment = Deployment(settings)
    loop.run(deployment.start(progress=lambda _: None))
    try:
        with client(deployment.http_address) as alpha:
            response = alpha.put("/collections/alpha/documents/big.md", content=b"# big\n" + b"word " * 2000)
            assert response.status_code == 400
            assert response.json()["error"]["message"] == "upload exceeds 4096 bytes (server.max_upload_bytes)"
            assert alpha.get("/collections").json() == {"collections": []}
    finally:
        loop.run(deployment.stop())
        loop.close()
