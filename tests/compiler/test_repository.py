"""The generated model repositories of every target: every config.pbtxt parses with Triton's schema, the public
models match the orchestrator's contracts, every ensemble is wired to tensors that exist, every queue is bounded."""

import json
import math
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from orchestrator.triton import contracts
from orchestrator.triton.contracts import all_contracts
from tests.conftest import ROOT
from thinkserve_build.model_config import DATATYPES, parse

TORCH_REPOSITORY = ROOT / "model_repository" / "tiny-torch"  # `make models-torch`


@pytest.fixture(scope="module", params=["cpu", "torch"])
def repository(request, model_repository) -> Path:
    """The tiny profile's repository for each target."""
    if request.param == "cpu":
        return model_repository
    if not (TORCH_REPOSITORY / "llm" / "config.pbtxt").is_file():
        pytest.fail(f"{TORCH_REPOSITORY} is not built: run `make models-torch` (make test does it)")
    return TORCH_REPOSITORY


def configs(repository: Path) -> dict[str, mc.ModelConfig]:
    return {folder.name: parse((folder / "config.pbtxt").read_text()) for folder in sorted(repository.iterdir()) if folder.is_dir()}


def test_every_config_parses_with_tritons_schema_and_names_its_folder(repository):
    parsed = configs(repository)
    assert len(parsed) >= 20
    for name, config in parsed.items():
        assert config.name == name
        assert config.platform == "ensemble" or config.backend in ("python", "onnxruntime", "tensorrtllm")


def test_a_malformed_config_is_rejected_by_the_parser():
    with pytest.raises(Exception, match="no field named \"max_batch\""):
        parse('name: "x" max_batch: 4')


@pytest.mark.parametrize("contract", all_contracts(), ids=lambda c: c.name)
def test_public_models_carry_the_contracts_tensors(repository, contract):
    config = configs(repository)[contract.name]
    assert config.model_transaction_policy.decoupled == contract.decoupled
    assert config.max_batch_size > 0
    for expected, actual in ((contract.inputs, config.input), (contract.outputs, config.output)):
        by_name = {t.name: t for t in actual}
        assert set(by_name) == {t.name for t in expected}
        for tensor in expected:
            assert by_name[tensor.name].data_type == DATATYPES[tensor.datatype]
            assert len(by_name[tensor.name].dims) == len(tensor.dims)
            assert all(want in (-1, got) for want, got in zip(tensor.dims, by_name[tensor.name].dims))


def test_every_batchable_model_has_dynamic_batching(repository):
    for name, config in configs(repository).items():
        if config.platform != "ensemble":
            assert config.HasField("dynamic_batching"), name
            assert config.instance_group[0].count >= 1


def test_ensembles_only_use_tensors_their_steps_declare(repository):
    parsed = configs(repository)
    for name, config in parsed.items():
        if config.platform != "ensemble":
            continue
        available = {t.name for t in config.input}
        for step in config.ensemble_scheduling.step:
            model = parsed[step.model_name]
            assert set(step.input_map) <= {t.name for t in model.input}, (name, step.model_name)
            assert set(step.input_map.values()) <= available, (name, step.model_name)
            assert set(step.output_map) <= {t.name for t in model.output}, (name, step.model_name)
            available |= set(step.output_map.values())
        assert {t.name for t in config.output} <= available, name


def test_python_models_have_their_code_and_files(repository):
    for name, config in configs(repository).items():
        if config.backend != "python":
            continue
        version = repository / name / "1"
        assert "as TritonPythonModel" in (version / "model.py").read_text()
        for key, value in config.parameters.items():
            if key.endswith("_file"):
                assert (version / value.string_value).is_file(), (name, key)


def test_the_llm_declares_its_context_vocabulary_and_calibrated_judger_threshold(repository):
    parameters = configs(repository)[contracts.LLM.name].parameters
    vocabulary = int(parameters[contracts.VOCABULARY_PARAMETER].string_value)
    threshold = float(parameters[contracts.JUDGER_THRESHOLD_PARAMETER].string_value)
    assert int(parameters[contracts.CONTEXT_PARAMETER].string_value) > 0 and vocabulary > 1
    assert 0 < threshold < math.log(vocabulary)  # in nats, below the uniform distribution's entropy


def test_generators_declare_their_chat_format_and_the_page_filter_its_prompt_in_it(repository):
    configs_by_name = configs(repository)
    for name in (contracts.LLM.name, contracts.VLM.name):
        parameters = configs_by_name[name].parameters
        assert "{% for message in messages %}" in parameters[contracts.CHAT_TEMPLATE_PARAMETER].string_value
        assert json.loads(parameters[contracts.CHAT_TEMPLATE_VARIABLES_PARAMETER].string_value)["eos_token"] == "<|im_end|>"
    prompt = configs_by_name[contracts.VLM_RELEVANCE.name].parameters["relevance_prompt"].string_value
    assert prompt.startswith("<|im_start|>user\n{image}\n") and prompt.endswith("Question: {question}<|im_end|>\n<|im_start|>assistant\n")


def test_every_model_queue_is_bounded(repository):
    for name, config in configs(repository).items():
        if config.platform != "ensemble":
            policy = config.dynamic_batching.default_queue_policy
            assert policy.max_queue_size > 0 and policy.default_timeout_microseconds > 0, name
            assert policy.timeout_action == mc.ModelQueuePolicy.REJECT and policy.allow_timeout_override, name


def test_the_torch_repository_runs_every_network_and_generator_in_pytorch():
    parsed = configs(TORCH_REPOSITORY)
    for name, config in parsed.items():
        if config.platform == "ensemble" or name.endswith(("_tokenize", "_preprocess")):
            continue
        parameters = {key: value.string_value for key, value in config.parameters.items()}
        assert parameters["runtime"] == "torch" and parameters["device"] == "cpu", name
        assert parameters["weights_file"] == "model.safetensors" and "decoder_file" not in parameters, name
        assert [group.kind for group in config.instance_group] == [mc.ModelInstanceGroup.KIND_CPU], name
