"""The onnxruntime session every served ONNX model runs in (thinkserve_backend.sessions.cpu_session)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper
from thinkserve_backend.sessions import cpu_session


def _ragged_graph(path) -> None:
    """A graph with both axes dynamic, as the served encoders have: y = relu(x @ w)."""
    weight = helper.make_tensor("w", TensorProto.FLOAT, [8, 4], np.linspace(-1, 1, 32, dtype=np.float32).tolist())
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "ragged",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "tokens", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "tokens", 4])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what the installed onnxruntime reads, whatever onnx writes by default
    onnx.save(model, str(path))


def test_a_session_keeps_no_plan_per_input_shape_and_still_answers_every_shape(tmp_path):
    """The memory-pattern cache holds one plan per distinct input shape; ragged batches make it grow without
    end (the text encoder's stub +80%/h in the soak), so served sessions run without it."""
    path = tmp_path / "ragged.onnx"
    _ragged_graph(path)
    session = cpu_session(path, intra_op_threads=1)
    assert session.get_session_options().enable_mem_pattern is False
    assert session.get_session_options().intra_op_num_threads == 1
    weight = np.linspace(-1, 1, 32, dtype=np.float32).reshape(8, 4)
    rng = np.random.default_rng(0)
    for batch, tokens in [(1, 3), (5, 17), (2, 64), (1, 3)]:
        x = rng.standard_normal((batch, tokens, 8)).astype(np.float32)
        (y,) = session.run(None, {"x": x})
        np.testing.assert_allclose(y, np.maximum(x @ weight, 0), rtol=1e-5, atol=1e-6)
