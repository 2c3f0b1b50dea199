"""The `gpu` target: NVIDIA's Triton container serving each network on its native backend.

- Encoders (text embedder, reranker, router classifier, page-image towers): Triton's onnxruntime backend on
  KIND_GPU instances, fp16 graphs (export.ONNX16, checked against PyTorch at build time), the TensorRT execution
  accelerator in FP16 with an engine cache and optimisation profiles spanning the shapes the pipeline sends.
  The tokenizers stay python models in the ensembles; they pad to a few fixed widths (BUCKETS), since a native
  backend batches only requests of one shape and TensorRT tunes per shape range.
- Generators (LLM, VLM, the VLM's relevance filter, the LLM router): TensorRT-LLM engines (built inside the
  container by the script this target writes, trtllm_engines.py) behind python adapters that keep the
  orchestrator's contracts (thinkserve_backend.models.trtllm_adapter). A VLM's image features come from its
  vision tower served by PyTorch on the GPU (the torch target's runner), fed to the engine as a prompt table.

None of this runs on the development machines (no GPU, no TensorRT): the configs are generated and parsed with
Triton's schema in CI, the adapters unit-tested against the TensorRT-LLM backend's documented contract.
"""

from __future__ import annotations

from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from orchestrator.triton.contracts import Tensor

from .artifacts import Artifact
from .model_config import PlannedModel, WarmupInput, add_tensor, schedule, set_parameters
from .profiles import ServingOptions
from .targets import TargetUnavailableError, queue_limits

# Sequence widths the tokenizers pad to (capped at each model's max_length).
BUCKETS = (16, 32, 64, 128, 256, 512)
ENCODER_FORMATS = frozenset({"onnx", "onnx16"})
GENERATOR_FORMATS = frozenset({"torch"})  # the checkpoint: TensorRT-LLM builds its engines from it
GENERATOR_ROLES = ("llm", "vlm")
TENSORRT_WORKSPACE_BYTES = 1 << 30


class GpuTarget:
    name = "gpu"
    instance_kind = "gpu"

    def __init__(self, engine_cache: str = "/data/tensorrt-cache", repository_mount: str = "/models"):
        self.engine_cache = engine_cache  # where TensorRT keeps built engines between starts (a writable volume)
        self.repository_mount = repository_mount  # where the container mounts this repository (absolute engine paths)

    @classmethod
    def for_device(cls, device: str) -> "GpuTarget":
        if device == "cpu":
            raise TargetUnavailableError("the gpu target serves on NVIDIA GPUs: use --target cpu or --target torch --device cpu")
        return cls()

    def describe(self) -> str:
        return "gpu (onnxruntime + TensorRT encoders, TensorRT-LLM generators)"

    def formats_for(self, role: str) -> frozenset[str]:
        return GENERATOR_FORMATS if role in GENERATOR_ROLES else ENCODER_FORMATS

    def tokenizer_parameters(self) -> dict[str, object]:
        return {"pad_to_buckets": list(BUCKETS)}

    ONNX16_FILES = {"": "onnx_fp16_file", "text": "text_onnx_fp16_file", "vision": "vision_onnx_fp16_file"}

    def network(
        self, name: str, artifact: Artifact, network: str, inputs: list[Tensor], outputs: list[Tensor],
        serving: ServingOptions, pad_values: dict,
    ) -> PlannedModel:
        """An fp16 ONNX graph on Triton's onnxruntime backend, TensorRT in front of it."""
        config = mc.ModelConfig(name=name, backend="onnxruntime", max_batch_size=serving.max_batch_size)
        for tensor in inputs:
            add_tensor(config.input, tensor)  # not ragged: the tokenizer's buckets give every row one width
        for tensor in outputs:
            add_tensor(config.output, tensor)
        shapes = _profile_shapes(inputs, serving.max_batch_size, artifact.facts.get("max_length", BUCKETS[-1]))
        warmup = tuple(WarmupInput(t.name, t.datatype, shapes["opt"][t.name][1:]) for t in inputs)
        schedule(config, serving.queue_delay_us, serving.encoder_instances, "gpu", queue_limits(serving), warmup)
        accelerator = config.optimization.execution_accelerators.gpu_execution_accelerator.add(name="tensorrt")
        accelerator.parameters.update({
            "precision_mode": "FP16",
            "max_workspace_size_bytes": str(TENSORRT_WORKSPACE_BYTES),
            "trt_engine_cache_enable": "1",
            "trt_engine_cache_path": f"{self.engine_cache}/{name}",
            "trt_timing_cache_enable": "1",
            "trt_timing_cache_path": self.engine_cache,
            **{f"trt_profile_{bound}_shapes": _shape_text(shapes[bound]) for bound in ("min", "opt", "max")},
        })
        set_parameters(config, {"intra_op_thread_count": 1})
        model_file = artifact.file(self.ONNX16_FILES[network])
        return PlannedModel(config, {"model.onnx": model_file})


def _profile_shapes(inputs: list[Tensor], max_batch_size: int, max_length: int) -> dict[str, dict[str, tuple[int, ...]]]:
    """TensorRT optimisation profile bounds per input, batch axis first: the shortest bucket alone, a typical batch
    (8 rows of 128 tokens, a query's passages), the largest batch at the model's max_length."""
    opt_batch = min(8, max_batch_size)
    bounds = {"min": (1, BUCKETS[0]), "opt": (opt_batch, min(128, max_length)), "max": (max_batch_size, max_length)}
    return {
        bound: {t.name: (batch, *(length if d == -1 else d for d in t.dims)) for t in inputs}
        for bound, (batch, length) in bounds.items()
    }


def _shape_text(shapes: dict[str, tuple[int, ...]]) -> str:
    """onnxruntime's profile syntax: input1:1x16,input2:1x16."""
    return ",".join(f"{name}:{'x'.join(str(d) for d in dims)}" for name, dims in shapes.items())


def engine_path(mount: str, model: str) -> Path:
    return Path(mount) / model / "1" / "engine"
