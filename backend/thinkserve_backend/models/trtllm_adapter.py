"""The generators of the gpu target: Triton's TensorRT-LLM backend (a `tensorrt_llm` model, in-flight batching)
behind BLS models that keep our contracts (LLM, VLM, VLM_RELEVANCE, ROUTER).

The LLM and the VLM stream as models/generator.py does (same output tensors, same finish reasons, cancellation);
the relevance filter and the LLM router read the first generated step's logits of one batched engine request.
What the engine's tensors mean, and where that is documented: thinkserve_backend.trtllm.
"""

from __future__ import annotations

import uuid
from typing import Iterator

import numpy as np
import triton_python_backend_utils as pb_utils

from .. import trtllm
from ..decoding import GenerationStep
from ..images import ImagePreprocessing, pixels_of, place_images
from ..relevance import yes_probability
from .common import input_images, input_strings, single_text
from .parameters import ModelParameters
from .generator import LanguageModel
from .prompt_classifier import PromptClassifierModel
from .relevance import ImageRelevanceModel

_PROMPT_TABLE_TYPES = {"float16": np.float16, "float32": np.float32, "bfloat16": None}  # bfloat16: through torch


class EngineError(RuntimeError):
    """The tensorrt_llm (or vision) model answered with an error; the message names it."""


def _engine_options(params: ModelParameters, eos_token_ids: list[int]) -> trtllm.EngineOptions:
    end_id = params.integer("end_id", eos_token_ids[0])
    return trtllm.EngineOptions(
        end_id=end_id,
        pad_id=params.integer("pad_id", end_id),
        stop_token_ids=tuple(t for t in eos_token_ids if t != end_id),
        generation_logits=params.flag("generation_logits", False),
        seed_input=params.string("engine_seed_input", "seed"),
    )


def _array(tensor) -> np.ndarray:
    """A BLS output as numpy; through DLPack where numpy has no such type (bfloat16) or the tensor is on a GPU."""
    if tensor.is_cpu():
        try:
            return tensor.as_numpy()
        except Exception:  # as_numpy refuses BF16
            pass
    from torch.utils.dlpack import from_dlpack

    return from_dlpack(tensor.to_dlpack()).float().cpu().numpy()


def _outputs(responses, model: str):
    """The engine's responses as {name: array}; an error response raises, naming the model that sent it."""
    for response in responses:
        if response.has_error():
            raise EngineError(f"{model}: {response.error().message()}")
        yield {tensor.name(): _array(tensor) for tensor in response.output_tensors()}


def _tensor(name: str, array: np.ndarray, dtype_name: str = "") -> "pb_utils.Tensor":
    if dtype_name == "bfloat16":
        import torch
        from torch.utils.dlpack import to_dlpack

        values = torch.from_numpy(np.asarray(array, np.float32)).to(torch.bfloat16)
        return pb_utils.Tensor.from_dlpack(name, to_dlpack(values))
    return pb_utils.Tensor(name, array)


def _request(model: str, inputs: dict[str, np.ndarray], outputs, table_dtype: str = "", request_id: str = ""):
    tensors = [
        _tensor(name, value, table_dtype if name == "prompt_embedding_table" else "") for name, value in inputs.items()
    ]
    return pb_utils.InferenceRequest(
        model_name=model,
        requested_output_names=list(outputs),
        inputs=tensors,
        request_id=request_id,
        preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0),
    )


class VisionTower:
    """The VLM's vision model (a Triton model: pixel_values [n, 3, h, w] -> image_features [n, tokens, hidden])."""

    def __init__(self, params: ModelParameters, tokenizer):
        self.model = params.string("vision_model")
        self.image_token = params.string("image_token")
        self.image_token_id = tokenizer.token_to_id(self.image_token)
        if self.image_token_id is None:
            raise ValueError(f"model {params.model_name}: image token {self.image_token!r} is not in the tokenizer")
        self.preprocessing = ImagePreprocessing.from_json(params.string("preprocessing"))
        self.tokens_per_image = params.integer("image_tokens_per_image")  # contracts.IMAGE_TOKENS_PARAMETER
        self.table_dtype = params.string("prompt_table_dtype", "float16")
        if self.table_dtype not in _PROMPT_TABLE_TYPES:
            raise ValueError(
                f"model {params.model_name}: prompt_table_dtype must be one of {sorted(_PROMPT_TABLE_TYPES)}"
            )

    def features(self, pixels: np.ndarray) -> np.ndarray:
        inputs = {trtllm.VISION_INPUT: pixels.astype(np.float32, copy=False)}
        request = _request(self.model, inputs, [trtllm.VISION_OUTPUT])
        response = request.exec()
        if response.has_error():
            raise EngineError(f"{self.model}: {response.error().message()}")
        return _array(pb_utils.get_output_tensor_by_name(response, trtllm.VISION_OUTPUT))

    def table(self, features: np.ndarray) -> np.ndarray:
        dtype = _PROMPT_TABLE_TYPES[self.table_dtype] or np.float32  # bfloat16 is made when the tensor is
        return trtllm.prompt_table(features, self.tokens_per_image, dtype)


class TrtllmLanguageModel(LanguageModel):
    """The LLM: each request one streamed engine request, its responses relayed as our steps. `initialize`,
    `execute`, `finalize`, the request's parameters and the response tensors are models/generator.py's."""

    vision = False
    # Each generation thread waits on its engine stream; in-flight batching runs them together on the GPU.
    default_concurrent_generations = 64
    batches_in_engine = True

    def load(self, params: ModelParameters, args: dict) -> None:
        self.vocab_size = params.integer("vocab_size")  # contracts.VOCABULARY_PARAMETER
        self.engine_model = params.string("engine_model")
        self.options = _engine_options(params, self.eos_token_ids)
        self.tower = VisionTower(params, self.tokenizer) if self.vision else None
        self.unmeasured_reported = False

    def engine_prompt(self, request) -> tuple[list[int], None]:
        """Prompt ids (and a VLM's prompt table). Prompts come rendered with the model's chat template: no special
        tokens are added."""
        text = single_text(input_strings(request, "text_input"), "text_input")
        return self.tokenizer.encode(text, add_special_tokens=False).ids, None

    def steps(self, request, params, is_cancelled) -> tuple[int, Iterator[GenerationStep]]:
        """One streamed engine request, its responses relayed as our steps (generator.py sends them)."""
        prompt_ids, table = self.engine_prompt(request)
        prompt_tokens = len(prompt_ids)
        budget = trtllm.generation_budget(prompt_tokens, params.max_tokens, self.max_context)
        if budget == 0:  # the engine refuses request_output_len 0
            return prompt_tokens, iter([GenerationStep("", finish_reason="length")])
        stream = trtllm.TrtllmStream(
            lambda ids: self.tokenizer.decode(list(ids), skip_special_tokens=True),
            params, budget, self.eos_token_ids, self.vocab_size,
        )
        request_id = f"{self.model_name}-{uuid.uuid4().hex}"
        engine_request = _request(
            self.engine_model,
            trtllm.generation_inputs(prompt_ids, params, budget, self.options, table),
            trtllm.stream_outputs(params, self.options),
            self.tower.table_dtype if self.tower else "",
            request_id,
        )
        responses = engine_request.exec(decoupled=True)
        steps = trtllm.relay(
            _outputs(responses, self.engine_model),
            stream,
            cancel=lambda: self._cancel(responses, request_id),
            client_gone=is_cancelled,
        )
        return prompt_tokens, self._reported(steps, stream, trtllm.wants_logits(params, self.options))

    def _reported(self, steps: Iterator[GenerationStep], stream: trtllm.TrtllmStream, asked: bool) -> Iterator[GenerationStep]:
        yield from steps
        if asked:
            self._report_unmeasured(stream)

    def _cancel(self, responses, request_id: str):
        """Stop the engine's request: the BLS iterator's cancel() where the python backend has it, else the backend's
        own stop request (same request id, `stop` true)."""
        if hasattr(responses, "cancel"):
            responses.cancel()
            return
        stop = _request(self.engine_model, trtllm.stop_inputs(), [], request_id=request_id)
        for _ in _outputs(stop.exec(decoupled=True), self.engine_model):
            pass

    def _report_unmeasured(self, stream: trtllm.TrtllmStream):
        """Say once when logits were asked for and did not come."""
        if not stream.entropy_measured and not self.unmeasured_reported:
            self.unmeasured_reported = True
            pb_utils.Logger.log_warn(
                f"{self.model_name}: {self.engine_model} returned tokens without generation_logits, so their "
                "normalized_entropy is NaN (and log_probs NaN unless sampling at temperature 1): build the engine "
                "with --gather_generation_logits"
            )


class TrtllmVisionLanguageModel(TrtllmLanguageModel):
    """The VLM: images through the vision model, their features the engine's prompt table (LLaVA's splice)."""

    vision = True

    def engine_prompt(self, request) -> tuple[list[int], "np.ndarray | None"]:
        tower = self.tower
        text = single_text(input_strings(request, "text_input"), "text_input")
        images = input_images(request)
        text = place_images(text, len(images), tower.image_token)
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        if not images:
            return ids, None
        prompt = trtllm.vision_prompt(ids, tower.image_token_id, tower.tokens_per_image, self.vocab_size)
        trtllm.generation_budget(len(prompt), 0, self.max_context)  # refuse before the vision model runs
        pixels = np.stack([pixels_of(data, tower.preprocessing) for data in images])
        return prompt, tower.table(tower.features(pixels))


class EngineScorer:
    """First-step logits from the tensorrt_llm model: one non-streamed, one-token request per batch of prompts."""

    def __init__(self, params: ModelParameters, table_dtype: str = ""):
        self.model = params.string("engine_model")
        self.vocab_size = params.integer("vocab_size")  # contracts.VOCABULARY_PARAMETER
        self.max_batch = params.integer("engine_max_batch_size", 32)  # the tensorrt_llm model's max_batch_size
        self.table_dtype = table_dtype

    def first_logits(self, prompts: list[list[int]], tables: "np.ndarray | None" = None) -> np.ndarray:
        logits = []
        for start in range(0, len(prompts), self.max_batch):
            rows = prompts[start : start + self.max_batch]
            chunk = None if tables is None else tables[start : start + self.max_batch]
            request = _request(self.model, trtllm.scoring_inputs(rows, chunk), trtllm.SCORING_OUTPUTS, self.table_dtype)
            responses = _outputs(request.exec(decoupled=True), self.model)
            logits.append(trtllm.first_step_logits(responses, len(rows), self.vocab_size))
        return np.concatenate(logits)

    def prefill_logits(self, ids: np.ndarray) -> np.ndarray:
        """What PromptClassifierModel asks its decoder for: next-token logits [b, vocab] after prompts [b, n]."""
        return self.first_logits([list(row) for row in ids])


class TrtllmRelevanceModel(ImageRelevanceModel):
    """V-RAG's page filter on the engine: P(yes) of the first step after the yes/no prompt with the page's features as
    its prompt table. `initialize`, `execute` and the question's truncation are models/relevance.py's."""

    def load(self, params: ModelParameters, args: dict) -> None:
        self.tower = VisionTower(params, self.tokenizer)
        self.scorer = EngineScorer(params, self.tower.table_dtype)

    def _score(self, pairs) -> np.ndarray:
        features = self.tower.features(np.stack([pixels for _, pixels in pairs]))
        prompts = [
            trtllm.vision_prompt(ids, self.image_token_id, self.image_tokens, self.scorer.vocab_size)
            for ids, _ in pairs
        ]
        tables = self.tower.table(features).reshape(len(pairs), self.image_tokens, -1)  # a table per page
        return yes_probability(self.scorer.first_logits(prompts, tables), self.yes_ids, self.no_ids)


class TrtllmPromptClassifierModel(PromptClassifierModel):
    """The LLM router on the engine: models/prompt_classifier.py's `initialize` and `execute`, the engine as its
    decoder."""

    def load_decoder(self, params: ModelParameters, args: dict) -> "EngineScorer":
        return EngineScorer(params)
