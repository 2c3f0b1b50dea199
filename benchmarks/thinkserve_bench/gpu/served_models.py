"""The model repository the GPU runner measures: its models' configs and parameters, which networks and models the
parts need, the copy of those folders Triton serves, and the device and dtype a served instance runs on."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional, TYPE_CHECKING, Sequence

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from orchestrator.models import contracts

from ..result_files import read_json

if TYPE_CHECKING:
    from .options import Options

NETWORK_SUFFIXES = ("_encode", "_score", "_classify")


def read_config(repository: Path, model: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse((repository / model / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


def parameters(config: model_config_pb2.ModelConfig) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


def model_names(repository: Path) -> list[str]:
    return sorted(p.name for p in repository.iterdir() if (p / "config.pbtxt").is_file())


def encoder_networks(repository: Path) -> list[str]:
    """The repository's networks of the torch target (what a `network` parameter names), encoders first."""
    names = []
    for name in model_names(repository):
        if name.endswith(NETWORK_SUFFIXES) and "network" in parameters(read_config(repository, name)):
            names.append(name)
    return names


def public_name(network: str) -> str:
    for suffix in NETWORK_SUFFIXES:
        if network.endswith(suffix):
            return network[: -len(suffix)]
    return network


def with_steps(repository: Path, names: Sequence[str]) -> set[str]:
    """`names` and every model their ensembles call (transitively)."""
    wanted, pending = set(), list(names)
    while pending:
        name = pending.pop()
        if name in wanted or not (repository / name / "config.pbtxt").is_file():
            continue
        wanted.add(name)
        pending += [step.model_name for step in read_config(repository, name).ensemble_scheduling.step]
    return wanted


def recorded_models(cost: dict, config: str) -> set[str]:
    """The public models a cost run's series called."""
    return {u["model"] for r in cost["result"]["configs"][config]["records"] for u in r.get("usage", [])}


def models_for(repository: Path, options: "Options") -> list[str]:
    """The model folders Triton must load for the parts (with the steps of the ensembles they call): the networks
    measured, the embedder's ensemble (the round-trip check), the generators, the models the replayed run called."""
    wanted = {contracts.TEXT_EMBEDDER.name}
    if "encoders" in options.parts:
        wanted |= set(measured_networks(repository, options))
    if "generators" in options.parts:
        wanted |= {name for name in (contracts.LLM.name, contracts.VLM.name) if name in options.generators}
    if "mix" in options.parts:
        wanted |= recorded_models(read_json(options.cost), options.cost_config)
    if "e2e" in options.parts:  # the orchestrator's every model (the repository is built without OCR's)
        wanted |= {c.name for c in contracts.all_contracts() if c.name != contracts.OCR.name}
    return sorted(with_steps(repository, sorted(wanted)))


def measured_networks(repository: Path, options: "Options") -> list[str]:
    networks = encoder_networks(repository)
    return [n for n in networks if n in options.networks] if options.networks else networks


def serving_repository(repository: Path, models: Sequence[str], destination: Path,
                       parameters: Optional[dict[str, dict[str, str]]] = None) -> Path:
    """A repository of `models` alone: their folders hard-linked (nothing copied), so Triton loads only those;
    `parameters`: per model, config parameters set in its copy (the runner's diagnostics, e.g. stage_timing)."""
    shutil.rmtree(destination, ignore_errors=True)
    destination.mkdir(parents=True)
    for model in models:
        if parameters and model in parameters:
            renamed_copy(repository, model, destination, model, parameters[model])
            continue
        shutil.copytree(repository / model, destination / model, copy_function=_link,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return destination


def renamed_copy(repository: Path, model: str, destination: Path, name: str, overrides: dict[str, str]) -> Path:
    """Model `model` served again as `name` with some parameters changed (e.g. its scheduling), its files
    hard-linked; the config is written afresh, never through a link into the built repository."""
    target = destination / name
    shutil.copytree(repository / model, target, copy_function=_link, ignore=shutil.ignore_patterns("__pycache__"))
    config = read_config(repository, model)
    config.name = name
    for key, value in overrides.items():
        config.parameters[key].string_value = value
    (target / "config.pbtxt").unlink()
    (target / "config.pbtxt").write_text(text_format.MessageToString(config))
    return target


def _link(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def torch_device(device: str):
    """What a served model instance gets: cuda:0 in bf16, or the CPU in fp32 (thinkserve_backend.torch_modules)."""
    from thinkserve_backend.torch_modules import device_and_dtype

    return device_and_dtype("cuda:0" if device == "cuda" else "cpu")
