"""Any network of the torch target (encoders, classifiers, towers), run by PyTorch on the model's device.

The counterpart of onnx_runner.py: all requests of one `execute` become one forward pass (ragged inputs
right-padded, masks make padding inert) and the output is split back per request. Tensors pass between Triton
and torch through DLPack in both directions: no copy through numpy (Triton's python-backend stub is built
against numpy 1 and was seen to corrupt tensors with numpy 2), and on a GPU they stay on the device.
"""

from __future__ import annotations

import inspect
import time

import torch
import triton_python_backend_utils as pb_utils
from torch.utils.dlpack import from_dlpack

from ..stage_times import StageTimes
from ..torch_batching import batch_on_device
from ..torch_modules import NetworkKind, load_network
from .common import error_response
from .parameters import ModelParameters
from .torch_device import instance_device


def input_tensor(request, name: str) -> torch.Tensor:
    return from_dlpack(pb_utils.get_input_tensor_by_name(request, name).to_dlpack())


class TorchRunnerModel:
    def initialize(self, args):
        params = ModelParameters(args)
        self.model_name = params.model_name
        self.device, self.dtype = instance_device(params, args)
        self.network = load_network(NetworkKind.from_facts(params.json("network")), params.version_dir, self.device, self.dtype)
        accepted = set(inspect.signature(self.network.forward).parameters)
        # Config inputs the network does not take (token_type_ids of a model without segments) are ignored.
        self.inputs = [name for name in params.input_names() if name in accepted]
        self.outputs = params.output_names()
        if len(self.outputs) != 1:
            raise ValueError(f"model {self.model_name}: a torch network has one output, the config declares {self.outputs}")
        self.pad_values = params.json("pad_values", {})
        # diagnostic (stage_times.py): each execute's stages timed and logged, the forward pass waited for on a GPU
        self.stage_times = (StageTimes(self.model_name, float(params.string("stage_timing_interval_s", "0")))
                            if params.flag("stage_timing", False) else None)

    def execute(self, requests):
        marks = [time.monotonic()] if self.stage_times is not None else None
        try:
            batches = {name: [input_tensor(r, name) for r in requests] for name in self.inputs}
            rows = [tensor.shape[0] for tensor in batches[self.inputs[0]]]
            self._mark(marks)
            feeds = {}
            for name, tensors in batches.items():
                batch = batch_on_device(tensors, self.pad_values.get(name, 0), self.device)
                feeds[name] = batch.to(self.dtype) if batch.is_floating_point() else batch
            self._mark(marks)
            with torch.inference_mode():
                result = self.network(**feeds).float().contiguous()
            self._mark(marks, wait=True)
        except Exception as error:
            return [error_response(f"{self.model_name}: {error}", error) for _ in requests]
        responses = [
            pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack(self.outputs[0], part)])
            for part in torch.split(result, rows)
        ]
        if marks is not None:
            self._mark(marks)
            self.stage_times.add(sum(rows), marks)
            for line in self.stage_times.due():
                pb_utils.Logger.log_info(line)
        return responses

    def _mark(self, marks, wait: bool = False) -> None:
        """With stage timing on: the end of a stage (after the device finished its work, when `wait`)."""
        if marks is None:
            return
        if wait and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        marks.append(time.monotonic())
