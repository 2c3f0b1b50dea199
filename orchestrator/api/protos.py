"""The generated protobuf/gRPC modules, with a clear error when the package was not built (no protoc run)."""

try:
    from ._generated import orchestrator_pb2 as pb
    from ._generated import orchestrator_pb2_grpc as pb_grpc
except ImportError as error:  # pragma: no cover - only on a checkout that was never installed
    raise ImportError(
        "the gRPC code generated from proto/ is missing: install the package (`make setup` or `pip install -e .`)"
    ) from error

__all__ = ["pb", "pb_grpc"]
