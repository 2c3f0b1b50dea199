"""What every ThinkServe python-backend model needs: its parameters, onnxruntime sessions, tensor I/O."""

from __future__ import annotations

import json
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


def whole_text_tokenizer(path: Path) -> Tokenizer:
    """A generator's tokenizer that encodes a prompt whole: no padding, no truncation (prompts are fitted to the
    context by the orchestrator, and a model refuses one too long with a clear error)."""
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


class ModelParameters:
    """The `parameters` of a model's config.pbtxt, plus the folder holding its files."""

    def __init__(self, args: dict):
        self.config = json.loads(args["model_config"])
        self.model_name = args["model_name"]
        self.version_dir = Path(args["model_repository"]) / args["model_version"]
        self._values = {k: v.get("string_value", "") for k, v in self.config.get("parameters", {}).items()}

    def string(self, key: str, default: Optional[str] = None) -> str:
        if key in self._values:
            return self._values[key]
        if default is None:
            raise ValueError(f"model {self.model_name}: parameter {key!r} is missing from config.pbtxt")
        return default

    def integer(self, key: str, default: Optional[int] = None) -> int:
        return int(self.string(key, None if default is None else str(default)))

    def number(self, key: str, default: Optional[float] = None) -> float:
        return float(self.string(key, None if default is None else str(default)))

    def flag(self, key: str, default: bool = False) -> bool:
        return self.string(key, "true" if default else "false").lower() in ("1", "true", "yes")

    def json(self, key: str, default=None):
        return json.loads(self.string(key, None if default is None else json.dumps(default)))

    def file(self, key: str) -> Path:
        """A file named by a parameter, inside this model's version folder; it must exist."""
        path = self.version_dir / self.string(key)
        if not path.is_file():
            raise FileNotFoundError(f"model {self.model_name}: {key} file {path.name} is missing from {self.version_dir}")
        return path

    def output_names(self) -> list[str]:
        return [o["name"] for o in self.config.get("output", [])]

    def input_names(self) -> list[str]:
        return [i["name"] for i in self.config.get("input", [])]


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
