"""The generated model repository: every config.pbtxt parses with Triton's schema, the public models match
the orchestrator's contracts, and every ensemble is wired to tensors that exist."""

import json
import math
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from orchestrator.triton import contracts
from orchestrator.triton.contracts import all_contracts
from thinkserve_build.model_config import DATATYPES, parse


def configs(repository: Path) -> dict[str, mc.ModelConfig]:
    return {folder.name: parse((folder / "config.pbtxt").read_text()) for folder in sorted(repository.iterdir()) if folder.is_dir()}


def test_every_config_parses_with_tritons_schema_and_names_its_folder(model_repository):
    parsed = configs(model_repository)
    assert len(parsed) >= 20
    for name, config in parsed.items():
        assert config.name == name
        assert config.platform == "ensemble" or config.backend == "python"


def test_a_malformed_config_is_rejected_by_the_parser():
    with pytest.raises(Exception, match="no field named \"max_batch\""):
        parse('name: "x" max_batch: 4')


@pytest.mark.parametrize("contract", all_contracts(), ids=lambda c: c.name)
def test_public_models_carry_the_contracts_tensors(model_repository, contract):
    config = configs(model_repository)[contract.name]
    assert config.model_transaction_policy.decoupled == contract.decoupled
    assert config.max_batch_size > 0
    for expected, actual in ((contract.inputs, config.input), (contract.outputs, config.output)):
        by_name = {t.name: t for t in actual}
        assert set(by_name) == {t.name for t in expected}
        for tensor in expected:
            assert by_name[tensor.name].data_type == DATATYPES[tensor.datatype]
            assert len(by_name[tensor.name].dims) == len(tensor.dims)
            assert all(want in (-1, got) for want, got in zip(tensor.dims, by_name[tensor.name].dims))


def test_every_batchable_model_has_dynamic_batching(model_repository):
    for name, config in configs(model_repository).items():
        if config.platform != "ensemble":
            assert config.HasField("dynamic_batching"), name
            assert config.instance_group[0].count >= 1


def test_ensembles_only_use_tensors_their_steps_declare(model_repository):
    parsed = configs(model_repository)
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


def test_python_models_have_their_code_and_files(model_repository):
    for name, config in configs(model_repository).items():
        if config.backend != "python":
            continue
        version = model_repository / name / "1"
        assert "as TritonPythonModel" in (version / "model.py").read_text()
        for key, value in config.parameters.items():
            if key.endswith("_file"):
                assert (version / value.string_value).is_file(), (name, key)


def test_the_llm_declares_its_context_vocabulary_and_calibrated_judger_threshold(model_repository):
    parameters = configs(model_repository)[contracts.LLM.name].parameters
    vocabulary = int(parameters[contracts.VOCABULARY_PARAMETER].string_value)
    threshold = float(parameters[contracts.JUDGER_THRESHOLD_PARAMETER].string_value)
    assert int(parameters[contracts.CONTEXT_PARAMETER].string_value) > 0 and vocabulary > 1
    assert 0 < threshold < math.log(vocabulary)  # in nats, below the uniform distribution's entropy


def test_generators_declare_their_chat_format_and_the_page_filter_its_prompt_in_it(model_repository):
    configs_by_name = configs(model_repository)
    for name in (contracts.LLM.name, contracts.VLM.name):
        parameters = configs_by_name[name].parameters
        assert "{% for message in messages %}" in parameters[contracts.CHAT_TEMPLATE_PARAMETER].string_value
        assert json.loads(parameters[contracts.CHAT_TEMPLATE_VARIABLES_PARAMETER].string_value)["eos_token"] == "<|im_end|>"
    prompt = configs_by_name[contracts.VLM_RELEVANCE.name].parameters["relevance_prompt"].string_value
    assert prompt.startswith("<|im_start|>user\n{image}\n") and prompt.endswith("Question: {question}<|im_end|>\n<|im_start|>assistant\n")
