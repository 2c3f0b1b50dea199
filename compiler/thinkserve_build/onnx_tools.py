"""torch -> ONNX export, parity checks against PyTorch, and int8 quantisation."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Sequence

import numpy as np
import onnx
import onnxruntime as ort
import torch

OPSET = 17


class ExportMismatchError(RuntimeError):
    pass


def export(
    module: torch.nn.Module,
    args: tuple,
    path: Path,
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_axes: dict,
) -> Path:
    """Trace-export `module` (legacy exporter: fast and works for every model here) with dynamic axes."""
    module.eval()  # export restores the wrapper's own train flag: dropout would come back on otherwise
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=list(input_names),
            output_names=list(output_names),
            dynamic_axes=dynamic_axes,
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
    return path


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def run(path: Path, feeds: dict[str, torch.Tensor | np.ndarray], outputs: Sequence[str]) -> list[np.ndarray]:
    arrays = {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in feeds.items()}
    return session(path).run(list(outputs), arrays)


def check_close(
    what: str, expected: torch.Tensor | np.ndarray, actual: np.ndarray, atol: float = 1e-4, runtime: str = "ONNX"
) -> float:
    """Fail the build when a served form (`runtime`: the ONNX graph, the torch target's checkpoint) does not
    compute what PyTorch computes."""
    expected = expected.detach().numpy() if isinstance(expected, torch.Tensor) else expected
    if expected.shape != actual.shape:
        raise ExportMismatchError(f"{what}: {runtime} output shape {actual.shape} != PyTorch {expected.shape}")
    diff = float(np.max(np.abs(expected - actual))) if expected.size else 0.0
    if diff > atol:
        raise ExportMismatchError(f"{what}: {runtime} output differs from PyTorch by {diff:.2e} (tolerance {atol:.0e})")
    return diff


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True)
    return float(np.min(np.sum(a * b, axis=-1)))


def quantize_int8(fp32: Path, out: Path, num_heads: int, hidden_size: int) -> Path:
    """Fuse attention (onnxruntime's BERT optimizer) then quantise weights dynamically, per channel, to int8."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model

    fused = out.with_suffix(".fused.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optimize_model(str(fp32), model_type="bert", num_heads=num_heads, hidden_size=hidden_size).save_model_to_file(
            str(fused)
        )
        # Shape inference cannot type the outputs of fused com.microsoft ops; they are float32.
        quantize_dynamic(
            str(fused),
            str(out),
            per_channel=True,
            weight_type=QuantType.QInt8,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    fused.unlink()
    return out


def to_fp16(fp32: Path, out: Path) -> Path:
    """The graph with float weights and activations in fp16 (inputs and outputs keep their types), as the gpu
    target's encoders are served: half the memory and bandwidth, tensor cores, TensorRT's FP16 engines built from
    it without another cast. onnxruntime's own converter; LayerNorm and Softmax-heavy graphs stay within fp16's
    range at these sizes (the build checks the outputs)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True)
    _sort_topologically(model.graph)  # the converter appends the input casts after the nodes that read them
    onnx.save(model, str(out))
    onnx.checker.check_model(str(out))
    return out


def fp16_tolerance(reference: torch.Tensor | np.ndarray) -> float:
    """How far an fp16 graph may stray from fp32: 2% of the output's scale (fp16 keeps 10 mantissa bits)."""
    values = reference.detach().numpy() if isinstance(reference, torch.Tensor) else reference
    return 0.02 * max(1.0, float(np.max(np.abs(values))) if values.size else 1.0)


def _sort_topologically(graph) -> None:
    """Order the graph's nodes so that each comes after the nodes producing its inputs (ONNX requires it)."""
    available = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        ready = [node for node in pending if all(name in available for name in node.input)]
        if not ready:
            raise ValueError(f"graph has a cycle or a missing input around node {pending[0].name!r}")
        for node in ready:
            available.update(node.output)
        ordered += ready
        pending = [node for node in pending if node not in ready]
    del graph.node[:]
    graph.node.extend(ordered)
