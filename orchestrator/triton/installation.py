"""Finding tritonserver and checking, before it starts, everything that would make it fail obscurely.

Each check ends in a one-line TritonSetupError naming the cause: no binary, no python-backend stub for the
model environment's Python, numpy 2 in the model environment (silently corrupts tensors), missing packages,
a model folder or file the repository lacks, a model whose backend the installation does not have (a repository
built for another target: TensorRT plans or TensorRT-LLM engines served by a Triton without those backends).

Two layouts are known. The PyPI wheel (nvidia-pytriton) holds the python backend without its stub and the stubs
for every Python apart: the launcher assembles a backend directory holding python/ alone. NVIDIA's containers
(/opt/tritonserver) hold every backend they ship under backends/, the stub beside the python backend: that folder
itself is the backend directory, so the container's onnxruntime, TensorRT or TensorRT-LLM backends stay visible.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from ..errors import TritonSetupError
from ..models.contracts import ModelContract

CONTAINER_ROOT = Path("/opt/tritonserver")  # NVIDIA's Triton containers
# Packages only the torch target's python models import (thinkserve-backend's `torch` extra).
OPTIONAL_PACKAGES = ("torch", "transformers")
TORCH_RUNTIME_NEEDS = frozenset(OPTIONAL_PACKAGES)

# The backend each of Triton's `platform` names runs on (a config names a backend or a platform).
PLATFORM_BACKENDS = {
    "tensorrt_plan": "tensorrt",
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorflow_graphdef": "tensorflow",
    "tensorflow_savedmodel": "tensorflow",
}


@dataclass(frozen=True)
class TritonInstallation:
    server_binary: Path
    python_backend: Path  # folder with libtriton_python.so and triton_python_backend_utils.py
    stubs: Optional[Path]  # python_backend_stubs/<major.minor>/ (the PyPI wheel); None when the stub sits in python_backend

    @property
    def backends_root(self) -> Path:
        """The installation's own backends/ folder (python/, and in a container onnxruntime/, tensorrt/, ...)."""
        return self.python_backend.parent

    def available_backends(self) -> frozenset[str]:
        """The backends a server started by the launcher can load: the wheel's assembled directory holds python/
        alone; a container's backends/ holds a folder per backend it ships."""
        if self.stubs is not None:
            return frozenset({"python"})
        return frozenset(p.name for p in self.backends_root.iterdir() if p.is_dir())

    @classmethod
    def locate(cls, install_root: Optional[Path] = None) -> "TritonInstallation":
        roots = [install_root] if install_root else [_wheel_root(), CONTAINER_ROOT]
        for root in filter(None, roots):
            binary = root / "bin" / "tritonserver"
            if binary.is_file():
                stubs = root / "python_backend_stubs"
                return cls(binary, root / "backends" / "python", stubs if stubs.is_dir() else None)
        where = install_root or "the nvidia-pytriton wheel or /opt/tritonserver"
        raise TritonSetupError(f"tritonserver not found in {where}: run `make setup` (installs nvidia-pytriton)")

    def stub_for(self, python_version: str) -> Path:
        stub = (
            self.stubs / python_version / "triton_python_backend_stub"
            if self.stubs
            else self.python_backend / "triton_python_backend_stub"
        )
        if not stub.is_file():
            available = sorted(p.name for p in self.stubs.iterdir()) if self.stubs else []
            raise TritonSetupError(
                f"no python-backend stub for Python {python_version} at {stub}"
                + (f" (stubs exist for {', '.join(available)})" if available else "")
            )
        return stub

    def backend_directory(self, folder: Path, python_version: str) -> Path:
        """--backend-directory. A container's: its own backends/, checked to hold the python backend whole. The
        wheel's: assembled in `folder`, since python/ needs the backend library, its utils AND the stub side by
        side and the wheel keeps the stub apart."""
        if self.stubs is None:
            for source in (self.python_backend / "libtriton_python.so", self.python_backend / "triton_python_backend_utils.py"):
                if not source.is_file():
                    raise TritonSetupError(f"Triton's python backend is incomplete: {source} is missing")
            self.stub_for(python_version)
            return self.backends_root
        target = folder / "python"
        target.mkdir(parents=True, exist_ok=True)
        for source in (
            self.python_backend / "libtriton_python.so",
            self.python_backend / "triton_python_backend_utils.py",
            self.stub_for(python_version),
        ):
            if not source.is_file():
                raise TritonSetupError(f"Triton's python backend is incomplete: {source} is missing")
            link = target / source.name
            if not link.exists():
                link.symlink_to(source)
        return folder


def _wheel_root() -> Optional[Path]:
    spec = importlib.util.find_spec("pytriton")  # found, never imported: only the wheel's files are used
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "tritonserver"


@dataclass(frozen=True)
class ModelEnvironment:
    """The Python environment Triton's stubs run in."""

    prefix: Path
    python_version: str
    libdir: str
    optional: frozenset[str] = frozenset()  # of OPTIONAL_PACKAGES, those it has (the torch target's models need them)

    @property
    def bin_dir(self) -> Path:
        return self.prefix / "bin"

    @classmethod
    def inspect(cls, prefix: Path) -> "ModelEnvironment":
        python = prefix / "bin" / "python3"
        if not python.exists():
            raise TritonSetupError(f"model environment {prefix} has no bin/python3: run `make setup`")
        probe = (
            "import json, sys, sysconfig\n"
            "facts = {'python': '%d.%d' % sys.version_info[:2], 'libdir': sysconfig.get_config_var('LIBDIR'), 'missing': []}\n"
            "for name in ('numpy', 'onnxruntime', 'tokenizers', 'PIL', 'thinkserve_backend'):\n"
            "    try:\n"
            "        module = __import__(name)\n"
            "        facts[name] = getattr(module, '__version__', '')\n"
            "    except Exception as error:\n"
            "        facts['missing'].append(f'{name} ({error})')\n"
            "import importlib.util\n"
            f"facts['optional'] = [n for n in {OPTIONAL_PACKAGES!r} if importlib.util.find_spec(n)]\n"
            "print(json.dumps(facts))\n"
        )
        try:
            result = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=120)
            facts = json.loads(result.stdout.strip().splitlines()[-1])
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as error:
            raise TritonSetupError(f"cannot run the model environment's Python {python}: {error}") from None
        if facts["missing"]:
            raise TritonSetupError(f"model environment {prefix} lacks {', '.join(facts['missing'])}: run `make setup`")
        numpy_major = int(facts["numpy"].split(".")[0])
        if numpy_major >= 2:
            raise TritonSetupError(
                f"model environment {prefix} has numpy {facts['numpy']}; Triton's python-backend stub needs numpy<2 "
                "(with numpy 2 it silently corrupts tensors)"
            )
        return cls(prefix.absolute(), facts["python"], facts["libdir"], frozenset(facts["optional"]))


def check_repository(
    repository: Path, required: tuple[ModelContract, ...], installation: Optional[TritonInstallation] = None,
    environment: Optional[ModelEnvironment] = None,
) -> list[str]:
    """Fail early on a repository that cannot serve `required` (or, given the installation, whose models need a
    backend it lacks; given the model environment, whose torch-target models need packages it lacks; or whose
    models want a GPU on a machine without one); returns every model folder's name."""
    if not repository.is_dir():
        raise TritonSetupError(f"model repository {repository} does not exist: run `make models`")
    names = sorted(p.name for p in repository.iterdir() if (p / "config.pbtxt").is_file())
    missing = [c.name for c in required if c.name not in names]
    if missing:
        raise TritonSetupError(f"model repository {repository} lacks models {', '.join(missing)}: run `make models`")
    backends = None if installation is None else (installation.backends_root, installation.available_backends())
    for name in names:
        _check_model_folder(repository / name, backends, environment)
    return names


def gpu_visible() -> bool:
    """Whether this machine has an NVIDIA GPU for Triton's KIND_GPU instances (the driver's device nodes)."""
    return Path("/dev/nvidiactl").exists() or Path("/proc/driver/nvidia/gpus").is_dir()


def repository_uses_gpu(repository: Path) -> bool:
    """Whether any model of the repository runs on a GPU: KIND_GPU instances, a TensorRT accelerator, or the
    TensorRT-LLM backend (whose instances are KIND_CPU by NVIDIA's template while its engine runs on the GPU)."""
    for path in sorted(repository.glob("*/config.pbtxt")):
        try:
            config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
        except text_format.ParseError:
            continue  # check_repository names it
        if (config.backend == "tensorrtllm" or config.optimization.execution_accelerators.gpu_execution_accelerator
                or any(group.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU for group in config.instance_group)):
            return True
    return False


def model_backend(config: model_config_pb2.ModelConfig) -> Optional[str]:
    """The backend a model config runs on: its `backend`, else the one its `platform` maps to; None for an
    ensemble (Triton's core runs it) or a platform this module does not know (Triton decides)."""
    return config.backend or PLATFORM_BACKENDS.get(config.platform)


def _check_model_folder(
    folder: Path, backends: Optional[tuple[Path, frozenset[str]]], environment: Optional[ModelEnvironment] = None
) -> None:
    """backends: the installation's backends folder and the backends it has (None: not checked)."""
    try:
        config = text_format.Parse((folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    except text_format.ParseError as error:
        raise TritonSetupError(f"model {folder.name}: config.pbtxt does not parse: {error}") from None
    if config.platform == "ensemble":
        return
    backend = model_backend(config)
    if backends is not None and backend is not None:
        root, available = backends
        if backend not in available:
            raise TritonSetupError(
                f"model {folder.name} needs Triton's {backend} backend, which {root} lacks "
                f"(it has {', '.join(sorted(available)) or 'none'}): serve this repository with a Triton that has it, "
                "or build the repository for this installation's target"
            )
    if any(group.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU for group in config.instance_group) and not gpu_visible():
        raise TritonSetupError(
            f"model {folder.name} runs on a GPU (KIND_GPU instances) and this machine has none: serve this repository on a "
            "GPU machine, or build it for the CPU (thinkserve-build --target cpu, or --target torch --device cpu)"
        )
    runtime = config.parameters["runtime"].string_value if "runtime" in config.parameters else ""
    if environment is not None and runtime == "torch":
        lacking = TORCH_RUNTIME_NEEDS - environment.optional
        if lacking:
            raise TritonSetupError(
                f"model {folder.name} runs on PyTorch (the torch target) and the model environment {environment.prefix} "
                f"lacks {', '.join(sorted(lacking))}: install thinkserve-backend[torch] there (make setup does)"
            )
    versions = [p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()]
    if not versions:
        raise TritonSetupError(f"model {folder.name} has no version folder (e.g. {folder.name}/1)")
    if config.backend == "python":
        for version in versions:
            needed = ["model.py"] + [
                p.string_value for key, p in config.parameters.items() if key.endswith("_file")
            ]
            for name in needed:
                if not (version / name).is_file():
                    raise TritonSetupError(f"model {folder.name}: file {version.name}/{name} is missing")
