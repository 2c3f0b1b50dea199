"""The one async client for Triton (grpc.aio over Triton's own protos): deadlines, cancellation, clear errors.

Every call carries a deadline. A stream (decoupled model) is an async context manager: leaving it early, or
cancelling the task that reads it, cancels the gRPC call, and Triton passes the cancellation to the model
(`is_cancelled()`), so abandoned generations stop instead of burning the CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from typing import AsyncIterator, Optional, Sequence

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import np_to_triton_dtype, triton_to_np_dtype

from ..errors import (
    DeadlineExceededError,
    InvalidRequestError,
    ModelExecutionError,
    ModelNotFoundError,
    ThinkServeError,
    TritonUnavailableError,
)

Arrays = dict[str, np.ndarray]
MAX_MESSAGE_BYTES = 256 * 1024 * 1024


class TritonClient:
    def __init__(self, url: str, default_timeout_s: float = 60.0):
        self.url = url
        self.default_timeout_s = default_timeout_s
        self._channel = grpc.aio.insecure_channel(
            url,
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.keepalive_time_ms", 30_000),
            ],
        )
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "TritonClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # ------------------------------------------------------------------ server and model state

    async def server_ready(self, timeout_s: float = 2.0) -> bool:
        try:
            return (await self._stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=timeout_s)).ready
        except grpc.aio.AioRpcError:
            return False

    async def server_id(self, timeout_s: float = 2.0) -> str:
        response = await self._call("ServerMetadata", service_pb2.ServerMetadataRequest(), "", timeout_s)
        return response.name

    async def model_ready(self, model: str, timeout_s: float = 2.0) -> bool:
        try:
            request = service_pb2.ModelReadyRequest(name=model)
            return (await self._stub.ModelReady(request, timeout=timeout_s)).ready
        except grpc.aio.AioRpcError:
            return False

    async def model_config(self, model: str, timeout_s: Optional[float] = None) -> model_config_pb2.ModelConfig:
        response = await self._call("ModelConfig", service_pb2.ModelConfigRequest(name=model), model, timeout_s)
        return response.config

    async def model_statistics(self, model: str = "", timeout_s: Optional[float] = None) -> dict:
        """Triton's inference statistics (executions per batch size, queue and compute time) as a dict."""
        request = service_pb2.ModelStatisticsRequest(name=model)
        response = await self._call("ModelStatistics", request, model, timeout_s)
        return json_format.MessageToDict(response, preserving_proto_field_name=True)

    # ------------------------------------------------------------------ inference

    async def infer(
        self,
        model: str,
        inputs: Arrays,
        outputs: Sequence[str] = (),
        timeout_s: Optional[float] = None,
        request_id: str = "",
    ) -> Arrays:
        request = build_request(model, inputs, outputs, request_id)
        return decode_response(await self._call("ModelInfer", request, model, timeout_s))

    @contextlib.asynccontextmanager
    async def stream(
        self, model: str, inputs: Arrays, timeout_s: Optional[float] = None, request_id: str = ""
    ) -> AsyncIterator[AsyncIterator[Arrays]]:
        """Responses of a decoupled model, until its final one. Leaving the block early cancels the request."""
        request = build_request(model, inputs, (), request_id)
        request.parameters["triton_enable_empty_final_response"].bool_param = True
        timeout = timeout_s or self.default_timeout_s
        call = self._stub.ModelStreamInfer(iter([request]), timeout=timeout)
        state = _StreamState()
        try:
            yield self._stream_responses(call, model, timeout, state)
        finally:
            if not state.finished:
                call.cancel()

    async def _stream_responses(self, call, model: str, timeout: float, state: "_StreamState") -> AsyncIterator[Arrays]:
        try:
            async for message in call:
                if message.error_message:
                    # ThinkServe's models send an error as their final response: let the stream close itself.
                    state.finished = await _drained(call)
                    raise _model_error(model, message.error_message)
                response = message.infer_response
                if response.outputs:
                    yield decode_response(response)
                final = response.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    state.finished = await _drained(call)
                    return
        except grpc.aio.AioRpcError as error:
            raise self._map_error(error, model, timeout) from None
        raise TritonUnavailableError(f"model {model}: the stream ended before the model's final response")

    async def _call(self, method: str, request, model: str, timeout_s: Optional[float]):
        timeout = timeout_s or self.default_timeout_s
        try:
            return await getattr(self._stub, method)(request, timeout=timeout)
        except grpc.aio.AioRpcError as error:
            raise self._map_error(error, model, timeout) from None

    def _map_error(self, error: grpc.aio.AioRpcError, model: str, timeout: float) -> ThinkServeError:
        code, details = error.code(), (error.details() or "").strip()
        what = f"model {model}" if model else "Triton"
        if code == grpc.StatusCode.UNAVAILABLE:
            return TritonUnavailableError(f"Triton at {self.url} is unreachable: {details}")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return DeadlineExceededError(f"{what}: no answer within {timeout:.1f}s")
        if code == grpc.StatusCode.CANCELLED:
            return TritonUnavailableError(f"{what}: call cancelled ({details})")
        return _model_error(model, details, code)


class _StreamState:
    finished = False  # Triton closed the stream: nothing left to cancel


async def _drained(call, timeout_s: float = 5.0) -> bool:
    """Read a finished request's stream to its end instead of cancelling it: cancelling a stream whose request
    already completed can leave the request unreleased in Triton 2.51 (its model then never unloads)."""

    async def rest():
        async for _ in call:
            pass

    try:
        await asyncio.wait_for(rest(), timeout_s)
        return True
    except (asyncio.TimeoutError, grpc.aio.AioRpcError):
        return False


def _model_error(model: str, details: str, code: Optional[grpc.StatusCode] = None) -> ThinkServeError:
    if "unknown model" in details or "is not found" in details:
        return ModelNotFoundError(f"Triton does not serve model '{model}' ({details})")
    if "Stub process" in details or "not ready" in details or "unavailable" in details.lower():
        return TritonUnavailableError(f"model {model} is unavailable: {details}")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidRequestError(f"model {model} rejected the request: {details}")
    return ModelExecutionError(f"model {model} failed: {details}")


# ---------------------------------------------------------------------- tensors <-> protobuf


def build_request(model: str, inputs: Arrays, outputs: Sequence[str], request_id: str) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    for name, array in inputs.items():
        tensor = request.inputs.add()
        tensor.name = name
        tensor.shape.extend(array.shape)
        if array.dtype == np.object_ or array.dtype.kind in "SU":
            tensor.datatype = "BYTES"
            request.raw_input_contents.append(serialize_bytes(array))
        else:
            tensor.datatype = np_to_triton_dtype(array.dtype)
            request.raw_input_contents.append(np.ascontiguousarray(array).tobytes())
    for name in outputs:
        request.outputs.add().name = name
    return request


def decode_response(response: service_pb2.ModelInferResponse) -> Arrays:
    result = {}
    for output, raw in zip(response.outputs, response.raw_output_contents):
        shape = tuple(output.shape)
        if output.datatype == "BYTES":
            result[output.name] = deserialize_bytes(raw).reshape(shape)
        else:
            result[output.name] = np.frombuffer(raw, dtype=triton_to_np_dtype(output.datatype)).reshape(shape)
    return result


def serialize_bytes(array: np.ndarray) -> bytes:
    """Triton's BYTES wire format: each element as a 4-byte little-endian length, then its bytes."""
    parts = []
    for item in array.reshape(-1):
        data = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        parts += [struct.pack("<I", len(data)), data]
    return b"".join(parts)


def deserialize_bytes(raw: bytes) -> np.ndarray:
    items, offset = [], 0
    while offset < len(raw):
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        items.append(raw[offset : offset + length])
        offset += length
    return np.array(items, dtype=np.object_)
