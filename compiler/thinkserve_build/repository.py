"""The model repository of a profile: which Triton models exist, how they chain into ensembles, and writing them.

Public models (ensembles, LLM, VLM) carry the names and tensors of orchestrator.models.contracts. The steps
inside an ensemble are this module's business: a python tokenizer/preprocessor, then a network whose backend
the target chooses (targets.py, gpu_target.py); nothing in the orchestrator changes with the target.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from orchestrator.models import contracts
from orchestrator.models.contracts import ModelContract, Tensor

from .artifacts import Artifact
from .model_config import PlannedModel, ensemble, python_model, to_text
from .profiles import OcrSpec, Profile, PromptRouterSpec, ServingOptions
from .targets import BACKEND, OcrNetwork, Target, queue_limits

def _ints(names: list[str]) -> list[Tensor]:
    return [Tensor(name, "INT64", (-1,)) for name in names]


def _tokenizer(
    name: str, artifact: Artifact, outputs: list[str], target: Target, serving: ServingOptions, pair: bool = False
) -> PlannedModel:
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
            **target.tokenizer_parameters(),
        },
        serving.max_batch_size,
        serving.tokenizer_instances,
        serving.queue_delay_us,
        queue=queue_limits(serving),
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
    contract: ModelContract, step: str, artifact: Artifact, network: str, inputs: list[str], output: str,
    dim: int, target: Target, serving: ServingOptions, pair: bool = False,
) -> list[PlannedModel]:
    """tokenize -> network ensemble; `step` names the network model (e.g. text_embedder_encode), `network` which
    of the artifact's networks it runs ("" its only one, "text" a page encoder's text tower)."""
    tokenize = _tokenizer(f"{contract.name}_tokenize", artifact, inputs, target, serving, pair=pair)
    network = target.network(
        f"{contract.name}_{step}",
        artifact,
        network,
        _ints(inputs),
        [Tensor(output, "FP32", (dim,))],
        serving,
        {"input_ids": artifact.facts["pad_id"]},
    )
    mapping = {"text": "query", "text_pair": "passage"} if pair else {"text": "text"}
    return [tokenize, network, _two_step(contract, tokenize, mapping, inputs, network, output, (dim,), serving)]


def _page_image_encoder(family: str, artifact: Artifact, target: Target, serving: ServingOptions) -> list[PlannedModel]:
    contract = contracts.page_image_encoder(family)
    facts = artifact.facts
    size = facts["preprocessing"]
    # resized but not normalised: the tower normalises on its device (a quarter of float32's bytes between the steps)
    pixels = Tensor("pixels", "UINT8", (3, size["height"], size["width"]))
    preprocess = PlannedModel(
        python_model(
            f"{contract.name}_preprocess",
            [Tensor("image", "BYTES", (1,))],
            [pixels],
            {"preprocessing": facts["preprocessing"]},
            serving.max_batch_size,
            serving.tokenizer_instances,
            serving.queue_delay_us,
            queue=queue_limits(serving),
        ),
        python_class=f"{BACKEND}.image_preprocessor:ImagePreprocessorModel",
    )
    dim = facts["embedding_dim"]
    network = target.network(
        f"{contract.name}_encode", artifact, "vision", [pixels], [Tensor("embedding", "FP32", (dim,))], serving, {}
    )
    return [
        preprocess,
        network,
        _two_step(contract, preprocess, {"image": "image"}, [pixels.name], network, "embedding", (dim,), serving),
    ]


OCR_DETECT, OCR_CLASSIFY, OCR_RECOGNIZE = "ocr_detect", "ocr_classify", "ocr_recognize"


def _ocr(spec: OcrSpec, artifact: Artifact, target: Target, serving: ServingOptions) -> list[PlannedModel]:
    """The three networks (backend chosen by the target) and the `ocr` pipeline that calls them through BLS."""
    from thinkserve_backend.ocr_settings import CLASSIFIER_SHAPE, RECOGNIZER_HEIGHT, detection_limit

    reading = spec.reading
    image, batch = "image", spec.max_batch_size
    side = detection_limit(reading.max_side)
    widths = reading.recognizer_widths
    # opt shapes: a portrait letter page at ingest's 150 dpi (1275 x 1650, to multiples of 32), crops of 640 pixels
    typical_line = next((w for w in widths if w >= 640), widths[-1])
    cpu = spec.cpu
    networks = [
        OcrNetwork(OCR_DETECT, artifact.file("detector_file"), [Tensor(image, "FP32", (3, -1, -1))],
                   [Tensor("probability", "FP32", (1, -1, -1))], spec.detector_batch,
                   {image: ((1, 3, 32, 32), (1, 3, min(1664, side), min(1280, side)), (spec.detector_batch, 3, side, side))},
                   cpu.detector_instances, 1, cpu.network_threads),
        OcrNetwork(OCR_CLASSIFY, artifact.file("classifier_file"), [Tensor(image, "FP32", (3, *CLASSIFIER_SHAPE))],
                   [Tensor("probabilities", "FP32", (2,))], batch,
                   {image: ((1, 3, *CLASSIFIER_SHAPE), (batch, 3, *CLASSIFIER_SHAPE), (batch, 3, *CLASSIFIER_SHAPE))},
                   1, batch, cpu.network_threads),
        OcrNetwork(OCR_RECOGNIZE, artifact.file("recognizer_file"), [Tensor(image, "FP32", (3, RECOGNIZER_HEIGHT, -1))],
                   [Tensor("classes", "INT32", (-1,)), Tensor("probabilities", "FP32", (-1,)), Tensor("space_probability", "FP32", (-1,))],
                   batch, {image: ((1, 3, RECOGNIZER_HEIGHT, widths[0]), (batch, 3, RECOGNIZER_HEIGHT, typical_line),
                                   (batch, 3, RECOGNIZER_HEIGHT, widths[-1]))},
                   cpu.recognizer_instances, batch, cpu.network_threads),
    ]
    models = [target.ocr_network(network, serving) for network in networks]
    contract = contracts.OCR
    pipeline = python_model(
        contract.name, list(contract.inputs), list(contract.outputs),
        {
            "alphabet_file": "alphabet.json",
            "reading": artifact.facts["reading"],
            "detector_model": OCR_DETECT,
            "classifier_model": OCR_CLASSIFY,
            "recognizer_model": OCR_RECOGNIZE,
            "network_batch": batch,
        },
        batch, spec.pipeline_instances, serving.queue_delay_us, queue=queue_limits(serving),
    )
    files = {"alphabet.json": artifact.file("alphabet_file")}
    return models + [PlannedModel(pipeline, files, f"{BACKEND}.ocr_pipeline:OcrPipelineModel")]


def plan(profile: Profile, artifacts: dict[str, Artifact], target: Target) -> list[PlannedModel]:
    """Every model folder of the repository, for `target`."""
    serving = profile.serving
    embedder, reranker = artifacts["embedder"], artifacts["reranker"]
    models = _text_encoder(
        contracts.TEXT_EMBEDDER, "encode", embedder, "", embedder.facts["inputs"], "embedding",
        embedder.facts["embedding_dim"], target, serving,
    )
    models += _text_encoder(
        contracts.RERANKER, "score", reranker, "", reranker.facts["inputs"], "score", 1, target, serving, pair=True
    )
    if isinstance(profile.router, PromptRouterSpec):
        models.append(target.prompt_router(contracts.ROUTER, artifacts["llm"], profile.router, serving))
    else:
        router = artifacts["router"]
        models += _text_encoder(
            contracts.ROUTER, "classify", router, "", router.facts["inputs"], "probabilities",
            router.facts["output_dim"], target, serving,
        )
    for spec in profile.page_encoders:
        artifact = artifacts[f"page_{spec.family}"]
        models += _text_encoder(
            contracts.page_text_encoder(spec.family), "encode", artifact, "text", artifact.facts["text_inputs"],
            "embedding", artifact.facts["embedding_dim"], target, serving,
        )
        models += _page_image_encoder(spec.family, artifact, target, serving)
    models.append(target.generator(contracts.LLM, artifacts["llm"], serving))
    models.append(target.generator(contracts.VLM, artifacts["vlm"], serving))
    models.append(target.relevance(contracts.VLM_RELEVANCE, artifacts["vlm"], serving))
    if profile.ocr is not None:
        models += _ocr(profile.ocr, artifacts["ocr"], target, serving)
    return models + target.engines(profile, artifacts)


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
            changed |= link_file(source, version / name)
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


def link_file(source: Path, target: Path) -> bool:
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
