"""Any ONNX network whose outputs have no padded axis (encoders, classifiers, towers), run with onnxruntime.

All requests of one `execute` become one onnxruntime call: ragged inputs are right-padded (masks make
padding inert) and the outputs are split back per request. This is where dynamic batching pays off. A network
that padding would change (PP-OCR's: parameter `batch` = "equal_shapes") runs one call per group of requests of
one shape instead.
"""

from __future__ import annotations

import triton_python_backend_utils as pb_utils

from ..batching import equal_shape_groups, pad_and_concatenate, split_rows
from .common import error_response, input_array, onnx_session
from .parameters import ModelParameters


class OnnxRunnerModel:
    def initialize(self, args):
        params = ModelParameters(args)
        self.model_name = params.model_name
        self.session = onnx_session(params.file("onnx_file"), params)
        graph_inputs = [i.name for i in self.session.get_inputs()]
        missing = [name for name in graph_inputs if name not in params.input_names()]
        if missing:
            raise ValueError(f"model {self.model_name}: the ONNX graph needs inputs {missing} that config.pbtxt lacks")
        # Config inputs the graph does not use (e.g. token_type_ids for a model without segments) are ignored.
        self.inputs = graph_inputs
        self.outputs = params.output_names()
        self.pad_values = params.json("pad_values", {})
        batching = params.string("batch", "pad")
        if batching not in ("pad", "equal_shapes"):
            raise ValueError(f"model {self.model_name}: parameter batch must be pad or equal_shapes, not {batching!r}")
        self.equal_shapes_only = batching == "equal_shapes"

    def execute(self, requests):
        responses = [None] * len(requests)
        try:
            arrays = {name: [input_array(r, name) for r in requests] for name in self.inputs}
            if self.equal_shapes_only:
                shapes = [tuple(arrays[name][i].shape[1:] for name in self.inputs) for i in range(len(requests))]
                groups = equal_shape_groups(shapes)
            else:
                groups = [list(range(len(requests)))]
        except Exception as error:
            return [error_response(f"{self.model_name}: {error}", error) for _ in requests]
        for group in groups:
            for index, response in zip(group, self._run({name: [values[i] for i in group] for name, values in arrays.items()})):
                responses[index] = response
        return responses

    def _run(self, batches: dict) -> list:
        """One onnxruntime call over some requests' inputs (ragged ones right-padded): a response for each."""
        count = len(batches[self.inputs[0]])
        try:
            rows = [array.shape[0] for array in batches[self.inputs[0]]]
            feeds = {name: pad_and_concatenate(arrays, self.pad_values.get(name, 0)) for name, arrays in batches.items()}
            results = self.session.run(self.outputs, feeds)
        except Exception as error:
            return [error_response(f"{self.model_name}: {error}", error) for _ in range(count)]
        per_output = [split_rows(result, rows) for result in results]
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor(name, per_output[k][i]) for k, name in enumerate(self.outputs)])
            for i in range(count)
        ]
