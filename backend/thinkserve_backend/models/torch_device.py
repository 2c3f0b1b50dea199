"""Where a torch-target model instance runs: the GPU Triton gave the instance (KIND_GPU), or the CPU."""

from __future__ import annotations

import torch

from ..torch_modules import device_and_dtype
from .parameters import ModelParameters


def instance_device(params: ModelParameters, args: dict) -> tuple[torch.device, torch.dtype]:
    """The `device` parameter (cuda | cpu) made concrete: cuda:<the instance's device id>; bf16 on a GPU, fp32 on
    the CPU unless the `dtype` parameter says otherwise. On the CPU torch uses intra_op_threads threads."""
    device = params.string("device", "cpu")
    if device == "cuda":
        device = f"cuda:{args.get('model_instance_device_id', '0') or '0'}"
    else:
        torch.set_num_threads(params.integer("intra_op_threads", 2))
    return device_and_dtype(device, params.string("dtype", "auto"))
