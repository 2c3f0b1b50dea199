"""One exception hierarchy; each error carries the gRPC status it maps to. Messages say what failed and why."""

from __future__ import annotations

import grpc


class ThinkServeError(Exception):
    status: grpc.StatusCode = grpc.StatusCode.INTERNAL


class ConfigurationError(ThinkServeError):
    """Settings that cannot work (bad value, missing file)."""


class TritonSetupError(ThinkServeError):
    """Triton cannot be started as configured: missing binary or stub, bad model environment, port taken, ..."""

    status = grpc.StatusCode.UNAVAILABLE


class TritonUnavailableError(ThinkServeError):
    """Triton, or one of its models, cannot serve the call right now."""

    status = grpc.StatusCode.UNAVAILABLE


class ModelNotFoundError(TritonUnavailableError):
    """Triton does not serve a model the orchestrator needs (wrong repository or a model failed to load)."""


class ModelExecutionError(ThinkServeError):
    """A model ran and reported an error (its message is kept)."""


class ModelBusyError(ModelExecutionError):
    """A model refused a request for want of capacity (a generator's rows and queue full): retry later. The model
    is healthy, so its circuit breaker does not count it; the query pipeline degrades as for any model error."""

    status = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceededError(ThinkServeError):
    status = grpc.StatusCode.DEADLINE_EXCEEDED


class InvalidRequestError(ThinkServeError):
    status = grpc.StatusCode.INVALID_ARGUMENT


class InvalidOptionError(InvalidRequestError):
    """A query option of the wrong type, unknown, or out of its range; `param` names it (OpenAI's error field)."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.param = option


class NotFoundError(ThinkServeError):
    status = grpc.StatusCode.NOT_FOUND


class UnauthenticatedError(ThinkServeError):
    """No bearer token, or one the server does not know."""

    status = grpc.StatusCode.UNAUTHENTICATED


class PermissionDeniedError(ThinkServeError):
    """A known token asked for a collection (or an action) it is not granted."""

    status = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhaustedError(ThinkServeError):
    """Over a capacity limit (admission queue full, too many requests for one token): retry later."""

    status = grpc.StatusCode.RESOURCE_EXHAUSTED


class AlreadyExistsError(ThinkServeError):
    status = grpc.StatusCode.ALREADY_EXISTS


class DataFolderLockedError(ThinkServeError):
    """Another process writes this data folder (knowledge/writer_lock.py): one writer per folder."""

    status = grpc.StatusCode.FAILED_PRECONDITION


class ReadOnlyError(ThinkServeError):
    """A write sent to a read replica: it serves queries over a folder another process writes."""

    status = grpc.StatusCode.FAILED_PRECONDITION
