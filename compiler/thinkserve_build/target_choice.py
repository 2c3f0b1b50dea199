"""The target a build asks for, made concrete on this machine: the cpu and torch targets (targets.py) or the gpu
target (gpu_target.py, which builds on targets.py: choosing lives here so neither imports the other in a circle)."""

from __future__ import annotations

from typing import Optional

from .targets import DEVICES, TARGET_NAMES, CpuTarget, Target, TargetUnavailableError, TorchTarget


def select_target(name: str, device: str = "auto", gpu_memory_gb: Optional[float] = None) -> Target:
    """The target `name` on `device` (auto: the torch target takes a CUDA GPU when torch sees one). Raises
    TargetUnavailableError, before anything is exported, when this machine cannot build or serve it."""
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; known: {', '.join(DEVICES)}")
    if name == "cpu":
        if device == "cuda":
            raise TargetUnavailableError("the cpu target runs on the CPU: use --target torch or gpu for a GPU")
        return CpuTarget()
    if name == "torch":
        return TorchTarget(_torch_device(device))
    if name == "gpu":
        from .gpu_target import GpuTarget  # its TensorRT-LLM and memory planning load only for that target

        return GpuTarget.for_device(device, gpu_memory_gb)
    raise ValueError(f"unknown target {name!r}; known: {', '.join(TARGET_NAMES)}")


def _torch_device(device: str) -> str:
    try:
        import torch
    except ImportError:
        raise TargetUnavailableError("target torch needs PyTorch in the build environment (pip install torch)") from None
    has_gpu = torch.cuda.is_available()
    if device == "cuda" and not has_gpu:
        raise TargetUnavailableError(
            f"target torch on cuda needs a CUDA GPU, and torch {torch.__version__} sees none here "
            "(build on the GPU machine, or --device cpu)"
        )
    return device if device != "auto" else ("cuda" if has_gpu else "cpu")
