"""The model repository of a profile: which Triton models exist, how they chain into ensembles, and writing them.

Public models (ensembles, LLM, VLM) carry the names and tensors of orchestrator.triton.contracts. The steps
inside an ensemble are this module's business: a python tokenizer/preprocessor, then a network whose backend
the target chooses. Adding a GPU target (TensorRT plans, TensorRT-LLM) means adding a Target here; nothing in
the orchestrator changes.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from orchestrator import prompts
from orchestrator.triton import contracts
from orchestrator.triton.chat_template import ChatTemplate
from orchestrator.triton.contracts import ModelContract, Tensor

from .artifacts import Artifact
from .model_config import PlannedModel, ensemble, python_model, to_text
from .profiles import Profile, PromptRouterSpec, ServingOptions

BACKEND = "thinkserve_backend.models"


class CpuTarget:
    """Every network runs in a python-backend model with onnxruntime: the only backend in tritonserver's PyPI
    wheel, and the one this project's CPU machines have."""

    name = "cpu"

    def network(
        self, name: str, onnx_file: Path, inputs: list[Tensor], outputs: list[Tensor], serving: ServingOptions, pad_values: dict
    ) -> PlannedModel:
        config = python_model(
            name,
            inputs,
            outputs,
            {"onnx_file": onnx_file.name, "intra_op_threads": serving.intra_op_threads, "pad_values": pad_values},
            serving.max_batch_size,
            serving.encoder_instances,
            serving.queue_delay_us,
        )
        return PlannedModel(config, {onnx_file.name: onnx_file}, f"{BACKEND}.onnx_runner:OnnxRunnerModel")

    def generator(self, contract: ModelContract, artifact: Artifact, serving: ServingOptions) -> PlannedModel:
        files, parameters = _decoder_parts(artifact)
        parameters.update(
            eos_token_ids=artifact.facts["eos_token_ids"],
            default_max_tokens=artifact.facts["default_max_tokens"],
            max_concurrent_generations=serving.concurrent_generations,
            intra_op_threads=serving.intra_op_threads,
        )
        for fact, parameter in (
            ("vocab_size", contracts.VOCABULARY_PARAMETER),
            ("judger_entropy_nats", contracts.JUDGER_THRESHOLD_PARAMETER),
            ("chat_template", contracts.CHAT_TEMPLATE_PARAMETER),
            ("chat_template_variables", contracts.CHAT_TEMPLATE_VARIABLES_PARAMETER),
        ):
            if fact in artifact.facts:
                parameters[parameter] = artifact.facts[fact]
        python_class = f"{BACKEND}.generator:LanguageModel"
        if "vision_file" in artifact.facts:
            _add_vision_parts(artifact, files, parameters)
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
        )
        return PlannedModel(config, files, python_class)

    def relevance(self, contract: ModelContract, artifact: Artifact, serving: ServingOptions) -> PlannedModel:
        """The VLM's yes/no page filter: the VLM's files behind a batchable (not decoupled) model."""
        files, parameters = _decoder_parts(artifact)
        _add_vision_parts(artifact, files, parameters)
        parameters["intra_op_threads"] = serving.intra_op_threads
        parameters["relevance_prompt"] = artifact.facts["relevance_prompt"]
        config = python_model(
            contract.name,
            list(contract.inputs),
            list(contract.outputs),
            parameters,
            serving.max_batch_size,
            serving.encoder_instances,
            serving.queue_delay_us,
        )
        return PlannedModel(config, files, f"{BACKEND}.relevance:ImageRelevanceModel")


    def prompt_router(self, contract: ModelContract, llm: Artifact, spec: PromptRouterSpec, serving: ServingOptions) -> PlannedModel:
        """The router as a question to the LLM: its files (hard links), the question in its chat format."""
        files, parameters = _decoder_parts(llm)
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
        )
        return PlannedModel(config, files, f"{BACKEND}.prompt_classifier:PromptClassifierModel")


def _decoder_parts(artifact: Artifact) -> tuple[dict[str, Path], dict[str, object]]:
    """The decoder graph and tokenizer of an LLM or VLM, and the parameters naming them and the context."""
    facts = artifact.facts
    files = {facts["decoder_file"]: artifact.file("decoder_file"), "tokenizer.json": artifact.file("tokenizer_file")}
    parameters = {
        "decoder_file": facts["decoder_file"],
        "tokenizer_file": "tokenizer.json",
        contracts.CONTEXT_PARAMETER: facts["max_context"],
    }
    return files, parameters


def _add_vision_parts(artifact: Artifact, files: dict[str, Path], parameters: dict[str, object]) -> None:
    """A VLM's vision tower and token embeddings, its image token and preprocessing, and the image's length."""
    facts = artifact.facts
    for key in ("vision_file", "embed_file"):
        files[facts[key]] = artifact.file(key)
        parameters[key] = facts[key]
    parameters.update(
        image_token=facts["image_token"],
        preprocessing=facts["preprocessing"],
        **{contracts.IMAGE_TOKENS_PARAMETER: facts["image_tokens_per_image"]},
    )


TARGETS = {"cpu": CpuTarget()}


def _ints(names: list[str]) -> list[Tensor]:
    return [Tensor(name, "INT64", (-1,)) for name in names]


def _tokenizer(name: str, artifact: Artifact, outputs: list[str], serving: ServingOptions, pair: bool = False) -> PlannedModel:
    facts = artifact.facts
    inputs = [Tensor("text", "BYTES", (1,))] + ([Tensor("text_pair", "BYTES", (1,))] if pair else [])
    config = python_model(
        name,
        inputs,
        _ints(outputs),
        {
            "tokenizer_file": "tokenizer.json",
            "max_length": facts["max_length"],
            "pad_id": facts["pad_id"],
            "pad_to_max_length": facts.get("pad_to_max_length", False),
        },
        serving.max_batch_size,
        serving.tokenizer_instances,
        serving.queue_delay_us,
    )
    return PlannedModel(config, {"tokenizer.json": artifact.file("tokenizer_file")}, f"{BACKEND}.tokenizer:TokenizerModel")


def _two_step(contract: ModelContract, first: PlannedModel, first_inputs: dict, links: list[str], second: PlannedModel, output: str, dims: tuple, serving: ServingOptions) -> PlannedModel:
    """contract inputs -> first (tokenizer/preprocessor) -> `links` tensors -> second (network) -> contract output."""
    steps = [
        (first.name, first_inputs, {name: name for name in links}),
        (second.name, {name: name for name in links}, {output: contract.outputs[0].name}),
    ]
    return PlannedModel(ensemble(contract, serving.max_batch_size, steps, {contract.outputs[0].name: dims}))


def _text_encoder(
    contract: ModelContract, step: str, artifact: Artifact, network_file: str, inputs: list[str], output: str,
    dim: int, target, serving: ServingOptions, pair: bool = False,
) -> list[PlannedModel]:
    """tokenize -> network ensemble; `step` names the network model (e.g. text_embedder_encode)."""
    tokenize = _tokenizer(f"{contract.name}_tokenize", artifact, inputs, serving, pair=pair)
    network = target.network(
        f"{contract.name}_{step}",
        artifact.file(network_file),
        _ints(inputs),
        [Tensor(output, "FP32", (dim,))],
        serving,
        {"input_ids": artifact.facts["pad_id"]},
    )
    mapping = {"text": "query", "text_pair": "passage"} if pair else {"text": "text"}
    return [tokenize, network, _two_step(contract, tokenize, mapping, inputs, network, output, (dim,), serving)]


def _page_image_encoder(family: str, artifact: Artifact, target, serving: ServingOptions) -> list[PlannedModel]:
    contract = contracts.page_image_encoder(family)
    facts = artifact.facts
    size = facts["preprocessing"]
    pixels = Tensor("pixel_values", "FP32", (3, size["height"], size["width"]))
    preprocess = PlannedModel(
        python_model(
            f"{contract.name}_preprocess",
            [Tensor("image", "BYTES", (1,))],
            [pixels],
            {"preprocessing": facts["preprocessing"]},
            serving.max_batch_size,
            serving.tokenizer_instances,
            serving.queue_delay_us,
        ),
        python_class=f"{BACKEND}.image_preprocessor:ImagePreprocessorModel",
    )
    dim = facts["embedding_dim"]
    network = target.network(
        f"{contract.name}_encode", artifact.file("vision_onnx_file"), [pixels], [Tensor("embedding", "FP32", (dim,))], serving, {}
    )
    return [
        preprocess,
        network,
        _two_step(contract, preprocess, {"image": "image"}, ["pixel_values"], network, "embedding", (dim,), serving),
    ]


def plan(profile: Profile, artifacts: dict[str, Artifact], target_name: str = "cpu") -> list[PlannedModel]:
    """Every model folder of the repository, for `target_name`."""
    try:
        target = TARGETS[target_name]
    except KeyError:
        raise ValueError(f"unknown target {target_name!r}; known: {', '.join(TARGETS)}") from None
    serving = profile.serving
    embedder, reranker = artifacts["embedder"], artifacts["reranker"]
    models = _text_encoder(
        contracts.TEXT_EMBEDDER, "encode", embedder, "onnx_file", embedder.facts["inputs"], "embedding",
        embedder.facts["embedding_dim"], target, serving,
    )
    models += _text_encoder(
        contracts.RERANKER, "score", reranker, "onnx_file", reranker.facts["inputs"], "score", 1, target, serving, pair=True
    )
    if isinstance(profile.router, PromptRouterSpec):
        models.append(target.prompt_router(contracts.ROUTER, artifacts["llm"], profile.router, serving))
    else:
        router = artifacts["router"]
        models += _text_encoder(
            contracts.ROUTER, "classify", router, "onnx_file", router.facts["inputs"], "probabilities",
            router.facts["output_dim"], target, serving,
        )
    for spec in profile.page_encoders:
        artifact = artifacts[f"page_{spec.family}"]
        models += _text_encoder(
            contracts.page_text_encoder(spec.family), "encode", artifact, "text_onnx_file", artifact.facts["text_inputs"],
            "embedding", artifact.facts["embedding_dim"], target, serving,
        )
        models += _page_image_encoder(spec.family, artifact, target, serving)
    models.append(target.generator(contracts.LLM, artifacts["llm"], serving))
    models.append(target.generator(contracts.VLM, artifacts["vlm"], serving))
    models.append(target.relevance(contracts.VLM_RELEVANCE, artifacts["vlm"], serving))
    return models


@dataclass
class WriteReport:
    written: list[str]
    removed: list[str]


MODEL_PY = '''"""Generated by thinkserve_build. The code is {module}, installed in Triton's model environment."""
from {module} import {cls} as TritonPythonModel  # noqa: F401
'''


def write(models: list[PlannedModel], output: Path) -> WriteReport:
    """Lay the models out under `output`; files that did not change are left untouched (and their mtimes)."""
    output.mkdir(parents=True, exist_ok=True)
    written = []
    for model in models:
        version = output / model.name / "1"
        version.mkdir(parents=True, exist_ok=True)
        changed = _write_if_changed(output / model.name / "config.pbtxt", to_text(model.config))
        expected = set(model.files)
        if model.python_class:
            module, cls = model.python_class.split(":")
            changed |= _write_if_changed(version / "model.py", MODEL_PY.format(module=module, cls=cls))
            expected.add("model.py")
        for name, source in model.files.items():
            changed |= _link(source, version / name)
        for stale in version.iterdir():
            if stale.name not in expected and stale.name != "__pycache__":
                shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
                changed = True
        if changed:
            written.append(model.name)
    names = {model.name for model in models}
    removed = []
    for folder in sorted(output.iterdir()):
        if folder.is_dir() and folder.name not in names and (folder / "config.pbtxt").exists():
            shutil.rmtree(folder)
            removed.append(folder.name)
    return WriteReport(written, removed)


def _write_if_changed(path: Path, text: str) -> bool:
    if path.exists() and path.read_text() == text:
        return False
    path.write_text(text)
    return True


def _link(source: Path, target: Path) -> bool:
    """Hard-link a built file into the repository (no copy of the weights); copy across file systems."""
    if target.exists() and os.path.samefile(source, target):
        return False
    if target.exists():
        target.unlink()
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
    return True
