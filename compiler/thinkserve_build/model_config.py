"""config.pbtxt, built as Triton's own ModelConfig protobuf message so every generated file parses by construction."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from orchestrator.models.contracts import ModelContract, Tensor

DATATYPES = {
    "BYTES": mc.TYPE_STRING,
    "FP32": mc.TYPE_FP32,
    "FP16": mc.TYPE_FP16,
    "BF16": mc.TYPE_BF16,
    "INT32": mc.TYPE_INT32,
    "INT64": mc.TYPE_INT64,
    "UINT8": mc.TYPE_UINT8,
    "UINT64": mc.TYPE_UINT64,
    "BOOL": mc.TYPE_BOOL,
}


@dataclass
class PlannedModel:
    """One model folder of the repository: its config, the files of its version folder, its python code."""

    config: mc.ModelConfig
    files: dict[str, Path] = field(default_factory=dict)  # file name in the version folder -> built file
    python_class: Optional[str] = None  # "module:Class" re-exported by a generated model.py

    @property
    def name(self) -> str:
        return self.config.name


def add_tensor(target, tensor: Tensor, ragged: bool = False) -> None:
    entry = target.add()
    entry.name = tensor.name
    entry.data_type = DATATYPES[tensor.datatype]
    entry.dims.extend(tensor.dims)
    if tensor.optional:
        entry.optional = True
    if ragged:
        entry.allow_ragged_batch = True


INSTANCE_KINDS = {"cpu": mc.ModelInstanceGroup.KIND_CPU, "gpu": mc.ModelInstanceGroup.KIND_GPU}


@dataclass(frozen=True)
class QueueLimits:
    """Bounds on a model's request queue, so an overload is refused at once instead of piling up in Triton."""

    max_size: int  # requests waiting; beyond it a new request is refused (UNAVAILABLE); 0: no bound
    timeout_us: int  # a request waiting longer is refused; a client's own timeout overrides it; 0: none


@dataclass(frozen=True)
class WarmupInput:
    """One input of a warm-up request that Triton runs before the model is READY (first-call costs: CUDA
    context, kernels chosen, TensorRT engines built, not paid by the first user)."""

    name: str
    datatype: str
    dims: tuple[int, ...]


def python_model(
    name: str,
    inputs: list[Tensor],
    outputs: list[Tensor],
    parameters: dict[str, object],
    max_batch_size: int,
    instances: int,
    queue_delay_us: int,
    decoupled: bool = False,
    kind: str = "cpu",
    queue: Optional[QueueLimits] = None,
    warmup: tuple[WarmupInput, ...] = (),
) -> mc.ModelConfig:
    """A python-backend model with dynamic batching. Variable-length inputs are ragged: requests of
    different lengths still share a batch (the model pads them itself, or runs a call per shape where padding
    would change the result, as PP-OCR's networks do)."""
    config = mc.ModelConfig(name=name, backend="python", max_batch_size=max_batch_size)
    for tensor in inputs:
        add_tensor(config.input, tensor, ragged=-1 in tensor.dims)
    for tensor in outputs:
        add_tensor(config.output, tensor)
    schedule(config, queue_delay_us, instances, kind, queue, warmup)
    if decoupled:
        config.model_transaction_policy.decoupled = True
    set_parameters(config, parameters)
    return config


def schedule(
    config: mc.ModelConfig, queue_delay_us: int, instances: int, kind: str, queue: Optional[QueueLimits],
    warmup: tuple[WarmupInput, ...] = (),
) -> None:
    """Dynamic batching, the instance group and the warm-up request of a model; Triton's queue policy only where
    `queue` is given (a policy turns off the batcher's prefetching: ServingOptions.max_queue_size)."""
    config.dynamic_batching.max_queue_delay_microseconds = queue_delay_us
    if queue is not None:
        policy = config.dynamic_batching.default_queue_policy
        policy.max_queue_size = queue.max_size
        policy.default_timeout_microseconds = queue.timeout_us
        policy.timeout_action = mc.ModelQueuePolicy.REJECT
        policy.allow_timeout_override = queue.timeout_us > 0
    group = config.instance_group.add()
    try:
        group.kind = INSTANCE_KINDS[kind]
    except KeyError:
        raise ValueError(f"instance kind must be one of {', '.join(INSTANCE_KINDS)}, got {kind!r}") from None
    group.count = instances
    if warmup:
        sample = config.model_warmup.add(name="warmup", batch_size=1)
        for tensor in warmup:
            entry = sample.inputs[tensor.name]
            entry.data_type = DATATYPES[tensor.datatype]
            entry.dims.extend(tensor.dims)
            entry.zero_data = True


def set_parameters(config: mc.ModelConfig, parameters: dict[str, object]) -> None:
    for key, value in parameters.items():
        config.parameters[key].string_value = _parameter_text(value)


def ensemble(contract: ModelContract, max_batch_size: int, steps: list[tuple[str, dict, dict]], dims: dict) -> mc.ModelConfig:
    """An ensemble serving `contract`. Each step is (model, {step input: ensemble tensor}, {step output: ensemble
    tensor}); `dims` gives concrete dims for contract tensors declared variable (e.g. the embedding width)."""
    config = mc.ModelConfig(name=contract.name, platform="ensemble", max_batch_size=max_batch_size)
    for tensor in contract.inputs:
        add_tensor(config.input, tensor)
    for tensor in contract.outputs:
        add_tensor(config.output, Tensor(tensor.name, tensor.datatype, dims.get(tensor.name, tensor.dims)))
    for model, input_map, output_map in steps:
        step = config.ensemble_scheduling.step.add()
        step.model_name = model
        step.model_version = -1
        step.input_map.update(input_map)
        step.output_map.update(output_map)
    return config


def to_text(config: mc.ModelConfig) -> str:
    return text_format.MessageToString(config)


def parse(text: str) -> mc.ModelConfig:
    """Parse config.pbtxt with Triton's schema; raises on any unknown field or malformed value."""
    return text_format.Parse(text, mc.ModelConfig())


def _parameter_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value)
    return str(value)
