"""The Triton installation's two layouts (the PyPI wheel's, a container's /opt/tritonserver) and the check that a
repository's models have their backends there, before any server starts."""

from __future__ import annotations

import sys

import pytest

from orchestrator.errors import TritonSetupError
from orchestrator.triton.installation import TritonInstallation, check_repository

WHEEL_STUB_PYTHON = "%d.%d" % sys.version_info[:2]  # the wheel has a stub for every Python the project runs on


def write_model(repository, name, config, files=("model.py",)):
    folder = repository / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(f'name: "{name}"\n{config}\n')
    for file in files:
        (folder / "1" / file).write_bytes(b"")
    return folder


def container_layout(root, backends=("python", "onnxruntime")):
    """An /opt/tritonserver as NVIDIA's images lay it out: every backend under backends/, the stub beside the
    python backend, no python_backend_stubs/ (files from the wheel, linked)."""
    wheel = TritonInstallation.locate()
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tritonserver").symlink_to(wheel.server_binary)
    for backend in backends:
        (root / "backends" / backend).mkdir(parents=True)
    python = root / "backends" / "python"
    for source in (wheel.python_backend / "libtriton_python.so", wheel.python_backend / "triton_python_backend_utils.py",
                   wheel.stub_for(WHEEL_STUB_PYTHON)):
        (python / source.name).symlink_to(source)
    return root


@pytest.mark.parametrize("config, backend", [
    ('backend: "onnxruntime"', "onnxruntime"),
    ('platform: "onnxruntime_onnx"', "onnxruntime"),
    ('platform: "tensorrt_plan"', "tensorrt"),
    ('backend: "tensorrtllm"', "tensorrtllm"),
])
def test_a_model_whose_backend_the_wheel_lacks_is_named_in_one_line(tmp_path, config, backend):
    repository = tmp_path / "repository"
    write_model(repository, "tokenize", 'backend: "python"')
    write_model(repository, "encoder", config, files=("model.onnx",))
    wheel = TritonInstallation.locate()
    with pytest.raises(TritonSetupError) as refused:
        check_repository(repository, (), wheel)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"model encoder needs Triton's {backend} backend, which {wheel.backends_root} lacks (it has python)")
    assert check_repository(repository, ()) == ["encoder", "tokenize"]  # not checked without an installation


def test_a_container_installation_is_its_own_backend_directory(tmp_path):
    root = container_layout(tmp_path / "tritonserver")
    installation = TritonInstallation.locate(root)
    assert installation.stubs is None and installation.available_backends() == {"python", "onnxruntime"}
    assert installation.backend_directory(tmp_path / "unused", WHEEL_STUB_PYTHON) == root / "backends"
    assert not (tmp_path / "unused").exists()  # nothing assembled: the container's backends stay visible to Triton
    repository = tmp_path / "repository"
    write_model(repository, "encoder", 'platform: "onnxruntime_onnx"', files=("model.onnx",))
    write_model(repository, "ensemble", 'platform: "ensemble"', files=())
    assert check_repository(repository, (), installation) == ["encoder", "ensemble"]
    write_model(repository, "llm", 'backend: "tensorrtllm"', files=())
    with pytest.raises(TritonSetupError, match=r"^model llm needs Triton's tensorrtllm backend, which .*/backends lacks "
                                               r"\(it has onnxruntime, python\)"):
        check_repository(repository, (), installation)


def test_a_container_python_backend_without_its_stub_is_named(tmp_path):
    root = container_layout(tmp_path / "tritonserver")
    (root / "backends" / "python" / "triton_python_backend_stub").unlink()
    with pytest.raises(TritonSetupError, match=f"no python-backend stub for Python {WHEEL_STUB_PYTHON} at .*/backends/python/triton_python_backend_stub"):
        TritonInstallation.locate(root).backend_directory(tmp_path / "unused", WHEEL_STUB_PYTHON)


def test_the_wheel_assembles_python_alone(tmp_path):
    wheel = TritonInstallation.locate()
    assert wheel.stubs is not None and wheel.available_backends() == {"python"}
    folder = wheel.backend_directory(tmp_path / "backends", WHEEL_STUB_PYTHON)
    assert folder == tmp_path / "backends"
    assert sorted(p.name for p in (folder / "python").iterdir()) == [
        "libtriton_python.so", "triton_python_backend_stub", "triton_python_backend_utils.py"]


def test_a_gpu_model_on_a_machine_without_a_gpu_is_named_in_one_line(tmp_path, monkeypatch):
    from orchestrator.triton import installation

    repository = tmp_path / "repository"
    write_model(repository, "encoder", 'backend: "python"\ninstance_group { kind: KIND_GPU count: 1 }')
    monkeypatch.setattr(installation, "gpu_visible", lambda: False)
    with pytest.raises(TritonSetupError) as refused:
        check_repository(repository, ())
    assert "model encoder runs on a GPU" in str(refused.value) and "\n" not in str(refused.value)
    monkeypatch.setattr(installation, "gpu_visible", lambda: True)
    assert check_repository(repository, ()) == ["encoder"]


def test_a_torch_target_model_needs_torch_in_the_model_environment(tmp_path):
    from orchestrator.triton.installation import ModelEnvironment

    repository = tmp_path / "repository"
    write_model(repository, "encoder", 'backend: "python"\nparameters { key: "runtime" value { string_value: "torch" } }')
    without = ModelEnvironment(tmp_path, "3.11", "", optional=frozenset({"transformers"}))
    with pytest.raises(TritonSetupError, match=r"model encoder runs on PyTorch .* lacks torch: install thinkserve-backend\[torch\]"):
        check_repository(repository, (), environment=without)
    with_torch = ModelEnvironment(tmp_path, "3.11", "", optional=frozenset({"torch", "transformers"}))
    assert check_repository(repository, (), environment=with_torch) == ["encoder"]


def test_the_project_model_environment_reports_torch_for_the_torch_target():
    from orchestrator.triton.installation import ModelEnvironment
    from tests.conftest import MODEL_ENVIRONMENT

    assert {"torch", "transformers"} <= ModelEnvironment.inspect(MODEL_ENVIRONMENT).optional


@pytest.mark.parametrize("config, uses_gpu", [
    ('backend: "python"\ninstance_group { kind: KIND_CPU count: 1 }', False),
    ('backend: "python"\ninstance_group { kind: KIND_GPU count: 1 }', True),
    ('backend: "tensorrtllm"\ninstance_group { kind: KIND_CPU count: 1 }', True),  # NVIDIA's template: a CPU instance
    ('backend: "onnxruntime"\noptimization { execution_accelerators { gpu_execution_accelerator { name: "tensorrt" } } }', True),
])
def test_triton_gets_gpu_metrics_and_pinned_memory_only_for_a_repository_with_gpu_models(tmp_path, config, uses_gpu):
    from orchestrator.triton.installation import repository_uses_gpu
    from orchestrator.triton.launcher import gpu_flags

    repository = tmp_path / "repository"
    write_model(repository, "tokenize", 'backend: "python"')
    write_model(repository, "model", config)
    assert repository_uses_gpu(repository) is uses_gpu
    flags = gpu_flags(uses_gpu)
    assert ("--allow-gpu-metrics=true" in flags) is uses_gpu
    assert ("--pinned-memory-pool-byte-size=0" in flags) is not uses_gpu
