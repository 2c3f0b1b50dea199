"""The generated model repositories of every target: every config.pbtxt parses with Triton's schema, the public
models match the orchestrator's contracts, every ensemble is wired to tensors that exist, every queue is bounded."""

import json
import math
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from orchestrator.models import contracts
from orchestrator.models.contracts import all_contracts
from tests.compiler.test_compiler import CACHE
from tests.conftest import ROOT
from thinkserve_build import compiler, profiles
from thinkserve_build.model_config import DATATYPES, parse, schedule
from thinkserve_build.targets import queue_limits

TORCH_REPOSITORY = ROOT / "model_repository" / "tiny-torch"  # `make models-torch`


@pytest.fixture(scope="module")
def gpu_repository(tmp_path_factory) -> Path:
    """The tiny profile for the gpu target, built here (no GPU needed to build it; only to serve it)."""
    output = tmp_path_factory.mktemp("gpu") / "tiny-gpu"
    compiler.compile_repository(profiles.tiny(), output, CACHE, target="gpu", log=lambda _: None)
    return output


@pytest.fixture(scope="module", params=["cpu", "torch", "gpu"])
def repository(request, model_repository) -> Path:
    """The tiny profile's repository for each target."""
    if request.param == "cpu":
        return model_repository
    if request.param == "gpu":
        return request.getfixturevalue("gpu_repository")
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
    surprisal = float(parameters[contracts.JUDGER_SURPRISAL_PARAMETER].string_value)
    assert int(parameters[contracts.CONTEXT_PARAMETER].string_value) > 0 and vocabulary > 1
    assert 0 < threshold < math.log(vocabulary)  # in nats, below the uniform distribution's entropy
    assert 0 < surprisal < 2 * math.log(vocabulary)  # a sampled probe's mean -log p: around the entropy


def test_generators_declare_their_chat_format_and_the_page_filter_its_prompt_in_it(repository):
    configs_by_name = configs(repository)
    for name in (contracts.LLM.name, contracts.VLM.name):
        parameters = configs_by_name[name].parameters
        assert "{% for message in messages %}" in parameters[contracts.CHAT_TEMPLATE_PARAMETER].string_value
        assert json.loads(parameters[contracts.CHAT_TEMPLATE_VARIABLES_PARAMETER].string_value)["eos_token"] == "<|im_end|>"
    prompt = configs_by_name[contracts.VLM_RELEVANCE.name].parameters["relevance_prompt"].string_value
    assert prompt.startswith("<|im_start|>user\n{image}\n") and prompt.endswith("Question: {question}<|im_end|>\n<|im_start|>assistant\n")


def test_no_model_has_a_queue_policy_so_the_dynamic_batcher_prefetches(repository):
    """Any queue policy field turns off tritonserver's batch prefetching, and with it off a burst of requests
    sometimes waits the batcher's 500 ms idle timeout (ServingOptions.max_queue_size): the default writes none."""
    for name, config in configs(repository).items():
        if config.platform != "ensemble":
            assert not config.dynamic_batching.HasField("default_queue_policy"), name
            assert not config.dynamic_batching.priority_levels, name


def test_a_queue_bound_asked_for_is_written_as_tritons_policy():
    serving = profiles.ServingOptions(max_queue_size=256, queue_timeout_ms=5_000)
    config = mc.ModelConfig(name="m", max_batch_size=8)
    schedule(config, serving.queue_delay_us, 1, "cpu", queue_limits(serving))
    policy = config.dynamic_batching.default_queue_policy
    assert (policy.max_queue_size, policy.default_timeout_microseconds) == (256, 5_000_000)
    assert policy.timeout_action == mc.ModelQueuePolicy.REJECT and policy.allow_timeout_override
    bounded_only = queue_limits(profiles.ServingOptions(max_queue_size=256))
    config = mc.ModelConfig(name="m", max_batch_size=8)
    schedule(config, 0, 1, "cpu", bounded_only)
    policy = config.dynamic_batching.default_queue_policy
    assert policy.max_queue_size == 256 and not policy.default_timeout_microseconds and not policy.allow_timeout_override
    assert queue_limits(profiles.ServingOptions()) is None


def test_the_torch_repository_runs_every_network_and_generator_in_pytorch():
    parsed = configs(TORCH_REPOSITORY)
    for name, config in parsed.items():
        if config.platform == "ensemble" or name.endswith(("_tokenize", "_preprocess")) or name.startswith("ocr"):
            continue
        parameters = {key: value.string_value for key, value in config.parameters.items()}
        assert parameters["runtime"] == "torch" and parameters["device"] == "cpu", name
        assert parameters["weights_file"] == "model.safetensors" and "decoder_file" not in parameters, name
        assert [group.kind for group in config.instance_group] == [mc.ModelInstanceGroup.KIND_CPU], name


def encoder_networks(parsed: dict[str, mc.ModelConfig]) -> dict[str, mc.ModelConfig]:
    return {name: config for name, config in parsed.items() if config.backend == "onnxruntime" and not name.startswith("ocr")}


OCR_NETWORKS = ("ocr_detect", "ocr_classify", "ocr_recognize")


@pytest.mark.parametrize("target", ["cpu", "torch"])
def test_the_python_targets_run_the_ocr_graphs_in_onnxruntime_batching_equal_shapes_only(target, model_repository):
    """PaddleOCR ships no PyTorch definition of its networks: both python targets run its ONNX graphs; padding a
    crop changes what the recogniser reads, so requests of different shapes share an execute (ragged) and the
    model runs a call per shape. Pages overlap on instances of their own, each network on one thread, the
    detector a page per call."""
    parsed = configs(model_repository if target == "cpu" else TORCH_REPOSITORY)
    spec = profiles.OcrSpec(profiles.PP_OCR_V4)
    for name in OCR_NETWORKS:
        config = parsed[name]
        variable = [t for t in config.input if -1 in t.dims]
        assert config.backend == "python" and all(t.allow_ragged_batch for t in variable), name
        assert config.parameters["batch"].string_value == "equal_shapes", name
        assert config.parameters["onnx_file"].string_value.endswith(".onnx"), name
        assert config.parameters["intra_op_threads"].string_value == str(spec.cpu.network_threads), name
    assert parsed["ocr_detect"].max_batch_size == 1
    assert parsed["ocr_detect"].instance_group[0].count == spec.cpu.detector_instances
    assert parsed["ocr_recognize"].instance_group[0].count == spec.cpu.recognizer_instances
    pipeline = parsed["ocr"]
    assert pipeline.backend == "python" and [t.name for t in pipeline.output] == ["text", "boxes", "confidence"]
    assert pipeline.instance_group[0].count == spec.pipeline_instances
    assert {pipeline.parameters[key].string_value for key in ("detector_model", "classifier_model", "recognizer_model")} == set(OCR_NETWORKS)


def test_the_gpu_repository_serves_the_ocr_graphs_on_onnxruntime_with_tensorrt_profiles(gpu_repository):
    parsed = configs(gpu_repository)
    reading = json.loads(parsed["ocr"].parameters["reading"].string_value)
    widths = reading["recognizer_widths"]
    expected_max = {
        "ocr_detect": "image:4x3x2016x2016",  # the detector's input never exceeds max_side (2000, to a multiple of 32)
        "ocr_classify": "image:16x3x48x192",
        "ocr_recognize": f"image:16x3x48x{widths[-1]}",
    }
    for name, maximum in expected_max.items():
        config = parsed[name]
        assert config.backend == "onnxruntime" and [g.kind for g in config.instance_group] == [mc.ModelInstanceGroup.KIND_GPU]
        assert not any(t.allow_ragged_batch for t in config.input), name
        (accelerator,) = config.optimization.execution_accelerators.gpu_execution_accelerator
        assert accelerator.name == "tensorrt" and accelerator.parameters["precision_mode"] == "FP16"
        assert accelerator.parameters["trt_profile_max_shapes"] == maximum, name
        assert {key for sample in config.model_warmup for key in sample.inputs} == {"image"}, name
    assert parsed["ocr_recognize"].optimization.execution_accelerators.gpu_execution_accelerator[0].parameters[
        "trt_profile_min_shapes"] == f"image:1x3x48x{widths[0]}"
    assert parsed["ocr"].backend == "python" and [g.kind for g in parsed["ocr"].instance_group] == [mc.ModelInstanceGroup.KIND_CPU]


def test_the_gpu_repository_serves_fp16_encoders_on_onnxruntime_with_tensorrt(gpu_repository):
    import onnx

    parsed = configs(gpu_repository)
    networks = encoder_networks(parsed)
    assert len(networks) == 9  # embedder, reranker, router, three text and three image towers
    for name, config in networks.items():
        assert [group.kind for group in config.instance_group] == [mc.ModelInstanceGroup.KIND_GPU], name
        assert not any(tensor.allow_ragged_batch for tensor in config.input), name  # buckets, not ragged batches
        (accelerator,) = config.optimization.execution_accelerators.gpu_execution_accelerator
        assert accelerator.name == "tensorrt" and accelerator.parameters["precision_mode"] == "FP16", name
        assert accelerator.parameters["trt_engine_cache_enable"] == "1", name
        inputs = {t.name for t in config.input}
        for bound in ("min", "opt", "max"):
            shapes = dict(part.split(":") for part in accelerator.parameters[f"trt_profile_{bound}_shapes"].split(","))
            assert set(shapes) == inputs, (name, bound)
        warmed = {key for sample in config.model_warmup for key in sample.inputs}
        assert warmed == inputs, name
        graph = onnx.load(str(gpu_repository / name / "1" / "model.onnx"), load_external_data=False)
        kinds = {init.data_type for init in graph.graph.initializer if init.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)}
        assert onnx.TensorProto.FLOAT16 in kinds, name
    # the text towers' shortest bucket is the profiles' minimum; the longest their max_length
    shapes = networks["text_embedder_encode"].optimization.execution_accelerators.gpu_execution_accelerator[0].parameters
    assert "input_ids:1x16" in shapes["trt_profile_min_shapes"] and "input_ids:32x256" in shapes["trt_profile_max_shapes"]
    for name, config in parsed.items():
        if name.endswith("_tokenize"):
            assert json.loads(config.parameters["pad_to_buckets"].string_value)[0] == 16, name


def test_the_gpu_repository_declares_the_engine_tensors_the_adapter_sends(gpu_repository):
    recorded = json.loads((ROOT / "tests" / "backend" / "trtllm_recorded" / "tensorrt_llm_config.json").read_text())
    parsed = configs(gpu_repository)
    for engine in ("llm_engine", "vlm_engine"):
        config = parsed[engine]
        assert config.backend == "tensorrtllm" and config.model_transaction_policy.decoupled
        # data type, dims and reshape, as the backend's template has them (a missing reshape fails batched calls)
        declared = {t.name: (mc.DataType.Name(t.data_type), list(t.dims), list(t.reshape.shape) if t.HasField("reshape") else None)
                    for t in config.input}
        expected = {name: (t["data_type"], t["dims"], t.get("reshape")) for name, t in recorded["inputs"].items()}
        if engine == "llm_engine":
            expected = {name: value for name, value in expected.items() if not name.startswith("prompt_")}
        else:
            expected["prompt_embedding_table"] = ("TYPE_BF16", [-1, -1], None)  # the engine's dtype: bfloat16
        assert declared["input_lengths"][2] == [] and declared["request_output_len"][2] == []
        assert declared == expected, engine
        outputs = {t.name: (mc.DataType.Name(t.data_type), list(t.dims)) for t in config.output}
        assert outputs == {name: (t["data_type"], t["dims"]) for name, t in recorded["outputs"].items()}, engine
        assert config.parameters["gpt_model_path"].string_value == f"/engines/{engine.removesuffix('_engine')}"
        # KV blocks are reused across requests on the LLM's engine only: the VLM's image placeholders look alike
        reuse = config.parameters["enable_kv_cache_reuse"].string_value
        assert reuse == ("true" if engine == "llm_engine" else "false"), (engine, reuse)
    for adapter, engine in (("llm", "llm_engine"), ("vlm", "vlm_engine"), ("vlm_relevance", "vlm_engine")):
        parameters = parsed[adapter].parameters
        assert parameters["engine_model"].string_value == engine, adapter
        assert (gpu_repository / adapter / "1" / "model.py").read_text().count("trtllm_adapter") == 2, adapter
    # Logits (the vocabulary per token) only for requests that want entropies; the surprisal judger's threshold too
    for generator in ("llm", "vlm"):
        assert parsed[generator].parameters["generation_logits"].string_value == "false", generator
    surprisal = float(parsed["llm"].parameters[contracts.JUDGER_SURPRISAL_PARAMETER].string_value)
    assert 0 < surprisal < math.log(int(parsed["llm"].parameters[contracts.VOCABULARY_PARAMETER].string_value))
    assert parsed["vlm"].parameters["vision_model"].string_value == "vlm_image_features"
    features = parsed["vlm_image_features"]
    assert features.parameters["runtime"].string_value == "torch" and features.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU


BACKEND_PARAMETERS = json.loads((ROOT / "tests" / "backend" / "trtllm_recorded" / "backend_parameters.json").read_text())


def test_the_engine_configs_set_what_the_tensorrtllm_backend_requires_and_only_what_it_reads(gpu_repository):
    """Every parameter the backend's sources read without a fallback is set (a missing one fails the model's load),
    none it refuses, none it ignores (a misspelt name would be silently dropped), each value one it accepts."""
    facts = BACKEND_PARAMETERS["tensorrtllm"]
    engines = {name: config for name, config in configs(gpu_repository).items() if config.backend == "tensorrtllm"}
    assert set(engines) == {"llm_engine", "vlm_engine"}
    for name, config in engines.items():
        values = {key: parameter.string_value for key, parameter in config.parameters.items()}
        assert not set(facts["required"]) - set(values), (name, set(facts["required"]) - set(values))
        assert not set(facts["forbidden"]) & set(values), name
        assert not set(values) - set(facts["known"]), (name, set(values) - set(facts["known"]))
        for key, allowed in facts["values"].items():
            if key in values:
                assert values[key] in allowed, (name, key, values[key])
        for key in facts["booleans"]:
            if key in values:
                assert values[key] in facts["boolean_values"], (name, key, values[key])
        for key in facts["numbers"]["float"]:
            if key in values:
                float(values[key])
        for key in facts["numbers"]["int"]:
            if key in values:
                int(values[key])


def test_the_tensorrt_accelerators_set_only_parameters_the_onnxruntime_backend_accepts(gpu_repository):
    facts = BACKEND_PARAMETERS["onnxruntime_tensorrt_accelerator"]
    accelerated = 0
    for name, config in configs(gpu_repository).items():
        for accelerator in config.optimization.execution_accelerators.gpu_execution_accelerator:
            assert config.backend == "onnxruntime" and accelerator.name in facts["accelerators"], name
            accelerated += 1
            assert not set(accelerator.parameters) - set(facts["known"]), (name, set(accelerator.parameters) - set(facts["known"]))
            assert accelerator.parameters["precision_mode"] in facts["precision_mode"], name
    assert accelerated >= 9  # the encoders and the OCR graphs


def test_the_gpu_repository_writes_the_engine_build_beside_it(gpu_repository):
    import subprocess

    engines = gpu_repository.with_name(gpu_repository.name + ".engines")
    for folder in ("llm", "vlm"):
        assert (engines / "checkpoints" / folder / "model.safetensors").is_file()
        handed = json.loads((engines / "checkpoints" / folder / "config.json").read_text())
        assert handed["model_type"] == "qwen2"
        # the RoPE base where TensorRT-LLM 0.20's converter reads it (tests/compiler/test_trtllm_engines.py)
        assert handed["rope_theta"] == handed.get("rope_parameters", handed)["rope_theta"], folder
    script = engines / "build_engines.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    assert text.count("trtllm-build --checkpoint_dir") == 2 and "--gather_generation_logits" in text
    assert text.count("\ncheck_rope ") == 2 and "check_engines.py\" names" in text  # one RoPE check per engine
    assert "cold=$(start_once cold)" in text and "warm=$(start_once warm)" in text  # encoders' engines built here
    assert text.count("--use_paged_context_fmha enable") == 2  # chunked context and KV reuse need it
    assert "--max_prompt_embedding_table_size" in text.split("vlm: converting")[1]
    outside = subprocess.run(["bash", str(script)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert outside.returncode == 1 and "trtllm-build is not on PATH" in outside.stderr.strip()
