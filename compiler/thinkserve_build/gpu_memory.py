"""The gpu target's memory plan: what each model of a repository takes on the one GPU that serves it.

Everything the gpu target serves shares one device: two TensorRT-LLM engines (weights and KV cache), the VLM's
vision tower (PyTorch), every encoder and OCR graph as a TensorRT engine behind onnxruntime (weights, and the
workspace TensorRT builds them in at the first start), a CUDA context per process, and the orchestrator's FAISS
indexes and PageRank pool when it runs on the same GPU. The plan adds them up from the artifacts (file sizes,
checkpoint shapes) so that a repository that cannot fit is refused when it is built (`--gpu-memory-gb`), not
found out by an out-of-memory error at load. Each engine's KV cache is bounded in tokens
(max_tokens_in_paged_kv_cache: every request in flight at its full length), which, unlike a fraction of the memory
free when it loads, does not depend on what loaded before it.

The figures are estimates from sizes, not measurements on a GPU: activations, allocator fragmentation and the
backends' own buffers are not counted (the margin covers them).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

CUDA_CONTEXT_BYTES = 600 << 20  # a process's CUDA context and library handles (cuBLAS, cuDNN): Triton's, the orchestrator's
ENGINE_BYTES_PER_PARAMETER = 2  # the engines are built in bfloat16 (trtllm_engines.ENGINE_DTYPE)
MARGIN = 0.10  # share of the declared memory kept back for what the plan does not count
PARALLEL_LOADS = 4  # models Triton loads at once (--model-load-thread-count's default): TensorRT builds that overlap
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


class GpuMemoryError(ValueError):
    """The repository would not fit the declared GPU memory; the message lists what takes most."""


@dataclass(frozen=True)
class MemoryItem:
    model: str
    kind: str  # weights | kv_cache | tensorrt_workspace | cuda_context | orchestrator
    bytes: int
    note: str = ""


@dataclass(frozen=True)
class GpuMemoryPlan:
    items: tuple[MemoryItem, ...]
    declared_bytes: Optional[int]  # None: nothing declared, the plan is reported only

    @property
    def total(self) -> int:
        return sum(item.bytes for item in self.items)

    @property
    def usable_bytes(self) -> Optional[int]:
        return None if self.declared_bytes is None else int(self.declared_bytes * (1 - MARGIN))

    @property
    def fits(self) -> bool:
        return self.usable_bytes is None or self.total <= self.usable_bytes

    def check(self) -> None:
        if not self.fits:
            largest = sorted(self.items, key=lambda item: -item.bytes)[:5]
            raise GpuMemoryError(
                f"the repository needs about {_gib(self.total)} of GPU memory, more than the {_gib(self.usable_bytes)} "
                f"usable of the declared {_gib(self.declared_bytes)} ({MARGIN:.0%} kept back); largest: "
                + ", ".join(f"{item.model} {item.kind} {_gib(item.bytes)}" for item in largest)
                + ". Lower serving.max_batch_size or the generators' max_context, or serve on a larger GPU"
            )

    def to_json(self) -> dict:
        return {"declared_bytes": self.declared_bytes, "usable_bytes": self.usable_bytes, "total_bytes": self.total,
                "fits": self.fits, "items": [item.__dict__ for item in self.items]}

    def summary(self) -> str:
        declared = f" of {_gib(self.usable_bytes)} usable" if self.declared_bytes is not None else " (no --gpu-memory-gb declared)"
        return f"GPU memory plan: about {_gib(self.total)}{declared}"


def _gib(size: Optional[int]) -> str:
    return "n/a" if size is None else f"{size / (1 << 30):.1f} GiB"


def safetensors_parameters(files: Iterable[Path]) -> int:
    """Parameters stored in safetensors files, read from their headers (the tensors are not loaded)."""
    total = 0
    for path in files:
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            count = 1
            for dimension in entry["shape"]:
                count *= dimension
            total += count
    return total


def kv_cache_bytes(config: dict, tokens: int, bytes_per_value: int = ENGINE_BYTES_PER_PARAMETER) -> int:
    """Keys and values of `tokens` positions in every layer of a decoder (its transformers config.json)."""
    layers = config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return 2 * layers * kv_heads * head_dim * tokens * bytes_per_value


def engine_items(model: str, checkpoint: Path, kv_tokens: int) -> list[MemoryItem]:
    """A TensorRT-LLM engine built from a transformers checkpoint: its bfloat16 weights and its KV cache."""
    config = json.loads((checkpoint / "config.json").read_text())
    parameters = safetensors_parameters(sorted(checkpoint.glob("*.safetensors")))
    return [
        MemoryItem(model, "weights", parameters * ENGINE_BYTES_PER_PARAMETER, f"{parameters:,} parameters in bfloat16"),
        MemoryItem(model, "kv_cache", kv_cache_bytes(config, kv_tokens), f"{kv_tokens:,} tokens (max_tokens_in_paged_kv_cache)"),
    ]


def plan(
    engines: Sequence[tuple[str, Path, int]], tensorrt_models: Sequence[tuple[str, int]], torch_models: Sequence[tuple[str, int]],
    workspace_bytes: int, orchestrator_bytes: int, declared_gb: Optional[float],
) -> GpuMemoryPlan:
    """`engines`: (model, checkpoint folder, KV tokens); `tensorrt_models`: (model, ONNX bytes) of the graphs TensorRT
    builds (an FP16 engine of an FP32 graph is about half its size: counted at the graph's size, an upper bound);
    `torch_models`: (model, weight bytes); `workspace_bytes`: TensorRT's builder workspace, held while an engine is
    built at the first start (as many at once as Triton loads models in parallel); `orchestrator_bytes`: its FAISS
    and PageRank budgets when it shares the GPU."""
    items: list[MemoryItem] = []
    for model, checkpoint, tokens in engines:
        items += engine_items(model, checkpoint, tokens)
    for model, size in tensorrt_models:
        items.append(MemoryItem(model, "weights", size, "TensorRT engine (at most the ONNX graph's size)"))
    if tensorrt_models:
        builds = min(len(tensorrt_models), PARALLEL_LOADS)
        items.append(MemoryItem("tensorrt builds", "tensorrt_workspace", builds * workspace_bytes,
                                f"{builds} builder workspaces at once, at the first start"))
    items += [MemoryItem(model, "weights", size, "PyTorch") for model, size in torch_models]
    items.append(MemoryItem("tritonserver", "cuda_context", CUDA_CONTEXT_BYTES))
    if orchestrator_bytes:
        items.append(MemoryItem("orchestrator", "cuda_context", CUDA_CONTEXT_BYTES))
        items.append(MemoryItem("orchestrator", "orchestrator", orchestrator_bytes, "index.gpu_memory_mb + retrieval.pagerank_gpu_memory_mb"))
    declared = None if declared_gb is None else int(declared_gb * (1 << 30))
    return GpuMemoryPlan(tuple(items), declared)
