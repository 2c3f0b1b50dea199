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

import json
from pathlib import Path
from typing import Optional

from tritonclient.grpc import model_config_pb2 as mc

from orchestrator import prompts
from orchestrator.models import contracts
from orchestrator.models.chat_template import ChatTemplate
from orchestrator.models.contracts import ModelContract, Tensor

from . import gpu_memory, trtllm_engines
from .artifacts import Artifact
from .model_config import PlannedModel, WarmupInput, add_tensor, python_model, schedule, set_parameters
from .profiles import Profile, PromptRouterSpec, ServingOptions
from .targets import BACKEND, OCR_FORMATS, OCR_ROLE, OcrNetwork, TargetUnavailableError, queue_limits

# Sequence widths the tokenizers pad to (capped at each model's max_length).
BUCKETS = (16, 32, 64, 128, 256, 512)
ENCODER_FORMATS = frozenset({"onnx", "onnx16"})
# The checkpoints: TensorRT-LLM builds the engines from the LLM's and from the VLM's decoder as a causal LM of its
# own; the VLM's vision tower runs from its checkpoint in PyTorch.
FORMATS_BY_ROLE = {"llm": frozenset({"torch"}), "vlm": frozenset({"torch", "language_model"})}
TENSORRT_WORKSPACE_BYTES = 1 << 30
LLM_ENGINE, VLM_ENGINE, VLM_IMAGE_FEATURES = "llm_engine", "vlm_engine", "vlm_image_features"
IMAGES_PER_REQUEST = 8  # a VLM request's images the engine's prompt table is sized for (per request in flight)
ADAPTER = f"{BACKEND}.trtllm_adapter"


class GpuTarget:
    name = "gpu"
    instance_kind = "gpu"

    def __init__(self, engine_cache: str = "/data/tensorrt-cache", engines_mount: str = "/engines",
                 memory_gb: Optional[float] = None):
        self.engine_cache = engine_cache  # where TensorRT keeps the encoders' engines between starts (a writable volume)
        self.engines_mount = engines_mount  # where the container mounts <repository>.engines (TensorRT-LLM's engines)
        self.memory_gb = memory_gb  # the serving GPU's memory: a repository that does not fit is refused (gpu_memory.py)
        self.memory_plan: Optional[gpu_memory.GpuMemoryPlan] = None  # the last repository's, once checked

    @classmethod
    def for_device(cls, device: str, memory_gb: Optional[float] = None) -> "GpuTarget":
        if device == "cpu":
            raise TargetUnavailableError("the gpu target serves on NVIDIA GPUs: use --target cpu or --target torch --device cpu")
        return cls(memory_gb=memory_gb)

    def describe(self) -> str:
        return "gpu (onnxruntime + TensorRT encoders, TensorRT-LLM generators)"

    def formats_for(self, role: str) -> frozenset[str]:
        return OCR_FORMATS if role == OCR_ROLE else FORMATS_BY_ROLE.get(role, ENCODER_FORMATS)

    def tokenizer_parameters(self) -> dict[str, object]:
        return {"pad_to_buckets": list(BUCKETS)}

    ONNX16_FILES = {"": "onnx_fp16_file", "text": "text_onnx_fp16_file", "vision": "vision_onnx_fp16_file"}

    def network(
        self, name: str, artifact: Artifact, network: str, inputs: list[Tensor], outputs: list[Tensor],
        serving: ServingOptions, pad_values: dict,
    ) -> PlannedModel:
        """An fp16 ONNX graph on Triton's onnxruntime backend, TensorRT in front of it."""
        shapes = _profile_shapes(inputs, serving.max_batch_size, artifact.facts.get("max_length", BUCKETS[-1]))
        # not ragged: the tokenizer's buckets give every row one width
        return self._tensorrt_model(name, artifact.file(self.ONNX16_FILES[network]), inputs, outputs, serving.max_batch_size, shapes, serving)

    def ocr_network(self, network: OcrNetwork, serving: ServingOptions) -> PlannedModel:
        """One of PP-OCR's graphs (fp32 as PaddleOCR ships it; TensorRT builds FP16 engines from it) on the native
        onnxruntime backend, one optimisation profile spanning the shapes the pipeline sends. Not measured: whether
        Triton's wait on a request of another shape (500 ms on the python targets, issue 52) costs here too."""
        bounds = {bound: {tensor: dims[i] for tensor, dims in network.shapes.items()} for i, bound in enumerate(("min", "opt", "max"))}
        return self._tensorrt_model(network.name, network.onnx_file, network.inputs, network.outputs, network.max_batch_size, bounds, serving)

    def _tensorrt_model(
        self, name: str, model_file: Path, inputs: list[Tensor], outputs: list[Tensor], max_batch_size: int,
        shapes: dict[str, dict[str, tuple[int, ...]]], serving: ServingOptions,
    ) -> PlannedModel:
        """An ONNX graph on Triton's onnxruntime backend, KIND_GPU, the TensorRT accelerator in FP16 in front of it
        with engine and timing caches and one optimisation profile (`shapes`: min / opt / max per input), warmed up
        at the opt shape before the model is READY."""
        config = mc.ModelConfig(name=name, backend="onnxruntime", max_batch_size=max_batch_size)
        for tensor in inputs:
            add_tensor(config.input, tensor)
        for tensor in outputs:
            add_tensor(config.output, tensor)
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
        return PlannedModel(config, {"model.onnx": model_file})


    # ---------------------------------------------------------------- generators: TensorRT-LLM behind adapters

    def generator(self, contract: ModelContract, artifact: Artifact, serving: ServingOptions) -> PlannedModel:
        """The LLM or VLM contract as a decoupled adapter streaming from its engine (trtllm_adapter)."""
        vision = contract.name == contracts.VLM.name
        facts = artifact.facts
        parameters = {
            **self._adapter_parameters(artifact, VLM_ENGINE if vision else LLM_ENGINE),
            "eos_token_ids": facts["eos_token_ids"],
            "default_max_tokens": facts["default_max_tokens"],
            # Logits (the vocabulary, 4 bytes each, per token) only for requests that want entropies: the judger's
            # probes. Answers stream the engine's log-probs alone (trtllm.wants_logits).
            "generation_logits": False,
            "max_concurrent_generations": serving.max_batch_size,  # one waiting thread per request in flight
        }
        for fact, parameter in (
            ("judger_entropy_nats", contracts.JUDGER_THRESHOLD_PARAMETER),
            ("judger_surprisal_nats", contracts.JUDGER_SURPRISAL_PARAMETER),
            ("chat_template", contracts.CHAT_TEMPLATE_PARAMETER),
            ("chat_template_variables", contracts.CHAT_TEMPLATE_VARIABLES_PARAMETER),
        ):
            if fact in facts:
                parameters[parameter] = facts[fact]
        if vision:
            parameters.update(self._vision_parameters(artifact))
        config = python_model(
            contract.name, list(contract.inputs), list(contract.outputs), parameters, serving.max_batch_size,
            serving.generator_instances, queue_delay_us=0, decoupled=True, queue=queue_limits(serving),
        )
        kind = "TrtllmVisionLanguageModel" if vision else "TrtllmLanguageModel"
        return PlannedModel(config, {"tokenizer.json": artifact.file("tokenizer_file")}, f"{ADAPTER}:{kind}")

    def relevance(self, contract: ModelContract, artifact: Artifact, serving: ServingOptions) -> PlannedModel:
        """The page filter: one batched one-token engine request per execute, P(yes) off its first step."""
        parameters = {
            **self._adapter_parameters(artifact, VLM_ENGINE),
            **self._vision_parameters(artifact),
            "relevance_prompt": artifact.facts["relevance_prompt"],
            "engine_max_batch_size": serving.max_batch_size,
        }
        config = python_model(
            contract.name, list(contract.inputs), list(contract.outputs), parameters, serving.max_batch_size,
            serving.encoder_instances, serving.queue_delay_us, queue=queue_limits(serving),
        )
        return PlannedModel(config, {"tokenizer.json": artifact.file("tokenizer_file")}, f"{ADAPTER}:TrtllmRelevanceModel")

    def prompt_router(self, contract: ModelContract, llm: Artifact, spec: PromptRouterSpec, serving: ServingOptions) -> PlannedModel:
        """The router as a question to the LLM's engine: each label's share of the first step's probability."""
        chat = ChatTemplate(llm.facts["chat_template"], llm.facts["chat_template_variables"])
        parameters = {
            **self._adapter_parameters(llm, LLM_ENGINE),
            "prompt": chat(prompts.ROUTE_SYSTEM, prompts.route_request("{question}")),
            "labels": list(contracts.ROUTE_LABELS),
            "output_name": contract.outputs[0].name,
            "max_question_tokens": spec.max_question_tokens,
            "engine_max_batch_size": serving.max_batch_size,
        }
        config = python_model(
            contract.name, list(contract.inputs), list(contract.outputs), parameters, serving.max_batch_size,
            serving.encoder_instances, serving.queue_delay_us, queue=queue_limits(serving),
        )
        return PlannedModel(config, {"tokenizer.json": llm.file("tokenizer_file")}, f"{ADAPTER}:TrtllmPromptClassifierModel")

    def engines(self, profile: Profile, artifacts: dict[str, Artifact]) -> list[PlannedModel]:
        """The two tensorrt_llm models and the VLM's vision tower (PyTorch on the GPU, as the torch target runs it)."""
        queue = queue_limits(profile.serving)
        models = [trtllm_engines.engine_config(spec, self.engines_mount, queue) for spec in self._engine_specs(profile, artifacts)]
        vlm = artifacts["vlm"]
        size = vlm.facts["preprocessing"]
        folder = vlm.directory / vlm.facts["torch_dir"]
        parameters = {
            "runtime": "torch", "device": "cuda", "network": {"name": "llava_image_features"}, "pad_values": {},
            "config_file": "config.json", "weights_file": "model.safetensors",
        }
        pixels = Tensor("pixel_values", "FP32", (3, size["height"], size["width"]))
        features = Tensor("image_features", "FP32", (vlm.facts["image_tokens_per_image"], vlm.facts["text_hidden_size"]))
        config = python_model(
            VLM_IMAGE_FEATURES, [pixels], [features], parameters, profile.serving.max_batch_size,
            profile.serving.encoder_instances, profile.serving.queue_delay_us, kind="gpu", queue=queue,
            warmup=(WarmupInput(pixels.name, pixels.datatype, pixels.dims),),
        )
        files = {name: folder / name for name in vlm.facts["torch_files"]}
        models.append(PlannedModel(config, files, f"{BACKEND}.torch_runner:TorchRunnerModel"))
        return models

    def check_fits(self, models: list[PlannedModel], profile: Profile, artifacts: dict[str, Artifact]) -> list[str]:
        """The repository's GPU memory plan (gpu_memory.py), before it is written: refused (GpuMemoryError) when it
        does not fit the declared memory."""
        from orchestrator.config import IndexSettings, RetrievalSettings

        index, retrieval = IndexSettings(), RetrievalSettings()
        orchestrator_mb = index.gpu_memory_mb + index.gpu_temp_memory_mb + retrieval.pagerank_gpu_memory_mb
        tensorrt = [(m.name, sum(f.stat().st_size for f in m.files.values())) for m in models
                    if m.config.backend == "onnxruntime" and m.config.optimization.execution_accelerators.gpu_execution_accelerator]
        torch = [(m.name, sum(f.stat().st_size for f in m.files.values() if f.suffix == ".safetensors")) for m in models
                 if m.name == VLM_IMAGE_FEATURES]
        engines = [(spec.model, spec.checkpoint, spec.kv_tokens) for spec in self._engine_specs(profile, artifacts)]
        self.memory_plan = gpu_memory.plan(engines, tensorrt, torch, TENSORRT_WORKSPACE_BYTES, orchestrator_mb << 20, self.memory_gb)
        self.memory_plan.check()
        return [self.memory_plan.summary()]

    def write_extras(self, repository: Path, profile: Profile, artifacts: dict[str, Artifact]) -> list[str]:
        """<repository>.engines/: the engines' checkpoints and build_engines.sh (engines are built in the container),
        and the memory plan (memory_plan.json)."""
        folder = trtllm_engines.write_engines_folder(repository, self._engine_specs(profile, artifacts), self.engines_mount)
        lines = [f"TensorRT-LLM engines: run {folder / 'build_engines.sh'} in NVIDIA's Triton TensorRT-LLM container"]
        if self.memory_plan is not None:
            (folder / "memory_plan.json").write_text(json.dumps(self.memory_plan.to_json(), indent=1) + "\n")
            lines.append(f"{self.memory_plan.summary()}: {folder / 'memory_plan.json'}")
        return lines

    def _engine_specs(self, profile: Profile, artifacts: dict[str, Artifact]) -> list[trtllm_engines.EngineSpec]:
        llm, vlm = artifacts["llm"], artifacts["vlm"]
        batch = profile.serving.max_batch_size
        llm_checkpoint = llm.directory / llm.facts["torch_dir"]
        return [
            trtllm_engines.EngineSpec(
                LLM_ENGINE, "llm", llm_checkpoint, _model_type(llm_checkpoint), batch, llm.facts["max_context"]
            ),
            trtllm_engines.EngineSpec(
                VLM_ENGINE, "vlm", vlm.directory / vlm.facts["language_model_dir"], vlm.facts["language_model_type"],
                batch, vlm.facts["max_context"],
                prompt_table_rows=batch * IMAGES_PER_REQUEST * vlm.facts["image_tokens_per_image"],
            ),
        ]

    @staticmethod
    def _adapter_parameters(artifact: Artifact, engine: str) -> dict[str, object]:
        return {
            "tokenizer_file": "tokenizer.json",
            "engine_model": engine,
            contracts.CONTEXT_PARAMETER: artifact.facts["max_context"],
            contracts.VOCABULARY_PARAMETER: artifact.facts["vocab_size"],
        }

    @staticmethod
    def _vision_parameters(artifact: Artifact) -> dict[str, object]:
        facts = artifact.facts
        return {
            "vision_model": VLM_IMAGE_FEATURES,
            "image_token": facts["image_token"],
            "preprocessing": facts["preprocessing"],
            contracts.IMAGE_TOKENS_PARAMETER: facts["image_tokens_per_image"],
            "prompt_table_dtype": trtllm_engines.ENGINE_DTYPE,
        }


def _model_type(checkpoint: Path) -> str:
    return json.loads((checkpoint / "config.json").read_text())["model_type"]


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
