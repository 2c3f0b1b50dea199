"""Typed calls to the models of orchestrator.models.contracts: Python values in, numpy arrays / chunks out.

The rest of the orchestrator calls these methods and never builds a tensor by hand. Batches larger than a
model's max_batch_size (read from the deployed config) are split into several concurrent requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import AsyncIterator, Optional, Sequence

import numpy as np

from ..errors import TritonUnavailableError
from ..models import contracts
from . import statistics
from .breaker import BreakerStatus
from .client import TritonClient
from ..models.protocol import GenerationChunk, GenerationOptions, GeneratorFacts, ModelStatistics, PageText

__all__ = ["GenerationChunk", "GenerationOptions", "GeneratorFacts", "PageText", "TritonModels"]


def _strings(values: Sequence[str | bytes]) -> np.ndarray:
    return np.array([v.encode("utf-8") if isinstance(v, str) else v for v in values], dtype=np.object_).reshape(-1, 1)


def model_statistics(entry: dict) -> ModelStatistics:
    """Triton's statistics of one model (its ModelStatistics message as a dict) in our units (statistics.py)."""
    return ModelStatistics(
        name=entry.get("name", ""),
        inference_count=int(entry.get("inference_count", 0)),
        execution_count=int(entry.get("execution_count", 0)),
        queue_ms=statistics.queue_ns(entry) / 1e6,
        compute_ms=statistics.execution_compute_ns(entry) / 1e6,
        failures=int(entry.get("inference_stats", {}).get("fail", {}).get("count", 0)),
        batch_executions=statistics.batch_executions(entry),
    )


class TritonModels:
    """orchestrator.models.protocol.Models over Triton, and its ModelServer (what Health and Stats report)."""

    def __init__(self, client: TritonClient):
        self.client = client
        self._max_batch: dict[str, int] = {}
        self._facts: dict[str, GeneratorFacts] = {}

    @property
    def url(self) -> str:
        return self.client.url

    async def server_ready(self) -> bool:
        return await self.client.server_ready()

    async def model_ready(self, model: str) -> bool:
        return await self.client.model_ready(model)

    def breakers(self) -> dict[str, BreakerStatus]:
        return self.client.health_snapshot().breakers

    async def statistics(self, timeout_s: Optional[float] = None) -> list[ModelStatistics]:
        response = await self.client.model_statistics(timeout_s=timeout_s)
        return [model_statistics(entry) for entry in response.get("model_stats", [])]

    async def generator_facts(self, model: str) -> GeneratorFacts:
        """Read from the deployed config's parameters once; a generator that does not declare its context
        cannot be given a prompt safely, so it counts as unavailable until the repository is rebuilt."""
        if model not in self._facts:
            parameters = (await self.client.model_config(model)).parameters
            if contracts.CONTEXT_PARAMETER not in parameters:
                raise TritonUnavailableError(
                    f"model {model} does not declare its context length (config parameter "
                    f"{contracts.CONTEXT_PARAMETER!r}): rebuild the model repository"
                )

            def value(name: str) -> Optional[str]:
                return parameters[name].string_value if name in parameters else None

            threshold = value(contracts.JUDGER_THRESHOLD_PARAMETER)
            surprisal = value(contracts.JUDGER_SURPRISAL_PARAMETER)
            variables = json.loads(value(contracts.CHAT_TEMPLATE_VARIABLES_PARAMETER) or "{}")
            self._facts[model] = GeneratorFacts(
                context_tokens=int(value(contracts.CONTEXT_PARAMETER)),
                image_tokens=int(value(contracts.IMAGE_TOKENS_PARAMETER) or 0),
                vocabulary=int(value(contracts.VOCABULARY_PARAMETER) or 0),
                judger_entropy_nats=float(threshold) if threshold is not None else None,
                judger_surprisal_nats=float(surprisal) if surprisal is not None else None,
                chat_template=value(contracts.CHAT_TEMPLATE_PARAMETER) or "",
                chat_template_variables=tuple(sorted((str(k), str(v)) for k, v in variables.items())),
            )
        return self._facts[model]

    async def max_batch_size(self, model: str) -> int:
        if model not in self._max_batch:
            self._max_batch[model] = max(1, (await self.client.model_config(model)).max_batch_size)
        return self._max_batch[model]

    async def _batched(self, model: str, inputs: dict[str, np.ndarray], output: str, timeout_s: Optional[float]) -> np.ndarray:
        rows = len(next(iter(inputs.values())))
        if rows == 0:
            raise ValueError(f"{model}: nothing to run")
        step = await self.max_batch_size(model)
        calls = [
            self.client.infer(model, {k: v[i : i + step] for k, v in inputs.items()}, [output], timeout_s)
            for i in range(0, rows, step)
        ]
        return np.concatenate([result[output] for result in await asyncio.gather(*calls)])

    async def embed(self, texts: Sequence[str], timeout_s: Optional[float] = None) -> np.ndarray:
        """L2-normalised text embeddings [n, d]."""
        c = contracts.TEXT_EMBEDDER
        return await self._batched(c.name, {"text": _strings(texts)}, "embedding", timeout_s)

    async def rerank(self, query: str, passages: Sequence[str], timeout_s: Optional[float] = None) -> np.ndarray:
        """Relevance score of each passage for the query [n]; higher is more relevant."""
        c = contracts.RERANKER
        inputs = {"query": _strings([query] * len(passages)), "passage": _strings(passages)}
        return (await self._batched(c.name, inputs, "score", timeout_s))[:, 0]

    async def route(self, questions: Sequence[str], timeout_s: Optional[float] = None) -> np.ndarray:
        """Probabilities over contracts.ROUTE_LABELS [n, 3]."""
        return await self._batched(contracts.ROUTER.name, {"text": _strings(questions)}, "probabilities", timeout_s)

    async def embed_page_text(self, family: str, texts: Sequence[str], timeout_s: Optional[float] = None) -> np.ndarray:
        model = contracts.page_text_encoder(family).name
        return await self._batched(model, {"text": _strings(texts)}, "embedding", timeout_s)

    async def embed_page_images(self, family: str, images: Sequence[bytes], timeout_s: Optional[float] = None) -> np.ndarray:
        model = contracts.page_image_encoder(family).name
        return await self._batched(model, {"image": _strings(images)}, "embedding", timeout_s)

    async def page_relevance(self, question: str, images: Sequence[bytes], timeout_s: Optional[float] = None) -> np.ndarray:
        """The VLM's P(yes) that each image can answer the question [n] (V-RAG's relevance filter)."""
        inputs = {"question": _strings([question] * len(images)), "image": _strings(images)}
        return (await self._batched(contracts.VLM_RELEVANCE.name, inputs, "relevance", timeout_s))[:, 0]

    async def read_text(self, images: Sequence[bytes], timeout_s: Optional[float] = None) -> list[PageText]:
        """The text lines of each encoded image: one request per image (each has its own number of lines), all
        in flight at once, so Triton batches them."""
        c = contracts.OCR
        outputs = [t.name for t in c.outputs]

        async def one(image: bytes) -> PageText:
            result = await self.client.infer(c.name, {"image": _strings([image])}, outputs, timeout_s)
            return PageText(
                lines=tuple(v.decode("utf-8", errors="replace") for v in result["text"].reshape(-1)),
                boxes=result["boxes"].reshape(-1, 4, 2),
                confidence=result["confidence"].reshape(-1),
            )

        return list(await asyncio.gather(*(one(image) for image in images)))

    @contextlib.asynccontextmanager
    async def generate(
        self,
        prompt: str,
        options: GenerationOptions,
        images: Sequence[bytes] = (),
        timeout_s: Optional[float] = None,
        request_id: str = "",
    ) -> AsyncIterator[AsyncIterator[GenerationChunk]]:
        """Stream from the LLM, or from the VLM when images are given. Leaving the block cancels generation."""
        inputs = {
            "text_input": _strings([prompt]),
            "max_tokens": np.array([[options.max_tokens]], dtype=np.int32),
            "temperature": np.array([[options.temperature]], dtype=np.float32),
            "top_p": np.array([[options.top_p]], dtype=np.float32),
        }
        if options.stop:
            inputs["stop"] = _strings(options.stop).reshape(1, -1)
        if options.seed is not None:
            inputs["seed"] = np.array([[options.seed]], dtype=np.uint64)
        if options.entropies:
            inputs["entropies"] = np.array([[True]], dtype=np.bool_)
        model = contracts.LLM.name
        if images:
            inputs["images"] = _strings(images).reshape(1, -1)
            model = contracts.VLM.name
        async with self.client.stream(model, inputs, timeout_s, request_id) as responses:
            yield _chunks(responses)


async def _chunks(responses) -> AsyncIterator[GenerationChunk]:
    async for arrays in responses:
        yield GenerationChunk(
            text=arrays["text_output"].reshape(-1)[0].decode("utf-8"),
            token_ids=tuple(int(t) for t in arrays["token_ids"].reshape(-1)),
            log_probs=tuple(float(v) for v in arrays["log_probs"].reshape(-1)),
            normalized_entropy=tuple(float(v) for v in arrays["normalized_entropy"].reshape(-1)),
            finish_reason=arrays["finish_reason"].reshape(-1)[0].decode("utf-8"),
            prompt_tokens=int(arrays["prompt_tokens"].reshape(-1)[0]),
            completion_tokens=int(arrays["completion_tokens"].reshape(-1)[0]),
        )
