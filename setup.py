"""Packaging hooks that pyproject.toml cannot express.

1. The gRPC/protobuf code is generated from proto/ whenever setuptools runs (wheel, sdist, editable install),
   before package discovery, so the modules always match the grpcio-tools/protobuf pins in pyproject's
   build requirements.
2. The model compiler's package, thinkserve_build, lives in compiler/ (its name cannot shadow PyPA's `build`); the
   benchmarks' package, thinkserve_bench, lives in benchmarks/ beside its results (benchmarks/results/, not installed).
"""

import re
import tempfile
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent.resolve()
PROTO_ROOT = ROOT / "proto"
PROTO_FILE = "thinkserve/v1/orchestrator.proto"
GENERATED = ROOT / "orchestrator" / "api" / "_generated"


def generate_grpc_code() -> None:
    """Run protoc (grpc_tools) and place the modules in orchestrator/api/_generated with relative imports."""
    from grpc_tools import protoc  # build requirement
    import grpc_tools

    include = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as out:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            str(PROTO_ROOT / PROTO_FILE),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {PROTO_FILE}")
        GENERATED.mkdir(parents=True, exist_ok=True)
        (GENERATED / "__init__.py").write_text('"""Generated from proto/ at build time; do not edit."""\n')
        for produced in (Path(out) / Path(PROTO_FILE).parent).iterdir():
            text = produced.read_text()
            # protoc writes `from thinkserve.v1 import x`; the modules live inside our package instead.
            text = re.sub(r"^from thinkserve\.v1 import ", "from . import ", text, flags=re.M)
            (GENERATED / produced.name).write_text(text)


generate_grpc_code()
packages = find_packages(include=["orchestrator", "orchestrator.*"])
if "orchestrator.api._generated" not in packages:
    packages.append("orchestrator.api._generated")

bench_packages = ["thinkserve_bench"] + [f"thinkserve_bench.{name}" for name in find_packages("benchmarks/thinkserve_bench")]

setup(
    packages=packages + ["thinkserve_build"] + bench_packages,
    package_dir={"thinkserve_build": "compiler/thinkserve_build", "thinkserve_bench": "benchmarks/thinkserve_bench"},
    # the web console's static files; the answerability model the query pipeline ships with
    package_data={"orchestrator.api": ["console/*"], "orchestrator.models": ["answerability-v*.json"]},
)
