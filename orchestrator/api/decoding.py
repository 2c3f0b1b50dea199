"""Requests whose bytes are no message of the method's type get INVALID_ARGUMENT naming that, not UNKNOWN.

grpc's server calls the request deserializer before any code of ours runs, and reports its DecodeError as
UNKNOWN ("Unexpected [DecodeError] raised by servicer method"), with a traceback in the log: a server error
for what is a client's mistake (found by fuzzing raw bytes at every method). Here the deserializer hands such
bytes on as an Undecodable, and the service's gateway path (service.unary / service.streaming, and each
message of a client stream) refuses it like any other invalid request: counted, logged and answered with
its cause.
"""

from __future__ import annotations

from typing import Any, Callable

import grpc
from google.protobuf.message import DecodeError

from ..errors import InvalidRequestError
from .protos import pb_grpc


class Undecodable:
    """Bytes that did not parse as the method's request message."""

    __slots__ = ("message",)

    def __init__(self, message: str):
        self.message = message


def _tolerant(deserialize: Callable[[bytes], Any], type_name: str) -> Callable[[bytes], Any]:
    def decode(data: bytes):
        try:
            return deserialize(data)
        except (DecodeError, ValueError, UnicodeDecodeError) as error:
            return Undecodable(f"the request is not a valid {type_name} message ({error}); "
                               "send the message proto/thinkserve/v1/orchestrator.proto defines")

    return decode


def checked(request: Any) -> Any:
    """The request as it is; INVALID_ARGUMENT for bytes that were no message."""
    if isinstance(request, Undecodable):
        raise InvalidRequestError(request.message)
    return request


class _Captured:
    """Stands in for a server while the generated code registers its handlers, so they can be changed first."""

    def __init__(self):
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}
        self.service = ""

    def add_generic_rpc_handlers(self, handlers) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        self.service, self.handlers = service, handlers


def add_service(servicer, server) -> None:
    """pb_grpc.add_ThinkServeServicer_to_server, with request deserializers that never raise."""
    captured = _Captured()
    pb_grpc.add_ThinkServeServicer_to_server(servicer, captured)
    handlers = {}
    for name, handler in captured.handlers.items():
        label = getattr(handler.request_deserializer, "__qualname__", name).split(".")[0]  # QueryRequest.FromString
        handlers[name] = handler._replace(request_deserializer=_tolerant(handler.request_deserializer, label))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(captured.service, handlers),))
    server.add_registered_method_handlers(captured.service, handlers)
