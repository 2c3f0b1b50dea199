"""Every model of the tiny repository, served by the real tritonserver and called over gRPC."""

from __future__ import annotations

import asyncio
import io
import time

import numpy as np
import pytest
from PIL import Image

from orchestrator.errors import InvalidRequestError, ModelExecutionError, ModelNotFoundError
from orchestrator.models import contracts
from orchestrator.triton.client import TritonClient
from orchestrator.triton.models import GenerationOptions, TritonModels
from tests.integration.conftest import tokens_before_cancellation

pytestmark = pytest.mark.integration

TEXTS = [
    "What was Northwind's total revenue in 2024?",
    "Total revenue for the fiscal year 2024 was 412 million euros.",
    "The Aarhus factory runs on renewable electricity.",
]


def png(width: int = 120, height: int = 80, seed: int = 0) -> bytes:
    pixels = (np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def call(triton, work):
    """Run `work(models)` against the session's Triton on a fresh event loop."""

    async def main():
        async with TritonClient(triton.endpoints.grpc, default_timeout_s=60) as client:
            return await work(TritonModels(client))

    return asyncio.run(main())


def test_every_public_model_is_ready(triton):
    async def work(models):
        return {c.name: await models.client.model_ready(c.name) for c in contracts.all_contracts()}

    assert call(triton, work) == {c.name: True for c in contracts.all_contracts()}


def test_encoders_answer_with_the_contract_shapes_and_dtypes(triton):
    async def work(models):
        return {
            "embed": await models.embed(TEXTS),
            "rerank": await models.rerank(TEXTS[0], TEXTS[1:]),
            "route": await models.route(TEXTS[:2]),
            **{f"text_{f}": await models.embed_page_text(f, TEXTS) for f in contracts.PAGE_ENCODER_FAMILIES},
            **{f"image_{f}": await models.embed_page_images(f, [png(seed=1), png(64, 200, seed=2)]) for f in contracts.PAGE_ENCODER_FAMILIES},
        }

    out = call(triton, work)
    assert out["embed"].shape == (3, 384) and out["embed"].dtype == np.float32
    assert np.allclose(np.linalg.norm(out["embed"], axis=1), 1.0, atol=1e-5)
    assert out["rerank"].shape == (2,) and out["rerank"].dtype == np.float32
    assert out["route"].shape == (2, len(contracts.ROUTE_LABELS))
    assert np.allclose(out["route"].sum(axis=1), 1.0, atol=1e-5)
    for family in contracts.PAGE_ENCODER_FAMILIES:
        text, image = out[f"text_{family}"], out[f"image_{family}"]
        assert text.shape[0] == 3 and image.shape[0] == 2 and text.shape[1] == image.shape[1]
        assert np.allclose(np.linalg.norm(image, axis=1), 1.0, atol=1e-5)


def test_embedder_matches_the_pytorch_reference(triton):
    from sentence_transformers import SentenceTransformer

    from thinkserve_build.recipes import minilm_path

    reference = SentenceTransformer(str(minilm_path()), device="cpu").encode(TEXTS, normalize_embeddings=True)
    served = call(triton, lambda models: models.embed(TEXTS))
    cosine = np.sum(reference * served, axis=1)
    assert cosine.min() >= 0.999, cosine
    # and the model is the real one: a question is closer to its answer than to an unrelated sentence
    assert served[0] @ served[1] > served[0] @ served[2]


def test_concurrent_requests_are_batched_by_triton(triton):
    async def work(models):
        before = (await models.client.model_statistics("text_embedder_encode"))["model_stats"][0]
        await asyncio.gather(*(models.embed([f"sentence number {i} about revenue"]) for i in range(64)))
        # Triton records an execution's statistics just after it sends the responses: wait for the last ones
        for _ in range(50):
            after = (await models.client.model_statistics("text_embedder_encode"))["model_stats"][0]
            if int(after["inference_count"]) - int(before.get("inference_count", 0)) >= 64:
                break
            await asyncio.sleep(0.1)
        return before, after

    before, after = call(triton, work)
    requests = int(after["inference_count"]) - int(before.get("inference_count", 0))
    executions = int(after["execution_count"]) - int(before.get("execution_count", 0))
    assert requests == 64
    assert executions < requests  # Triton's dynamic batcher merged requests into shared executions


def test_the_vlm_relevance_filter_batches_pages_and_matches_single_calls(triton):
    question = "What does the chart show about shipments?"
    images = [png(90 + 10 * i, 120, seed=i) for i in range(6)]

    async def work(models):
        before = (await models.client.model_statistics("vlm_relevance"))["model_stats"][0]
        together = await models.page_relevance(question, images)
        # Triton records an execution's statistics just after it sends the responses: wait for them
        for _ in range(50):
            after = (await models.client.model_statistics("vlm_relevance"))["model_stats"][0]
            if int(after.get("inference_count", 0)) - int(before.get("inference_count", 0)) >= len(images):
                break
            await asyncio.sleep(0.1)
        alone = [float((await models.page_relevance(question, [image]))[0]) for image in images[:2]]
        return together, alone, before, after

    together, alone, before, after = call(triton, work)
    assert together.shape == (6,) and together.dtype == np.float32 and np.all((together > 0) & (together < 1))
    assert np.allclose(together[:2], alone, atol=1e-5)  # one prefill of six prompts = six prefills of one
    assert int(after["execution_count"]) - int(before.get("execution_count", 0)) == 1  # six pages, one execution


def test_the_vlm_relevance_filter_names_a_bad_image(triton):
    with pytest.raises(InvalidRequestError, match="cannot decode image"):
        call(triton, lambda models: models.page_relevance("Why?", [b"not an image"]))


def test_llm_streams_tokens_with_log_probabilities(triton):
    async def work(models):
        chunks = []
        async with models.generate("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n", GenerationOptions(max_tokens=12, seed=3)) as stream:
            async for chunk in stream:
                chunks.append(chunk)
        return chunks

    chunks = call(triton, work)
    assert len(chunks) == 12
    assert [c.completion_tokens for c in chunks] == list(range(1, 13))
    assert all(len(c.token_ids) == len(c.log_probs) == len(c.normalized_entropy) == 1 for c in chunks)
    assert all(lp <= 0.0 for c in chunks for lp in c.log_probs)
    assert all(0.0 <= h <= 1.0 for c in chunks for h in c.normalized_entropy)
    assert chunks[-1].finish_reason == "length" and all(c.finish_reason == "" for c in chunks[:-1])
    assert chunks[0].prompt_tokens > 0


def test_greedy_generation_is_deterministic_and_sampling_follows_the_seed(triton):
    async def generate(models, **options):
        async with models.generate("Revenue grew because", GenerationOptions(max_tokens=8, **options)) as stream:
            return [t async for chunk in stream for t in chunk.token_ids]

    async def work(models):
        return (
            await generate(models),
            await generate(models),
            await generate(models, temperature=1.0, seed=5),
            await generate(models, temperature=1.0, seed=5),
        )

    greedy_a, greedy_b, sampled_a, sampled_b = call(triton, work)
    assert greedy_a == greedy_b and sampled_a == sampled_b


def test_cancelling_a_stream_stops_generation_in_the_model(triton):
    request_id = f"cancel-test-{time.time_ns()}"

    async def work(models):
        received = 0
        async with models.generate("Tell a long story", GenerationOptions(max_tokens=1900), request_id=request_id) as stream:
            async for _ in stream:
                received += 1
                if received == 3:
                    break  # leaving the block cancels the Triton request
        started = time.monotonic()
        async with models.generate("Next request", GenerationOptions(max_tokens=2)) as stream:
            answered = [c async for c in stream]
        return received, answered, time.monotonic() - started

    received, answered, next_latency = call(triton, work)
    assert received == 3 and answered[-1].finish_reason == "length"
    produced = tokens_before_cancellation(triton, request_id, timeout_s=10)
    assert produced is not None, "the LLM never reported the cancellation"
    assert produced < 1900  # it stopped early instead of generating every requested token


def test_vlm_describes_an_image(triton):
    async def work(models):
        async with models.generate("<image>\nWhat does this chart show?", GenerationOptions(max_tokens=4), images=[png()]) as stream:
            return [c async for c in stream]

    chunks = call(triton, work)
    assert chunks[-1].finish_reason == "length" and chunks[-1].completion_tokens == 4
    text_only_prompt_tokens = 10
    assert chunks[-1].prompt_tokens > text_only_prompt_tokens  # the image's features joined the prompt


def test_model_errors_name_the_model_and_the_cause(triton):
    async def unknown(models):
        await models.client.infer("no_such_model", {"text": np.array([[b"x"]], dtype=np.object_)})

    with pytest.raises(ModelNotFoundError, match="does not serve model 'no_such_model'"):
        call(triton, unknown)

    async def corrupt_image(models):
        await models.embed_page_images("clip", [b"not an image"])

    with pytest.raises(InvalidRequestError, match="cannot decode image"):  # INVALID_ARG through the ensemble
        call(triton, corrupt_image)

    async def mismatched_images(models):
        async with models.generate("<image> and <image>", GenerationOptions(max_tokens=2), images=[png()]) as stream:
            return [c async for c in stream]

    with pytest.raises((ModelExecutionError, InvalidRequestError), match="2 <image> placeholders but 1 images"):
        call(triton, mismatched_images)


def test_prompt_beyond_the_context_is_refused_with_the_numbers(triton):
    async def work(models):
        async with models.generate("word " * 5000, GenerationOptions(max_tokens=2)) as stream:
            return [c async for c in stream]

    with pytest.raises((ModelExecutionError, InvalidRequestError), match="the model's context is 2048 tokens"):
        call(triton, work)

