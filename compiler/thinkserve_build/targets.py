"""Targets: which Triton backend serves each network of a profile, and on which device.

- `cpu`: every network in a python-backend model running its ONNX graph with onnxruntime on the CPU: the only
  backend in tritonserver's PyPI wheel, and the one this project's CPU machines have.
- `torch`: python-backend models running the same checkpoints in PyTorch (bf16 on a GPU, fp32 on the CPU),
  tensors exchanged with Triton through DLPack. It needs nothing but the tritonserver binary the cpu target
  uses and torch in the model environment, so it runs on any single GPU and, in CI, on the CPU.
- `gpu` (gpu_target.py): Triton's native onnxruntime backend with TensorRT for the encoders, TensorRT-LLM for
  the generators, in NVIDIA's Triton container.

A target decides a model folder's backend, files and parameters; names and tensors come from the contracts,
and the python model classes are the same for cpu and torch (a `runtime` parameter picks onnxruntime or torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Protocol

from orchestrator import prompts
from orchestrator.models import contracts
from orchestrator.models.chat_template import ChatTemplate
from orchestrator.models.contracts import ModelContract, Tensor

from .artifacts import Artifact
from .model_config import PlannedModel, QueueLimits, WarmupInput, python_model
from .profiles import PromptRouterSpec, ServingOptions

BACKEND = "thinkserve_backend.models"
OCR_ROLE = "ocr"
OCR_FORMATS = frozenset({"onnx"})  # PP-OCR's graphs as PaddleOCR exports them, on every target
DEVICES = ("auto", "cpu", "cuda")
TARGET_NAMES = ("cpu", "torch", "gpu")


# Per input of an OCR network: the (min, opt, max) shapes the pipeline sends it, batch axis first (TensorRT's profile).
OcrShapes = dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]


@dataclass(frozen=True)
class OcrNetwork:
    """One of PP-OCR's graphs as the `ocr` pipeline calls it: on a GPU `max_batch_size` rows a call within `shapes`;
    on the CPU (the python targets) `cpu_instances` instances of `cpu_max_batch_size` rows, one thread each."""

    name: str
    onnx_file: Path
    inputs: list[Tensor]
    outputs: list[Tensor]
    max_batch_size: int
    shapes: OcrShapes
    cpu_instances: int
    cpu_max_batch_size: int
    cpu_threads: int


class TargetUnavailableError(RuntimeError):
    """The machine cannot build or serve the target asked for (no GPU, no TensorRT): one line naming what is missing."""


class Target(Protocol):
    """What the repository planner asks of a target (repository.plan)."""

    name: str

    def describe(self) -> str: ...
    def formats_for(self, role: str) -> frozenset[str]: ...
    def tokenizer_parameters(self) -> dict[str, object]: ...
    def network(self, name: str, artifact: Artifact, network: str, inputs: list[Tensor], outputs: list[Tensor],
                serving: ServingOptions, pad_values: dict) -> PlannedModel: ...
    def generator(self, contract: ModelContract, artifact: Artifact, serving: ServingOptions) -> PlannedModel: ...
    def relevance(self, contract: ModelContract, artifact: Artifact, serving: ServingOptions) -> PlannedModel: ...
    def prompt_router(self, contract: ModelContract, llm: Artifact, spec: PromptRouterSpec, serving: ServingOptions) -> PlannedModel: ...
    def ocr_network(self, network: OcrNetwork, serving: ServingOptions) -> PlannedModel: ...
    def engines(self, profile, artifacts: dict[str, Artifact]) -> list[PlannedModel]: ...
    def check_fits(self, models: list[PlannedModel], profile, artifacts: dict[str, Artifact]) -> list[str]: ...
    def write_extras(self, repository: Path, profile, artifacts: dict[str, Artifact]) -> list[str]: ...


def queue_limits(serving: ServingOptions) -> Optional[QueueLimits]:
    """Triton's queue policy of every model, or None (the default: see ServingOptions.max_queue_size)."""
    if not serving.max_queue_size and not serving.queue_timeout_ms:
        return None
    return QueueLimits(serving.max_queue_size, serving.queue_timeout_ms * 1000)


class PythonTarget:
    """What the cpu and torch targets share: python-backend models, the same classes, ragged batching."""

    name = ""
    formats: frozenset[str] = frozenset()
    instance_kind = "cpu"  # the instance group of the networks and generators

    def describe(self) -> str:
        return self.name

    def formats_for(self, role: str) -> frozenset[str]:
        """What the exporter writes for a model role (compiler roles: embedder, reranker, router, page_<family>,
        llm, vlm, ocr): export.ONNX, ONNX16, TORCH."""
        return OCR_FORMATS if role == OCR_ROLE else self.formats

    def engines(self, profile, artifacts: dict[str, Artifact]) -> list[PlannedModel]:
        """Models the generators' adapters call (TensorRT-LLM engines on the gpu target); none here."""
        return []

    def check_fits(self, models: list[PlannedModel], profile, artifacts: dict[str, Artifact]) -> list[str]:
        """Refuse a repository the serving device cannot hold, before it is written (the gpu target's memory plan);
        what it found, one line each."""
        return []

    def write_extras(self, repository: Path, profile, artifacts: dict[str, Artifact]) -> list[str]:
        """Files beside the repository (the gpu target's engine build); what was written, one line each."""
        return []

    def generation_scheduling(self, serving: ServingOptions) -> dict[str, object]:
        """The generators' scheduling parameters beyond their worker threads (none: one generation per thread)."""
        return {}

    def generator_threads(self, serving: ServingOptions) -> int:
        """Intra-op threads of the generators' sessions: the networks' (onnxruntime)."""
        return serving.intra_op_threads

    def tokenizer_parameters(self) -> dict[str, object]:
        """Extra parameters of the ensembles' tokenizer steps (a native backend needs fixed-shape buckets)."""
        return {}

    def warmup(self, inputs: list[Tensor]) -> tuple[WarmupInput, ...]:
        """None on the CPU: onnxruntime and torch set a model up at load, and a warm-up request per model would
        lengthen every start (30 models on two cores) for a first call a few milliseconds slower."""
        return ()

    def network_parts(self, artifact: Artifact, network: str) -> tuple[dict[str, Path], dict[str, object], str]:
        """(files, parameters, python class) of one network of an artifact: "" its only network, or "text" /
        "vision" a page encoder's tower."""
        raise NotImplementedError

    def decoder_parts(self, artifact: Artifact) -> tuple[dict[str, Path], dict[str, object]]:
        """The files and parameters that load a generator's decoder (and its tokenizer and context)."""
        raise NotImplementedError

    def vision_parts(self, artifact: Artifact) -> tuple[dict[str, Path], dict[str, object]]:
        """The files and parameters of a VLM's vision tower and token embeddings, beyond decoder_parts."""
        raise NotImplementedError

    def network(
        self, name: str, artifact: Artifact, network: str, inputs: list[Tensor], outputs: list[Tensor],
        serving: ServingOptions, pad_values: dict,
    ) -> PlannedModel:
        files, parameters, python_class = self.network_parts(artifact, network)
        parameters["pad_values"] = pad_values
        config = python_model(
            name, inputs, outputs, parameters, serving.max_batch_size, serving.encoder_instances,
            serving.queue_delay_us, kind=self.instance_kind, queue=queue_limits(serving), warmup=self.warmup(inputs),
        )
        return PlannedModel(config, files, python_class)

    def generator(self, contract: ModelContract, artifact: Artifact, serving: ServingOptions) -> PlannedModel:
        files, parameters = self._decoder_with_tokenizer(artifact)
        parameters.update(
            eos_token_ids=artifact.facts["eos_token_ids"],
            default_max_tokens=artifact.facts["default_max_tokens"],
            max_concurrent_generations=serving.concurrent_generations,
            intra_op_threads=self.generator_threads(serving),
            **self.generation_scheduling(serving),
        )
        for fact, parameter in (
            ("vocab_size", contracts.VOCABULARY_PARAMETER),
            ("judger_entropy_nats", contracts.JUDGER_THRESHOLD_PARAMETER),
            ("judger_surprisal_nats", contracts.JUDGER_SURPRISAL_PARAMETER),
            ("chat_template", contracts.CHAT_TEMPLATE_PARAMETER),
            ("chat_template_variables", contracts.CHAT_TEMPLATE_VARIABLES_PARAMETER),
        ):
            if fact in artifact.facts:
                parameters[parameter] = artifact.facts[fact]
        python_class = f"{BACKEND}.generator:LanguageModel"
        if "image_token" in artifact.facts:
            self._add_vision(artifact, files, parameters)
            python_class = f"{BACKEND}.generator:VisionLanguageModel"
        config = python_model(
            contract.name,
            list(contract.inputs),
            list(contract.outputs),
            parameters,
            serving.max_batch_size,
            serving.generator_instances,
            queue_delay_us=0,  # requests are handed to generation threads at once; waiting buys nothing
            decoupled=True,
            kind=self.instance_kind,
            queue=queue_limits(serving),
        )
        return PlannedModel(config, files, python_class)

    def relevance(self, contract: ModelContract, artifact: Artifact, serving: ServingOptions) -> PlannedModel:
        """The VLM's yes/no page filter: the VLM's files behind a batchable (not decoupled) model."""
        files, parameters = self._decoder_with_tokenizer(artifact)
        self._add_vision(artifact, files, parameters)
        parameters["intra_op_threads"] = serving.intra_op_threads
        parameters["relevance_prompt"] = artifact.facts["relevance_prompt"]
        config = python_model(
            contract.name, list(contract.inputs), list(contract.outputs), parameters, serving.max_batch_size,
            serving.encoder_instances, serving.queue_delay_us, kind=self.instance_kind, queue=queue_limits(serving),
        )
        return PlannedModel(config, files, f"{BACKEND}.relevance:ImageRelevanceModel")

    def prompt_router(self, contract: ModelContract, llm: Artifact, spec: PromptRouterSpec, serving: ServingOptions) -> PlannedModel:
        """The router as a question to the LLM: its files (hard links), the question in its chat format."""
        files, parameters = self._decoder_with_tokenizer(llm)
        chat = ChatTemplate(llm.facts["chat_template"], llm.facts["chat_template_variables"])
        parameters.update(
            prompt=chat(prompts.ROUTE_SYSTEM, prompts.route_request("{question}")),
            labels=list(contracts.ROUTE_LABELS),
            output_name=contract.outputs[0].name,
            max_question_tokens=spec.max_question_tokens,
            intra_op_threads=serving.intra_op_threads,
        )
        config = python_model(
            contract.name, list(contract.inputs), list(contract.outputs), parameters,
            serving.max_batch_size, serving.encoder_instances, serving.queue_delay_us,
            kind=self.instance_kind, queue=queue_limits(serving),
        )
        return PlannedModel(config, files, f"{BACKEND}.prompt_classifier:PromptClassifierModel")

    def ocr_network(self, network: OcrNetwork, serving: ServingOptions) -> PlannedModel:
        """One of PP-OCR's graphs in onnxruntime, on the CPU on both python targets (PaddleOCR ships no PyTorch
        definition of them). Padding changes what the recogniser reads, so requests of different shapes share an
        `execute` (ragged) and run a call per shape: Triton batches unequal shapes only as ragged, and otherwise
        holds a request whose shape differs from the batch being formed for up to 500 ms (measured, issue 52)."""
        parameters = {"onnx_file": network.onnx_file.name, "intra_op_threads": network.cpu_threads, "pad_values": {},
                      "batch": "equal_shapes"}
        config = python_model(
            network.name, network.inputs, network.outputs, parameters, network.cpu_max_batch_size, network.cpu_instances,
            serving.queue_delay_us, queue=queue_limits(serving),
        )
        return PlannedModel(config, {network.onnx_file.name: network.onnx_file}, f"{BACKEND}.onnx_runner:OnnxRunnerModel")

    def _decoder_with_tokenizer(self, artifact: Artifact) -> tuple[dict[str, Path], dict[str, object]]:
        files, parameters = self.decoder_parts(artifact)
        files["tokenizer.json"] = artifact.file("tokenizer_file")
        parameters.update({"tokenizer_file": "tokenizer.json", contracts.CONTEXT_PARAMETER: artifact.facts["max_context"]})
        return files, parameters

    def _add_vision(self, artifact: Artifact, files: dict[str, Path], parameters: dict[str, object]) -> None:
        """A VLM's vision parts, its image token and preprocessing, and the image's length."""
        vision_files, vision_parameters = self.vision_parts(artifact)
        files.update(vision_files)
        parameters.update(vision_parameters)
        facts = artifact.facts
        parameters.update(
            image_token=facts["image_token"],
            preprocessing=facts["preprocessing"],
            **{contracts.IMAGE_TOKENS_PARAMETER: facts["image_tokens_per_image"]},
        )


class CpuTarget(PythonTarget):
    """ONNX graphs run by onnxruntime on the CPU."""

    name = "cpu"
    formats = frozenset({"onnx"})

    ONNX_FILES = {"": "onnx_file", "text": "text_onnx_file", "vision": "vision_onnx_file"}

    def network_parts(self, artifact, network):
        onnx_file = artifact.file(self.ONNX_FILES[network])
        return {onnx_file.name: onnx_file}, {"onnx_file": onnx_file.name}, f"{BACKEND}.onnx_runner:OnnxRunnerModel"

    def decoder_parts(self, artifact):
        facts = artifact.facts
        return {facts["decoder_file"]: artifact.file("decoder_file")}, {"decoder_file": facts["decoder_file"]}

    def vision_parts(self, artifact):
        facts = artifact.facts
        keys = ("vision_file", "embed_file")
        return {facts[key]: artifact.file(key) for key in keys}, {key: facts[key] for key in keys}


class TorchTarget(PythonTarget):
    """The checkpoints run by PyTorch: on a GPU (KIND_GPU instances, bf16) or on the CPU (fp32)."""

    name = "torch"
    formats = frozenset({"torch"})

    NETWORKS = {"": "torch_network", "text": "torch_text_network", "vision": "torch_vision_network"}
    # the checkpoint's files, under parameter names the launcher's repository check verifies (`*_file`)
    CHECKPOINT_PARAMETERS = {"config.json": "config_file", "model.safetensors": "weights_file"}

    def __init__(self, device: str):
        if device not in ("cpu", "cuda"):
            raise ValueError(f"the torch target runs on cpu or cuda, not {device!r}")
        self.device = device
        self.instance_kind = "gpu" if device == "cuda" else "cpu"

    def describe(self) -> str:
        return f"torch on {self.device}"

    def warmup(self, inputs: list[Tensor]) -> tuple[WarmupInput, ...]:
        """On a GPU one zero request per network before READY: CUDA context, kernel choice and allocator pools
        are then paid at load, not by the first user (variable axes warmed at 16 positions)."""
        if self.device != "cuda":
            return ()
        return tuple(WarmupInput(t.name, t.datatype, tuple(16 if d == -1 else d for d in t.dims)) for t in inputs)

    def generation_scheduling(self, serving: ServingOptions) -> dict[str, object]:
        """In-flight batching (thinkserve_backend.inflight_batching): its rows and how many may wait for one."""
        return {
            "inflight_batching": True,
            "max_batch_sequences": serving.batch_sequences,
            "max_waiting_generations": serving.waiting_generations,
        }

    def generator_threads(self, serving: ServingOptions) -> int:
        """On the CPU the generators' own thread count (ServingOptions.generator_cpu_threads); unused on a GPU."""
        return serving.generator_cpu_threads if self.device == "cpu" else serving.intra_op_threads

    def _checkpoint(self, artifact: Artifact) -> tuple[dict[str, Path], dict[str, object]]:
        facts = artifact.facts
        folder = artifact.directory / facts["torch_dir"]
        files = {name: folder / name for name in facts["torch_files"]}
        parameters: dict[str, object] = {self.CHECKPOINT_PARAMETERS[name]: name for name in facts["torch_files"]}
        parameters.update(runtime="torch", device=self.device)
        return files, parameters

    def network_parts(self, artifact, network):
        files, parameters = self._checkpoint(artifact)
        parameters["network"] = artifact.facts[self.NETWORKS[network]]
        return files, parameters, f"{BACKEND}.torch_runner:TorchRunnerModel"

    def decoder_parts(self, artifact):
        return self._checkpoint(artifact)

    def vision_parts(self, artifact):
        return {}, {}  # the checkpoint holds the vision tower and the embeddings
