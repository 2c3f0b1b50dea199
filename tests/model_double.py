"""An in-process implementation of the model protocol (orchestrator.models.protocol.Models), for unit tests of
the pipeline's and the ingestor's control flow without a Triton.

It behaves as the models do where the control flow can tell: embeddings are deterministic bags of hashed words
(texts that share words are close, as with a real embedder), the reranker scores shared words, generations
stream word by word with token counts and entropies, and the generators declare their facts. Any call can be
made to wait (`delays`, `token_delay_s`) or fail (`failures`, `fail_after_chunks`) with the errors the Triton
client raises. Every path tested with it also has an integration test against the real Triton.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Optional, Sequence

import numpy as np

from orchestrator.errors import DeadlineExceededError, InvalidRequestError, ModelExecutionError
from orchestrator.models import contracts
from orchestrator.models.chat_template import ChatTemplate
from orchestrator.models.protocol import GenerationChunk, GenerationOptions, GeneratorFacts, PageText

_WORD = re.compile(r"\w+")
# Qwen's ChatML (the tiny profile's template too: thinkserve_build.recipes.CHATML_TEMPLATE)
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHATML = ChatTemplate(CHATML_TEMPLATE)


def bag_of_words(text: str, dimension: int) -> np.ndarray:
    """A unit vector with one hashed, signed dimension per word: the cosine of two texts grows with the words they share."""
    vector = np.zeros(dimension, np.float32)
    for word in _WORD.findall(text.lower()):
        digest = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
        vector[digest % dimension] += 1.0 if (digest >> 32) & 1 else -1.0
    norm = np.linalg.norm(vector)
    return vector / norm if norm else np.full(dimension, dimension**-0.5, np.float32)


@dataclass
class GenerationCall:
    model: str
    prompt: str
    options: GenerationOptions
    images: int


@dataclass
class InProcessModels:
    dimension: int = 64
    answer: str = "Northwind's revenue was 412 million euros [1]."  # what the LLM and VLM say, word by word
    # normalised entropy of every token of a generation, from its prompt (the judger reads it)
    entropy: Callable[[str], float] = lambda prompt: 0.1
    # log-probability of every token of a generation, from its prompt and options (the surprisal judger reads it)
    log_prob: Callable[[str, GenerationOptions], float] = lambda prompt, options: -0.1
    # when entropies stream: always (the cpu and torch targets), asked (the gpu target's engines: NaN unless the
    # request asks), never (an engine built without logits)
    entropies_stream: str = "always"
    facts: dict[str, GeneratorFacts] = field(default_factory=lambda: {
        contracts.LLM.name: GeneratorFacts(2048, vocabulary=4099, judger_entropy_nats=2.0, chat_template=CHATML_TEMPLATE),
        contracts.VLM.name: GeneratorFacts(1024, image_tokens=16, vocabulary=4099, chat_template=CHATML_TEMPLATE),
    })
    delays: dict[str, float] = field(default_factory=dict)  # model name -> seconds each call waits first
    failures: dict[str, Exception] = field(default_factory=dict)  # model name -> what each call raises
    token_delay_s: float = 0.0  # between streamed chunks
    fail_after_chunks: Optional[int] = None  # a generation breaks after this many chunks
    calls: list[str] = field(default_factory=list)  # model names, in call order
    generations: list[GenerationCall] = field(default_factory=list)
    open_streams: int = 0  # generations whose stream is open (Triton's: not yet ended or cancelled)
    # what OCR reads in an encoded image (None: no text); a ValueError it raises is the model refusing the image
    page_text: Callable[[bytes], Optional[PageText]] = lambda image: None

    async def _call(self, model: str, timeout_s: Optional[float]) -> None:
        """Wait and fail as configured; a wait longer than the call's timeout ends as the Triton client's does."""
        self.calls.append(model)
        delay = self.delays.get(model, 0.0)
        if timeout_s is not None and delay > timeout_s:
            await asyncio.sleep(timeout_s)
            raise DeadlineExceededError(f"{model}: no answer within {timeout_s:.1f}s")
        if delay:
            await asyncio.sleep(delay)
        if model in self.failures:
            raise self.failures[model]

    async def embed(self, texts: Sequence[str], timeout_s: Optional[float] = None) -> np.ndarray:
        await self._call(contracts.TEXT_EMBEDDER.name, timeout_s)
        return np.stack([bag_of_words(text, self.dimension) for text in texts]) if texts else np.zeros((0, self.dimension), np.float32)

    async def rerank(self, query: str, passages: Sequence[str], timeout_s: Optional[float] = None) -> np.ndarray:
        await self._call(contracts.RERANKER.name, timeout_s)
        asked = set(_WORD.findall(query.lower()))
        return np.asarray([len(asked & set(_WORD.findall(p.lower()))) / (len(asked) or 1) for p in passages], np.float32)

    async def route(self, questions: Sequence[str], timeout_s: Optional[float] = None) -> np.ndarray:
        await self._call(contracts.ROUTER.name, timeout_s)
        return np.tile(np.asarray([[0.8, 0.15, 0.05]], np.float32), (len(questions), 1))

    async def embed_page_text(self, family: str, texts: Sequence[str], timeout_s: Optional[float] = None) -> np.ndarray:
        await self._call(contracts.page_text_encoder(family).name, timeout_s)
        return np.stack([bag_of_words(text, self.dimension) for text in texts])

    async def embed_page_images(self, family: str, images: Sequence[bytes], timeout_s: Optional[float] = None) -> np.ndarray:
        await self._call(contracts.page_image_encoder(family).name, timeout_s)
        return np.stack([bag_of_words(hashlib.sha256(image).hexdigest(), self.dimension) for image in images])

    async def page_relevance(self, question: str, images: Sequence[bytes], timeout_s: Optional[float] = None) -> np.ndarray:
        await self._call(contracts.VLM_RELEVANCE.name, timeout_s)
        return np.full(len(images), 0.9, np.float32)

    async def generator_facts(self, model: str) -> GeneratorFacts:
        return self.facts[model]

    async def read_text(self, images: Sequence[bytes], timeout_s: Optional[float] = None) -> list[PageText]:
        await self._call(contracts.OCR.name, timeout_s)
        read = []
        for image in images:
            try:
                text = self.page_text(image)
            except ValueError as error:  # as the Triton client reports an image the model refused
                raise InvalidRequestError(f"model ocr rejected the request: {error}") from None
            read.append(text or PageText((), np.zeros((0, 4, 2), np.float32), np.zeros(0, np.float32)))
        return read

    @contextlib.asynccontextmanager
    async def generate(
        self, prompt: str, options: GenerationOptions, images: Sequence[bytes] = (), timeout_s: Optional[float] = None,
        request_id: str = "",
    ) -> AsyncIterator[AsyncIterator[GenerationChunk]]:
        model = contracts.VLM.name if images else contracts.LLM.name
        await self._call(model, timeout_s)
        self.generations.append(GenerationCall(model, prompt, options, len(images)))
        words = self.answer.split()[: options.max_tokens]
        streamed = self.entropies_stream == "always" or (self.entropies_stream == "asked" and options.entropies)
        entropy = self.entropy(prompt) if streamed else float("nan")
        log_prob = self.log_prob(prompt, options)
        prompt_tokens = len(_WORD.findall(prompt))

        async def chunks() -> AsyncIterator[GenerationChunk]:
            for produced, word in enumerate(words, 1):
                if self.fail_after_chunks is not None and produced > self.fail_after_chunks:
                    raise ModelExecutionError(f"{model}: the generation broke after {self.fail_after_chunks} chunks")
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                last = produced == len(words)
                yield GenerationChunk(
                    text=word + ("" if last else " "), token_ids=(produced,), log_probs=(log_prob,), normalized_entropy=(entropy,),
                    finish_reason="length" if last else "", prompt_tokens=prompt_tokens, completion_tokens=produced,
                )

        self.open_streams += 1
        try:
            yield chunks()
        finally:  # where the Triton client cancels a stream left early
            self.open_streams -= 1
