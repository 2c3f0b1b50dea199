"""The OpenAI-compatible endpoint as OpenAI's own SDK uses it: the conversation reaches the LLM, streamed usage,
parameters that cannot be honoured refused by name, OpenAI's error types, Retry-After on 429, and
/v1/embeddings served by the text embedder."""

from __future__ import annotations

import threading
import time

import httpx
import numpy as np
import openai
import pytest

from orchestrator.api.security import new_token
from orchestrator.server.deployment import Deployment
from tests.conftest import SAMPLE_DOCUMENT, settings_with
from tests.integration.conftest import BackgroundLoop

pytestmark = pytest.mark.integration

QUESTION = "What was Northwind's total revenue in 2024?"
TOKEN, DIGEST = new_token()
LLM = {"answerer": "llm", "max_tokens": 8, "route": "simple", "perception": "off", "page_images": False}


@pytest.fixture(scope="module")
def served(triton, triton_settings, tmp_path_factory):
    """A deployment running one query at a time with none waiting (so a second one is a 429), with a token."""
    settings = settings_with(
        triton_settings.model_copy(update={"url": triton.endpoints.grpc}), tmp_path_factory.mktemp("openai-data"),
        server={"max_concurrent_queries": 1, "max_queued_queries": 0},
        auth={"tokens": [{"name": "app", "sha256": DIGEST, "collections": ["*"], "write": True}]},
    )
    loop = BackgroundLoop()
    deployment = Deployment(settings)
    loop.run(deployment.start(progress=lambda _: None))
    from orchestrator.client import ThinkServeClient

    with ThinkServeClient(deployment.address, token=TOKEN) as client:
        client.ingest_file("docs", SAMPLE_DOCUMENT)
    yield deployment.http_address
    loop.run(deployment.stop())
    loop.close()


def sdk(http_address: str, token: str = TOKEN) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{http_address}/v1", api_key=token, max_retries=0, timeout=120)


def test_the_conversation_reaches_the_llm_and_the_extractive_answer_says_it_did_not_read_it(served):
    client = sdk(served)
    alone = client.chat.completions.create(model="docs", messages=[{"role": "user", "content": QUESTION}],
                                           extra_body={"thinkserve": LLM})
    earlier = [
        {"role": "system", "content": "You are the finance team's assistant. Quote figures in euros."},
        {"role": "user", "content": "Which company's annual report is this?"},
        {"role": "assistant", "content": "Northwind's 2024 annual report [1]."},
        {"role": "user", "content": QUESTION},
    ]
    threaded = client.chat.completions.create(model="docs", messages=earlier, extra_body={"thinkserve": LLM})
    assert threaded.model_extra["thinkserve"]["answer_source"] == "llm"
    assert threaded.model_extra["thinkserve"]["conversation"] == "read by the answering model"
    assert "conversation" not in alone.model_extra["thinkserve"]
    # the same question and evidence: the prompt grew by the system prompt and the two earlier turns
    grown = threaded.usage.prompt_tokens - alone.usage.prompt_tokens
    assert grown >= 30, (alone.usage, threaded.usage)

    extractive = client.chat.completions.create(model="docs", messages=earlier)
    assert extractive.model_extra["thinkserve"]["conversation"].startswith("not read: the extractive answer")
    assert extractive.choices[0].message.content  # answered from the last user message


def test_streamed_usage_comes_in_its_own_last_chunk(served):
    stream = sdk(served).chat.completions.create(
        model="docs", messages=[{"role": "user", "content": QUESTION}], stream=True,
        stream_options={"include_usage": True}, extra_body={"thinkserve": LLM},
    )
    chunks = list(stream)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert all(chunk.usage is None for chunk in chunks[:-1])
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("param, arguments", [
    ("n", {"n": 2}),
    ("stop", {"stop": ["\n"]}),
    ("logprobs", {"logprobs": True}),
    ("response_format", {"response_format": {"type": "json_object"}}),
    ("tools", {"tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]}),
    ("frequency_penalty", {"frequency_penalty": 0.5}),
    ("frobnicate", {"extra_body": {"frobnicate": 1}}),
    ("messages[0].role", {"messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}]}),
])
def test_a_parameter_that_cannot_be_honoured_is_a_400_naming_it(served, param, arguments):
    request = {"model": "docs", "messages": [{"role": "user", "content": QUESTION}], **arguments}
    with pytest.raises(openai.BadRequestError) as refused:
        sdk(served).chat.completions.create(**request)
    assert refused.value.param == param and refused.value.type == "invalid_request_error"
    assert refused.value.code == "INVALID_ARGUMENT"


def test_errors_carry_openais_types(served):
    with pytest.raises(openai.AuthenticationError) as unauthenticated:
        sdk(served, token="not-a-token").chat.completions.create(model="docs", messages=[{"role": "user", "content": "x"}])
    assert unauthenticated.value.type == "authentication_error"
    with pytest.raises(openai.NotFoundError) as missing:
        sdk(served).chat.completions.create(model="nowhere", messages=[{"role": "user", "content": QUESTION}])
    assert missing.value.type == "not_found_error" and "nowhere" in missing.value.message


def test_a_full_queue_is_a_429_with_retry_after(served):
    """One query runs (no queue): a second one sent meanwhile is refused at once and told when to retry."""
    busy = threading.Thread(target=lambda: httpx.post(
        f"{served}/v1/chat/completions", timeout=120, headers={"authorization": f"Bearer {TOKEN}"},
        json={"model": "docs", "messages": [{"role": "user", "content": QUESTION}], "thinkserve": {**LLM, "max_tokens": 400}},
    ))
    busy.start()
    try:
        deadline = time.monotonic() + 60
        while 'thinkserve_in_flight_requests{pool="queries"} 1.0' not in httpx.get(f"{served}/metrics").text:
            assert time.monotonic() < deadline, "the busy query never ran"
            time.sleep(0.01)
        with pytest.raises(openai.RateLimitError) as raised:
            sdk(served).chat.completions.create(model="docs", messages=[{"role": "user", "content": QUESTION}])
        refused = raised.value
        assert refused.response.headers["retry-after"] == "1" and refused.type == "rate_limit_error"
        assert "server.max_concurrent_queries" in refused.message
    finally:
        busy.join(120)


def test_embeddings_are_the_text_embedders(served):
    client = sdk(served)
    texts = ["Northwind's revenue in 2024", "Northwind's revenue in 2024", "a recipe for bread"]
    response = client.embeddings.create(model="text_embedder", input=texts)  # the SDK asks for base64
    vectors = np.asarray([item.embedding for item in response.data])
    assert vectors.shape == (3, 384) and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    assert np.allclose(vectors[0], vectors[1]) and float(vectors[0] @ vectors[2]) < 0.99
    assert response.model == "text_embedder" and response.usage.prompt_tokens > 0
    plain = httpx.post(f"{served}/v1/embeddings", headers={"authorization": f"Bearer {TOKEN}"}, timeout=60,
                       json={"model": "text_embedder", "input": texts[0], "encoding_format": "float"}).json()
    assert np.allclose(plain["data"][0]["embedding"], vectors[0], atol=1e-6)
    with pytest.raises(openai.BadRequestError) as wrong:
        client.embeddings.create(model="text-embedding-3-small", input="x")
    assert wrong.value.param == "model" and "text_embedder" in wrong.value.message
    anonymous = httpx.post(f"{served}/v1/embeddings", json={"model": "text_embedder", "input": "x"}, timeout=60)
    assert anonymous.status_code == 401 and anonymous.json()["error"]["type"] == "authentication_error"
