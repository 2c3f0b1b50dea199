"""What every ThinkServe python-backend model needs: onnxruntime sessions, its generator, tensor I/O (its
parameters: parameters.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer

from ..generator_runtime import GeneratorRuntime, onnx_generator, torch_generator
from ..inflight_batching import GenerationQueueFull
from ..sessions import cpu_session
from .parameters import ModelParameters


def whole_text_tokenizer(path: Path) -> Tokenizer:
    """A generator's tokenizer that encodes a prompt whole: no padding, no truncation (prompts are fitted to the
    context by the orchestrator, and a model refuses one too long with a clear error)."""
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def onnx_session(path: Path, params: ModelParameters) -> ort.InferenceSession:
    return cpu_session(path, params.integer("intra_op_threads", min(2, os.cpu_count() or 1)))


def served_generator(params: ModelParameters, args: dict, vision: bool) -> GeneratorRuntime:
    """The model's decoder (and a VLM's embeddings and image features) in the runtime its target chose: the
    `runtime` parameter, onnx (the exported graphs) or torch (the checkpoint, on the instance's device)."""
    if params.string("runtime", "onnx") == "torch":
        from .torch_device import instance_device

        device, dtype = instance_device(params, args)
        return torch_generator(params.version_dir, vision, params.integer("max_context"), device, dtype)
    sessions = [onnx_session(params.file("decoder_file"), params)]
    if vision:
        sessions += [onnx_session(params.file("vision_file"), params), onnx_session(params.file("embed_file"), params)]
    return onnx_generator(*sessions)


def input_array(request, name: str) -> Optional[np.ndarray]:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def input_strings(request, name: str) -> Optional[list[str]]:
    """A BYTES input as a flat list of UTF-8 strings (None when the optional input is absent)."""
    array = input_array(request, name)
    if array is None:
        return None
    return [v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]


def single_text(values: Optional[list[str]], name: str) -> str:
    """The one prompt of a generation request's input `name`."""
    if not values:
        raise ValueError(f"input {name} is missing or empty")
    if len(values) != 1:
        raise ValueError(f"input {name} must hold exactly one prompt per request, got {len(values)}")
    return values[0]


def input_images(request, name: str = "images") -> list[bytes]:
    """A VLM request's encoded images (none when the optional input is absent)."""
    images = input_array(request, name)
    return [] if images is None else [bytes(data) for data in images.reshape(-1)]


def input_scalar(request, name: str, default):
    array = input_array(request, name)
    return default if array is None or array.size == 0 else array.reshape(-1)[0].item()


def bytes_tensor(name: str, values: list[str], shape: tuple[int, ...]) -> "pb_utils.Tensor":
    array = np.array([v.encode("utf-8") for v in values], dtype=np.object_).reshape(shape)
    return pb_utils.Tensor(name, array)


def error_response(message: str, error: Optional[BaseException] = None) -> "pb_utils.InferenceResponse":
    """An error response; a ValueError (bad input: undecodable image, prompt too long) is INVALID_ARG, a generator
    with every row busy and its queue full UNAVAILABLE (its message says "busy:", which the orchestrator's client
    reads as backpressure, not as a model that is down)."""
    if isinstance(error, GenerationQueueFull):
        code = pb_utils.TritonError.UNAVAILABLE
    else:
        code = pb_utils.TritonError.INVALID_ARG if isinstance(error, ValueError) else pb_utils.TritonError.INTERNAL
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message, code))


def responses_by_request(
    model_name: str, requests: int, owners: list[int], failed: dict[int, BaseException], tensor: Callable[[list[int]], "pb_utils.Tensor"]
) -> list:
    """One response per request of a batched `execute`: the output tensor of the rows it owns (`tensor(rows)`), or
    the error that request alone caused (the others still get their answers)."""
    responses = []
    for number in range(requests):
        if number in failed:
            responses.append(error_response(f"{model_name}: {failed[number]}", failed[number]))
            continue
        responses.append(pb_utils.InferenceResponse([tensor([i for i, owner in enumerate(owners) if owner == number])]))
    return responses
