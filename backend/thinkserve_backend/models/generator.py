"""Decoupled (streaming) generation models: the LLM, and the VLM that splices image features into its prompt.

`execute` hands each request to a worker thread and returns at once, so the stub keeps accepting requests
while tokens stream out; onnxruntime releases the GIL, so concurrent generations use the machine's cores.
A cancelled request (client gone, deadline passed) stops at the next token.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

import numpy as np
import triton_python_backend_utils as pb_utils

from ..decoding import GenerationParams, GenerationStep, generate, splice_image_features
from ..images import ImagePreprocessing, pixels_of, place_images
from .common import (
    ModelParameters,
    bytes_tensor,
    error_response,
    input_images,
    input_scalar,
    input_strings,
    served_generator,
    single_text,
    whole_text_tokenizer,
)

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class LanguageModel:
    vision = False
    default_concurrent_generations = 2  # generation threads, unless the max_concurrent_generations parameter says

    def initialize(self, args):
        params = ModelParameters(args)
        self.params = params
        self.model_name = params.model_name
        self.tokenizer = whole_text_tokenizer(params.file("tokenizer_file"))
        self.eos_token_ids = params.json("eos_token_ids")
        self.max_context = params.integer("max_context")  # orchestrator.models.contracts.CONTEXT_PARAMETER
        self.default_max_tokens = params.integer("default_max_tokens", 256)
        self.load(params, args)
        self.closing = threading.Event()
        self.workers = ThreadPoolExecutor(
            max_workers=params.integer("max_concurrent_generations", self.default_concurrent_generations),
            thread_name_prefix=self.model_name,
        )

    def load(self, params: ModelParameters, args: dict) -> None:
        """What generates: the decoder of the runtime the target chose (a subclass serves another engine)."""
        self.runtime = served_generator(params, args, self.vision)
        self.decoder = self.runtime.decoder

    def execute(self, requests):
        for request in requests:
            self.workers.submit(self._serve, request)
        return None

    def finalize(self):
        self.closing.set()  # running generations end at their next token with finish_reason "cancelled"
        self.workers.shutdown(wait=True, cancel_futures=True)

    def prepare(self, request):
        """Prompt as the decoder's primary input, plus the token-id -> decoder-input function for later steps.
        Prompts come rendered with the model's chat template, which writes any special tokens (a BOS) itself, so
        the tokenizer adds none (as transformers' apply_chat_template tokenizes)."""
        ids = self.tokenizer.encode(single_text(input_strings(request, "text_input"), "text_input"), add_special_tokens=False).ids
        return np.array([ids], dtype=np.int64), None

    def _serve(self, request):
        sender = request.get_response_sender()
        produced = 0
        try:
            params = self._generation_params(request)
            prompt_tokens, steps = self.steps(request, params, lambda: self.closing.is_set() or sender.is_cancelled())
            for step in steps:
                produced = step.completion_tokens
                if step.finish_reason == "cancelled":
                    pb_utils.Logger.log_info(
                        f"{self.model_name}: request '{request.request_id()}' cancelled after {produced} tokens"
                    )
                    sender.send(flags=FINAL)
                    return
                sender.send(self._response(step, prompt_tokens), flags=FINAL if step.finish_reason else 0)
        except Exception as error:
            if sender.is_cancelled():
                sender.send(flags=FINAL)
                return
            pb_utils.Logger.log_warn(f"{self.model_name}: request failed after {produced} tokens: {error}")
            sender.send(error_response(f"{self.model_name}: {error}", error), flags=FINAL)

    def steps(self, request, params: GenerationParams, is_cancelled: Callable[[], bool]) -> tuple[int, Iterator[GenerationStep]]:
        """The prompt's length and the generation's steps (the last one has its finish_reason); a subclass
        generating elsewhere (an engine) overrides this."""
        prompt, embed = self.prepare(request)
        steps = generate(
            self.decoder,
            prompt,
            params,
            decode=lambda ids: self.tokenizer.decode(list(ids), skip_special_tokens=True),
            eos_token_ids=self.eos_token_ids,
            max_context=self.max_context,
            embed=embed,
            is_cancelled=is_cancelled,
        )
        return prompt.shape[1], steps

    def _generation_params(self, request) -> GenerationParams:
        max_tokens = int(input_scalar(request, "max_tokens", self.default_max_tokens))
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        temperature = float(input_scalar(request, "temperature", 0.0))
        top_p = float(input_scalar(request, "top_p", 1.0))
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        seed = input_scalar(request, "seed", None)
        stop = tuple(input_strings(request, "stop") or ())
        entropies = bool(input_scalar(request, "entropies", False))
        return GenerationParams(max_tokens, temperature, top_p, stop, None if seed is None else int(seed), entropies)

    def _response(self, step: GenerationStep, prompt_tokens: int):
        n = len(step.token_ids)
        return pb_utils.InferenceResponse(
            [
                bytes_tensor("text_output", [step.text], (1, 1)),
                pb_utils.Tensor("token_ids", np.array(step.token_ids, dtype=np.int32).reshape(1, n)),
                pb_utils.Tensor("log_probs", np.array(step.log_probs, dtype=np.float32).reshape(1, n)),
                pb_utils.Tensor(
                    "normalized_entropy", np.array(step.normalized_entropy, dtype=np.float32).reshape(1, n)
                ),
                bytes_tensor("finish_reason", [step.finish_reason], (1, 1)),
                pb_utils.Tensor("prompt_tokens", np.array([[prompt_tokens]], dtype=np.int32)),
                pb_utils.Tensor("completion_tokens", np.array([[step.completion_tokens]], dtype=np.int32)),
            ]
        )


class VisionLanguageModel(LanguageModel):
    """LLaVA-style: a vision tower + projector turns each image into `n` embeddings that replace its <image> token."""

    vision = True

    def initialize(self, args):
        super().initialize(args)
        params = self.params
        self.image_token = params.string("image_token")
        self.image_token_id = self.tokenizer.token_to_id(self.image_token)
        if self.image_token_id is None:
            raise ValueError(f"model {self.model_name}: image token {self.image_token!r} is not in the tokenizer")
        self.preprocessing = ImagePreprocessing.from_json(params.string("preprocessing"))

    def prepare(self, request):
        text = single_text(input_strings(request, "text_input"), "text_input")
        images = input_images(request)
        text = place_images(text, len(images), self.image_token)
        ids = np.array([self.tokenizer.encode(text, add_special_tokens=False).ids], dtype=np.int64)
        embeddings = self.runtime.embed(ids)
        if images:
            pixels = np.stack([pixels_of(data, self.preprocessing) for data in images])
            features = self.runtime.image_features(pixels)
            embeddings = splice_image_features(ids[0], embeddings[0], features, self.image_token_id)[None]
        return embeddings.astype(np.float32, copy=False), self.runtime.embed
