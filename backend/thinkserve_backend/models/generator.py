"""Decoupled (streaming) generation models: the LLM, and the VLM that splices image features into its prompt.

`execute` hands each request to a worker thread and returns at once, so the stub keeps accepting requests
while tokens stream out. How tokens are generated:
- the torch target batches across requests (inflight_batching.py): the worker prepares the prompt and queues it,
  and one scheduler thread advances every running generation by one token per forward pass;
- the onnx runtime (and the torch target with `inflight_batching` off, or when the batch decoder failed its
  check at load) runs one generation per worker thread (decoding.generate); onnxruntime releases the GIL, so
  concurrent generations use the machine's cores.
A cancelled request (client gone, deadline passed) stops at the next token.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

import numpy as np
import triton_python_backend_utils as pb_utils

from ..decoding import GenerationParams, GenerationStep, SequenceProgress, generate, splice_image_features
from ..images import ImagePreprocessing, pixels_of, place_images
from ..inflight_batching import BatchedGeneration, BatcherState, InflightBatcher, inline_lone_steps_by_default
from .common import (
    bytes_tensor,
    error_response,
    input_images,
    input_scalar,
    input_strings,
    served_generator,
    single_text,
    whole_text_tokenizer,
)
from .parameters import ModelParameters

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class _Stream:
    """One request's response sender: each step a response (the last one FINAL), a cancellation logged with the
    tokens produced, a failure as an error response naming the model."""

    def __init__(self, model: "LanguageModel", request):
        self.model, self.request = model, request
        self.sender = request.get_response_sender()
        self.prompt_tokens = 0
        self.produced = 0

    def is_cancelled(self) -> bool:
        return self.model.closing.is_set() or self.sender.is_cancelled()

    def emit(self, step: GenerationStep) -> None:
        self.produced = step.completion_tokens
        if step.finish_reason == "cancelled":
            pb_utils.Logger.log_info(
                f"{self.model.model_name}: request '{self.request.request_id()}' cancelled after {self.produced} tokens"
            )
            self.sender.send(flags=FINAL)
            return
        self.sender.send(self.model._response(step, self.prompt_tokens), flags=FINAL if step.finish_reason else 0)

    def fail(self, error: BaseException) -> None:
        if self.sender.is_cancelled():
            self.sender.send(flags=FINAL)
            return
        pb_utils.Logger.log_warn(f"{self.model.model_name}: request failed after {self.produced} tokens: {error}")
        self.sender.send(error_response(f"{self.model.model_name}: {error}", error), flags=FINAL)


class LanguageModel:
    vision = False
    default_concurrent_generations = 2  # worker threads, unless the max_concurrent_generations parameter says
    default_batch_sequences = 8  # rows decoded together by in-flight batching, unless max_batch_sequences says
    batches_in_engine = False  # a subclass whose engine batches in flight itself (TensorRT-LLM)

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
        # With in-flight batching the workers only prepare prompts (tokenise; a VLM's image features); without it
        # each runs a whole generation.
        self.workers = ThreadPoolExecutor(
            max_workers=params.integer("max_concurrent_generations", self.default_concurrent_generations),
            thread_name_prefix=self.model_name,
        )
        self.metrics = _BatchingMetrics(self.model_name)
        self.batcher = self._batcher(params)

    def load(self, params: ModelParameters, args: dict) -> None:
        """What generates: the decoder of the runtime the target chose (a subclass serves another engine)."""
        self.runtime = served_generator(params, args, self.vision)
        self.decoder = self.runtime.decoder

    def _batcher(self, params: ModelParameters):
        """The in-flight batcher of the torch target, or None for one generation per thread (said in the log and
        in the thinkserve_generator_inflight_batching metric)."""
        reason = ""
        if self.batches_in_engine:  # the engine (TensorRT-LLM) batches in flight itself
            self.metrics.batching(True)
            return None
        if self.runtime.runtime != "torch":
            reason = f"the {self.runtime.runtime} runtime generates one sequence per thread"
        elif not params.flag("inflight_batching", True):
            reason = "the inflight_batching parameter is off"
        batcher = None
        if not reason:
            from ..torch_batch_decoding import BatchDecoder, kv_bytes_per_token

            torch_decoder = self.decoder
            rows = params.integer("max_batch_sequences", self.default_batch_sequences)
            try:
                decoder = BatchDecoder(torch_decoder.modules, rows, self.max_context, torch_decoder.device, torch_decoder.dtype,
                                       grouped_attention=params.flag("grouped_decode_attention", True))
                decoder.self_check()
                graphs = decode_graphs(decoder, params)
                batcher = InflightBatcher(
                    decoder,
                    max_waiting=params.integer("max_waiting_generations", 4 * rows),
                    max_prefill_tokens=params.integer("max_prefill_tokens", 8192),
                    name=self.model_name,
                    on_state=self.metrics.publish,
                    inline_lone_steps=inline_lone_steps(params, torch_decoder.device),
                )
                kv_mb = decoder.cache.nbytes / 2**20
                per_token = kv_bytes_per_token(torch_decoder.modules.text_config, torch_decoder.dtype)
                pb_utils.Logger.log_info(
                    f"{self.model_name}: in-flight batching, {rows} sequences of up to {self.max_context} positions "
                    f"({kv_mb:.0f} MiB of KV cache, {per_token} bytes a token) on {torch_decoder.device}; "
                    f"decode step: {decoder.decode_mode}" + (f" ({graphs})" if graphs else "")
                    + ("; a lone request's tokens sent from the scheduler's thread" if batcher.inline_lone_steps
                       else "; every token sent from the delivery thread")
                    + "; attention: " + (decoder.no_grouped_attention_reason and f"sdpa ({decoder.no_grouped_attention_reason})"
                                         or "grouped query heads folded in a decode step (torch_decode_attention)")
                )
            except Exception as error:  # e.g. a transformers whose attention ignores the cache it is handed
                reason = f"the batch decoder failed its check at load ({error})"
        if reason:
            pb_utils.Logger.log_warn(f"{self.model_name}: no in-flight batching: {reason}; one generation per thread")
        self.metrics.batching(batcher is not None)
        return batcher

    def execute(self, requests):
        serve = self._queue if self.batcher is not None else self._serve
        for request in requests:
            self.workers.submit(serve, request)
        return None

    def finalize(self):
        self.closing.set()  # running generations end at their next token with finish_reason "cancelled"
        if self.batcher is not None:
            self.batcher.close()
        self.workers.shutdown(wait=True, cancel_futures=True)
        self.metrics.close()

    def prepare(self, request):
        """Prompt as the decoder's primary input, plus the token-id -> decoder-input function for later steps.
        Prompts come rendered with the model's chat template, which writes any special tokens (a BOS) itself, so
        the tokenizer adds none (as transformers' apply_chat_template tokenizes)."""
        ids = self.tokenizer.encode(single_text(input_strings(request, "text_input"), "text_input"), add_special_tokens=False).ids
        return np.array([ids], dtype=np.int64), None

    def _serve(self, request):
        """One whole generation on this worker thread."""
        stream = _Stream(self, request)
        try:
            params = self._generation_params(request)
            stream.prompt_tokens, steps = self.steps(request, params, stream.is_cancelled)
            for step in steps:  # to the iterator's end: an engine's relay cancels its request after a stop string
                stream.emit(step)
        except Exception as error:
            stream.fail(error)

    def _queue(self, request):
        """Prepare the request's prompt on this worker thread and queue it for the in-flight batcher."""
        stream = _Stream(self, request)
        try:
            params = self._generation_params(request)
            prompt, _ = self.prepare(request)
            stream.prompt_tokens = prompt.shape[1]
            progress = SequenceProgress(params, prompt.shape[1], self.max_context, self._text, self.eos_token_ids)
            self.batcher.submit(BatchedGeneration(prompt, progress, stream.emit, stream.fail, stream.is_cancelled))
        except Exception as error:
            stream.fail(error)

    def _text(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def steps(self, request, params: GenerationParams, is_cancelled: Callable[[], bool]) -> tuple[int, Iterator[GenerationStep]]:
        """The prompt's length and the generation's steps (the last one has its finish_reason); a subclass
        generating elsewhere (an engine) overrides this."""
        prompt, embed = self.prepare(request)
        steps = generate(
            self.decoder,
            prompt,
            params,
            decode=self._text,
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


class _BatchingMetrics:
    """Triton custom metrics (its /metrics, relayed by the orchestrator at /metrics/triton) of a generator's
    scheduling: whether it batches in flight, its rows and the generations running and waiting. Updated when
    they change, not per token (each update is a message to Triton's process)."""

    def __init__(self, model_name: str):
        self._families, self._gauges = [], {}
        try:
            mode = pb_utils.MetricFamily(
                name="thinkserve_generator_inflight_batching",
                description="1 when the generator batches requests in flight, 0 when it runs one generation per thread",
                kind=pb_utils.MetricFamily.GAUGE,
            )
            sequences = pb_utils.MetricFamily(
                name="thinkserve_generator_sequences",
                description="Generations by state (running, waiting) and the rows decoded together (rows)",
                kind=pb_utils.MetricFamily.GAUGE,
            )
        except Exception:  # a stub without custom metrics: the log still says what runs
            return
        self._families = [mode, sequences]
        self._gauges = {"mode": mode.Metric(labels={"model": model_name})}
        for state in ("running", "waiting", "rows"):
            self._gauges[state] = sequences.Metric(labels={"model": model_name, "state": state})

    def batching(self, on: bool) -> None:
        if self._gauges:
            self._gauges["mode"].set(1 if on else 0)

    def publish(self, state: BatcherState) -> None:
        if self._gauges:
            self._gauges["running"].set(state.running)
            self._gauges["waiting"].set(state.waiting)
            self._gauges["rows"].set(state.rows)

    def close(self) -> None:
        self._gauges.clear()  # a Metric must go before its MetricFamily
        self._families.clear()


def inline_lone_steps(params: ModelParameters, device) -> bool:
    """Whether a lone request's tokens are sent from the scheduler's thread (`inline_delivery`; the default is
    inflight_batching.inline_lone_steps_by_default's)."""
    return params.flag("inline_delivery", inline_lone_steps_by_default(device))


def decode_graphs(decoder, params: ModelParameters) -> str:
    """On a GPU, the batch decoder's decode step as CUDA graphs (torch_decode_graphs) unless the `cuda_graphs`
    parameter is off; returns why they do not serve ("" when they do or on the CPU, where there are none)."""
    if decoder.device.type != "cuda":
        return ""
    if not params.flag("cuda_graphs", True):
        return "the cuda_graphs parameter is off"
    return decoder.use_cuda_graphs()


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
