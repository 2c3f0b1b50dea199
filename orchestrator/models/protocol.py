"""What the orchestrator asks of its models: the protocol the pipeline and the ingestor depend on.

`TritonModels` implements it over Triton; `pipeline.accounting.StageModels` wraps any implementation to record
each call in a query's ledger; the unit tests drive the pipeline's control flow with an in-process
implementation (tests/model_double.py) that has real behaviour: delays, failures, streams that break midway.
"""

from __future__ import annotations

import math
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import AsyncIterator, Mapping, Optional, Protocol, Sequence

import numpy as np


@dataclass(frozen=True)
class GenerationOptions:
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: Optional[int] = None
    # each token's entropy wanted (the judger's probes): free on the cpu and torch targets, the vocabulary's logits
    # per token on the gpu target's engines, which otherwise stream NaN
    entropies: bool = False


@dataclass(frozen=True)
class GenerationChunk:
    """One streamed response of the LLM or VLM."""

    text: str
    token_ids: tuple[int, ...]
    log_probs: tuple[float, ...]
    normalized_entropy: tuple[float, ...]  # each token's distribution's entropy / ln(vocabulary size)
    finish_reason: str  # empty until the last chunk
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class GeneratorFacts:
    """What the model repository declares about a generator (its config parameters, written by the build)."""

    context_tokens: int  # prompt + generated tokens
    image_tokens: int = 0  # prompt tokens each image takes (VLM)
    vocabulary: int = 0  # logits per step: turns a normalised entropy back into nats; 0: not declared
    judger_entropy_nats: Optional[float] = None  # the judger's threshold calibrated at build (LLM); None: not declared
    judger_surprisal_nats: Optional[float] = None  # the same for the sampled probe's surprisal; None: not declared
    chat_template: str = ""  # its tokenizer's Jinja chat template (orchestrator.models.chat_template); "": not declared
    chat_template_variables: tuple[tuple[str, str], ...] = ()  # the special tokens the template reads (bos_token, ...)


@dataclass(frozen=True)
class PageText:
    """What the OCR model read in one image: its lines in reading order."""

    lines: tuple[str, ...]
    boxes: np.ndarray  # [n, 4, 2] each line's corners (top-left, top-right, bottom-right, bottom-left), (x, y) as
    # fractions of the image's width and height
    confidence: np.ndarray  # [n] mean probability of each line's characters


def mean_entropy_nats(normalized: Sequence[float], vocabulary: int) -> float:
    """Mean token entropy in nats of tokens whose entropies were divided by ln(vocabulary), as generators
    stream them; an answer with no tokens is as uncertain as can be (the uniform distribution's ln(vocabulary))."""
    scale = math.log(vocabulary)
    return float(np.mean(normalized)) * scale if len(normalized) else scale


def mean_surprisal_nats(log_probs: Sequence[float], vocabulary: int) -> float:
    """Mean -log p (nats) of an answer's tokens, from their log-probabilities; like mean_entropy_nats, an answer with
    no tokens counts as the uniform distribution's ln(vocabulary)."""
    return -float(np.mean(log_probs)) if len(log_probs) else math.log(vocabulary)


class Models(Protocol):
    """The model calls of a query or an ingest; every call may raise TritonUnavailableError,
    ModelExecutionError or DeadlineExceededError (orchestrator.errors)."""

    async def embed(self, texts: Sequence[str], timeout_s: Optional[float] = None) -> np.ndarray:
        """L2-normalised text embeddings [n, d]."""

    async def rerank(self, query: str, passages: Sequence[str], timeout_s: Optional[float] = None) -> np.ndarray:
        """Relevance score of each passage for the query [n]; higher is more relevant."""

    async def route(self, questions: Sequence[str], timeout_s: Optional[float] = None) -> np.ndarray:
        """Probabilities over contracts.ROUTE_LABELS [n, 3]."""

    async def embed_page_text(self, family: str, texts: Sequence[str], timeout_s: Optional[float] = None) -> np.ndarray:
        """The page encoder family's text tower [n, d]."""

    async def embed_page_images(self, family: str, images: Sequence[bytes], timeout_s: Optional[float] = None) -> np.ndarray:
        """The page encoder family's image tower [n, d]."""

    async def page_relevance(self, question: str, images: Sequence[bytes], timeout_s: Optional[float] = None) -> np.ndarray:
        """The VLM's P(yes) that each image can answer the question [n] (V-RAG's relevance filter)."""

    async def read_text(self, images: Sequence[bytes], timeout_s: Optional[float] = None) -> list[PageText]:
        """The text lines of each encoded image (OCR); a ModelExecutionError names an image that cannot be read."""

    def generate(
        self, prompt: str, options: GenerationOptions, images: Sequence[bytes] = (), timeout_s: Optional[float] = None,
        request_id: str = "",
    ) -> AbstractAsyncContextManager[AsyncIterator[GenerationChunk]]:
        """Stream from the LLM, or from the VLM when images are given. Leaving the block cancels generation."""

    async def generator_facts(self, model: str) -> GeneratorFacts:
        """The LLM's or VLM's declared context, image length, vocabulary, judger threshold and chat template."""


@dataclass(frozen=True)
class ModelStatistics:
    """One model's counters in the server it runs in, in our units. Compute time is the model's busy time, each
    batched execution counted once."""

    name: str
    inference_count: int
    execution_count: int
    queue_ms: float  # requests' time in the scheduler's queue, summed over requests
    compute_ms: float
    failures: int
    batch_executions: dict[int, int]  # executions per batch size


class BreakerView(Protocol):
    """One model's circuit breaker, as Health reports it."""

    state: str  # closed | open | half_open
    consecutive_failures: int
    last_failure: str  # cause of the latest unavailability failure ("" if none)


class ModelServer(Protocol):
    """What the API's Health and Stats ask of the server the models run in (`TritonModels` answers for Triton)."""

    @property
    def url(self) -> str:
        """Where the server is."""

    async def server_ready(self) -> bool:
        """Whether the server says it is ready; False at once when it cannot be reached."""

    async def model_ready(self, model: str) -> bool:
        """Whether the server says the model is ready."""

    def breakers(self) -> Mapping[str, BreakerView]:
        """Each model's circuit breaker, by name, for every model called so far."""

    async def statistics(self, timeout_s: Optional[float] = None) -> list[ModelStatistics]:
        """Every model's counters; raises a ThinkServeError when the server cannot answer."""
