"""The one async client for Triton (grpc.aio over Triton's own protos): deadlines, cancellation, clear errors.

Every call carries a deadline. A stream (decoupled model) is an async context manager: leaving it early, or
cancelling the task that reads it, cancels the gRPC call, and Triton passes the cancellation to the model
(`is_cancelled()`), so abandoned generations stop instead of burning the CPU.

Surviving a Triton that dies or a model whose stub died:
- idempotent unary calls (infer, model config, statistics) are retried on gRPC UNAVAILABLE only, a few times
  (`retry_attempts`) with a short doubling pause, and never past the call's own deadline; a stream is never
  retried, since the model may already have produced (and the caller consumed) part of its output;
- a per-model circuit breaker (breaker.py) is consulted before every call and fed its outcome, so a dead
  model fails fast instead of costing each request a connection attempt or a stub health check;
- the channel reconnects within `reconnect_backoff_max_s` once Triton is back (gRPC's default backoff grows
  to two minutes), so a restarted server on the same ports is used again without rebuilding the client;
- unavailability failures are reported to listeners (the supervisor), which is how a dead stub is noticed
  from a failed call ("Stub process '<instance>' is not healthy").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Collection, Literal, Optional, Sequence

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import np_to_triton_dtype, triton_to_np_dtype

from ..config import TritonSettings
from ..errors import (
    DeadlineExceededError,
    InvalidRequestError,
    ModelBusyError,
    ModelExecutionError,
    ModelNotFoundError,
    ThinkServeError,
    TritonUnavailableError,
)
from .breaker import BreakerBoard, BreakerStatus, CircuitBreaker, Permit

log = logging.getLogger("thinkserve.triton.client")
Arrays = dict[str, np.ndarray]
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
MIN_ATTEMPT_S = 0.01  # a retry with less time than this left before the deadline is not worth starting
Outcome = Literal["success", "failure", "neutral"]
# Told of every unavailability failure: (model, Triton's message, when the failed call started on the monotonic
# clock). The supervisor listens for dead stubs; the start time lets it ignore calls older than its last reload.
FailureListener = Callable[[str, str, float], None]


@dataclass(frozen=True)
class ClientHealth:
    """What the client knows of Triton's health, for Health / Stats / metrics."""

    url: str
    retries: int  # unary calls attempted again after UNAVAILABLE
    breakers: dict[str, BreakerStatus]  # by model, for every model called so far


class TritonClient:
    def __init__(
        self,
        url: str,
        default_timeout_s: float = 60.0,
        *,
        retry_attempts: int = 3,
        retry_backoff_s: float = 0.05,
        breaker_threshold: int = 5,
        breaker_cooldown_s: float = 2.0,
        reconnect_backoff_max_s: float = 0.5,
    ):
        self.url = url
        self.default_timeout_s = default_timeout_s
        self.retry_attempts = max(1, retry_attempts)
        self.retry_backoff_s = retry_backoff_s
        self.breakers = BreakerBoard(breaker_threshold, breaker_cooldown_s)
        self.retries = 0
        self._listeners: list[FailureListener] = []
        max_backoff_ms = int(reconnect_backoff_max_s * 1000)
        self._channel = grpc.aio.insecure_channel(
            url,
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.keepalive_time_ms", 30_000),
                # reconnect within a second of Triton coming back, not after gRPC's backoff of up to 120 s
                ("grpc.initial_reconnect_backoff_ms", min(100, max_backoff_ms)),
                ("grpc.min_reconnect_backoff_ms", min(100, max_backoff_ms)),
                ("grpc.max_reconnect_backoff_ms", max_backoff_ms),
            ],
        )
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    @classmethod
    def from_settings(cls, settings: TritonSettings, url: str) -> "TritonClient":
        return cls(
            url,
            settings.call_timeout_s,
            retry_attempts=settings.retry_attempts,
            retry_backoff_s=settings.retry_backoff_s,
            breaker_threshold=settings.breaker_threshold,
            breaker_cooldown_s=settings.breaker_cooldown_s,
            reconnect_backoff_max_s=settings.reconnect_backoff_max_s,
        )

    def add_failure_listener(self, listener: FailureListener) -> None:
        """`listener(model, details, started)` is called for every unavailability failure of a call."""
        self._listeners.append(listener)

    def remove_failure_listener(self, listener: FailureListener) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def health_snapshot(self) -> ClientHealth:
        return ClientHealth(self.url, self.retries, self.breakers.snapshot())

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "TritonClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # ------------------------------------------------------------------ server and model state

    async def server_ready(self, timeout_s: float = 2.0, *, wait_for_connection: bool = False) -> bool:
        """Whether Triton says it is ready. By default a channel that cannot connect now answers False at once;
        `wait_for_connection` waits (within timeout_s) for the channel to connect, past its reconnect backoff."""
        try:
            request = service_pb2.ServerReadyRequest()
            return (await self._stub.ServerReady(request, timeout=timeout_s, wait_for_ready=wait_for_connection)).ready
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

    # ------------------------------------------------------------------ model repository (explicit mode)

    async def ready_models(self, timeout_s: float = 5.0) -> set[str]:
        """Names of the models Triton reports READY."""
        request = service_pb2.RepositoryIndexRequest(ready=True)
        response = await self._call("RepositoryIndex", request, "", timeout_s)
        return {model.name for model in response.models if model.state == "READY"}

    async def reload_model(self, model: str, timeout_s: float = 120.0, expected: Collection[str] = ()) -> None:
        """Unload and load a model, then load again whatever went down with it (an ensemble is unloaded with
        its composing model) and any `expected` model that is not READY. A plain load of a loaded, unchanged
        model does nothing in Triton 2.51, which is why a model whose stub died needs the unload first."""
        deadline = time.monotonic() + timeout_s
        left = lambda: max(MIN_ATTEMPT_S, deadline - time.monotonic())  # noqa: E731
        before = await self.ready_models(left()) | set(expected)
        unload, load = service_pb2.RepositoryModelUnloadRequest, service_pb2.RepositoryModelLoadRequest
        await self._call("RepositoryModelUnload", unload(model_name=model), model, left(), guarded=False)
        await self._call("RepositoryModelLoad", load(model_name=model), model, left(), guarded=False)
        for dependent in sorted(before - await self.ready_models(left())):
            await self._call("RepositoryModelLoad", load(model_name=dependent), dependent, left(), guarded=False)
        down = sorted((before | {model}) - await self.ready_models(left()))
        if down:
            raise TritonUnavailableError(f"model {model} was reloaded but {', '.join(down)} did not come back READY")

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
        return decode_response(await self._call("ModelInfer", request, model, timeout_s, inference=True))

    @contextlib.asynccontextmanager
    async def stream(
        self, model: str, inputs: Arrays, timeout_s: Optional[float] = None, request_id: str = ""
    ) -> AsyncIterator[AsyncIterator[Arrays]]:
        """Responses of a decoupled model, until its final one. Leaving the block early cancels the request."""
        breaker = self.breakers[model]
        permit = breaker.allow()  # fails fast while the model's breaker is open; never retried (see above)
        request = build_request(model, inputs, (), request_id)
        request.parameters["triton_enable_empty_final_response"].bool_param = True
        timeout = timeout_s or self.default_timeout_s
        call = self._stub.ModelStreamInfer(iter([request]), timeout=timeout)
        state = _StreamState(time.monotonic())
        try:
            yield self._stream_responses(call, model, timeout, state, breaker, permit)
        finally:
            if not state.finished:
                call.cancel()
            if not state.settled:  # left early or cancelled: says nothing about the model
                breaker.record_neutral(permit)

    async def _stream_responses(
        self, call, model: str, timeout: float, state: "_StreamState", breaker: CircuitBreaker, permit: Permit
    ) -> AsyncIterator[Arrays]:
        try:
            async for message in call:
                if message.error_message:
                    # ThinkServe's models send an error as their final response: let the stream close itself.
                    state.finished = await _drained(call)
                    error = _model_error(model, message.error_message)
                    self._settle(breaker, permit, model, _outcome(error), message.error_message, state.started, state)
                    raise error
                response = message.infer_response
                if response.outputs:
                    yield decode_response(response)
                final = response.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    state.finished = await _drained(call)
                    self._settle(breaker, permit, model, "success", "", state.started, state)
                    return
        except grpc.aio.AioRpcError as error:
            mapped = self._map_error(error, model, timeout)
            self._settle(breaker, permit, model, _outcome(mapped, error.code()), error.details() or "", state.started, state)
            raise mapped from None
        cause = "the stream ended before the model's final response"
        self._settle(breaker, permit, model, "failure", cause, state.started, state)
        raise TritonUnavailableError(f"model {model}: {cause}")

    async def _call(
        self, method: str, request, model: str, timeout_s: Optional[float], inference: bool = False, guarded: bool = True
    ):
        """One unary call: through the model's breaker, retried on UNAVAILABLE within attempts and deadline.

        Metadata calls (inference=False) are refused while the breaker is open and their unavailability counts,
        but their success does not close it: Triton serves a model's config even when its stub is dead.
        Repository calls (guarded=False, the supervisor's loads) bypass the breaker: they are how it recovers."""
        timeout = timeout_s or self.default_timeout_s
        deadline = time.monotonic() + timeout
        breaker = self.breakers[model] if model and guarded else None  # server-wide calls have no model to blame
        attempt = 0
        while True:
            attempt += 1
            permit = None
            if breaker is not None:  # raises at once while open
                permit = breaker.allow() if inference else breaker.check()
            started = time.monotonic()
            try:
                response = await getattr(self._stub, method)(request, timeout=max(MIN_ATTEMPT_S, deadline - time.monotonic()))
            except grpc.aio.AioRpcError as error:
                mapped = self._map_error(error, model, timeout)
                outcome = _outcome(mapped, error.code())
                self._settle(
                    breaker, permit, model, outcome if inference or outcome == "failure" else "neutral", error.details() or "", started
                )
                pause = self.retry_backoff_s * 2 ** (attempt - 1)
                if (
                    error.code() == grpc.StatusCode.UNAVAILABLE
                    and attempt < self.retry_attempts
                    and deadline - time.monotonic() - pause >= MIN_ATTEMPT_S
                ):
                    self.retries += 1
                    log.debug("%s %s: UNAVAILABLE, attempt %d of %d in %.2f s", method, model, attempt + 1, self.retry_attempts, pause)
                    await asyncio.sleep(pause)
                    continue
                raise mapped from None
            except asyncio.CancelledError:
                self._settle(breaker, permit, model, "neutral", "", started)
                raise
            self._settle(breaker, permit, model, "success" if inference else "neutral", "", started)
            return response

    def _settle(
        self,
        breaker: Optional[CircuitBreaker],
        permit: Optional[Permit],
        model: str,
        outcome: Outcome,
        details: str,
        started: float,
        state: Optional["_StreamState"] = None,
    ) -> None:
        """Feed a call's outcome to the model's breaker and an unavailability failure to the listeners."""
        if state is not None:
            state.settled = True
        if breaker is not None:
            if outcome == "success":
                breaker.record_success(permit)
            elif outcome == "failure":
                breaker.record_failure(_first_line(details) or "unavailable", permit)
            else:
                breaker.record_neutral(permit)
        if outcome == "failure":
            for listener in list(self._listeners):
                try:
                    listener(model, details, started)
                except Exception:  # a listener's bug must not turn into the caller's error
                    log.exception("Triton failure listener %r failed", listener)

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
    def __init__(self, started: float):
        self.started = started  # monotonic
        self.finished = False  # Triton closed the stream: nothing left to cancel
        self.settled = False  # the outcome was fed to the breaker


def _outcome(error: ThinkServeError, code: Optional[grpc.StatusCode] = None) -> Outcome:
    """What a failed call says about its model: unavailable (counts against it), there (its own error) or nothing."""
    if code == grpc.StatusCode.CANCELLED or isinstance(error, DeadlineExceededError):
        return "neutral"  # the caller's cancellation or deadline
    if isinstance(error, TritonUnavailableError):
        return "failure"
    return "success"  # the model ran and reported an error (bad input, execution error): it is available


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:300] if text.strip() else ""


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


# A model's refusal for want of capacity (thinkserve_backend.inflight_batching.BUSY_MARKER, after "<model>: ").
BUSY_MARKER = ": busy: "


def _model_error(model: str, details: str, code: Optional[grpc.StatusCode] = None) -> ThinkServeError:
    if BUSY_MARKER in details:
        return ModelBusyError(f"model {model} is busy: {details.split(BUSY_MARKER, 1)[1]}")
    if "has no available versions" in details:  # in the repository but not loaded (e.g. being reloaded)
        return TritonUnavailableError(f"model {model} is not loaded in Triton right now ({details})")
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
