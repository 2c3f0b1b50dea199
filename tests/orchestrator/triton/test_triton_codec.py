"""Triton's wire format as our client writes and reads it."""

import numpy as np
from tritonclient.grpc import service_pb2

from orchestrator.triton.client import build_request, decode_response, deserialize_bytes, serialize_bytes


def test_bytes_round_trip_including_empty_and_non_ascii():
    values = np.array([b"", "café".encode(), b"\x00\xff"], dtype=np.object_)
    assert deserialize_bytes(serialize_bytes(values)).tolist() == values.tolist()


def test_request_then_response_round_trip_keeps_shapes_and_dtypes():
    inputs = {
        "text": np.array([[b"a"], [b"bc"]], dtype=np.object_),
        "max_tokens": np.array([[5]], dtype=np.int32),
        "scores": np.arange(6, dtype=np.float32).reshape(2, 3),
    }
    request = build_request("m", inputs, ["out"], "rid")
    assert request.id == "rid" and [o.name for o in request.outputs] == ["out"]
    assert [(t.name, t.datatype, list(t.shape)) for t in request.inputs] == [
        ("text", "BYTES", [2, 1]),
        ("max_tokens", "INT32", [1, 1]),
        ("scores", "FP32", [2, 3]),
    ]
    response = service_pb2.ModelInferResponse(model_name="m")
    for tensor, raw in zip(request.inputs, request.raw_input_contents):
        out = response.outputs.add()
        out.name, out.datatype = tensor.name, tensor.datatype
        out.shape.extend(tensor.shape)
        response.raw_output_contents.append(raw)
    decoded = decode_response(response)
    for name, array in inputs.items():
        assert decoded[name].shape == array.shape
        assert decoded[name].tolist() == array.tolist()
    assert decoded["scores"].dtype == np.float32
