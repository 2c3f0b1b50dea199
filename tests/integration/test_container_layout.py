"""The production image's `serve`, without Docker: its ENTRYPOINT's command with its settings file
(deploy/container.toml), a Triton installation laid out as NVIDIA's containers lay out /opt/tritonserver (every
backend under backends/, the stub beside the python backend; its files linked from the wheel), and the paths the
image mounts (/models, /data, the grants secret) moved to a temporary folder by the same THINKSERVE_SECTION__KEY
variables an operator would use. Only the listeners stay on loopback here; the unit tests check the image's
0.0.0.0 listeners against its grants (tests/deploy/test_deploy_artefacts.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from orchestrator.client import ThinkServeClient
from tests.conftest import MODEL_ENVIRONMENT, MODEL_REPOSITORY, ROOT
from tests.integration.conftest import repository_subset
from tests.integration.test_bench_interrupt import _lines_until, _tritonservers_of
from tests.deploy.test_deploy_artefacts import CONTAINER_CONFIG, token_file
from tests.orchestrator.triton.test_triton_installation import container_layout, write_model

pytestmark = pytest.mark.integration

THINKSERVE = ROOT / ".venv" / "bin" / "thinkserve"  # the image's ENTRYPOINT runs the same script


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def image_environment(tmp_path: Path, repository: Path, secret: Path, port: int) -> dict[str, str]:
    return {
        **os.environ,
        "THINKSERVE_TRITON__INSTALL_ROOT": str(container_layout(tmp_path / "opt" / "tritonserver")),
        "THINKSERVE_TRITON__MODEL_ENVIRONMENT": str(MODEL_ENVIRONMENT),  # /opt/thinkserve/.venv-triton
        "THINKSERVE_TRITON__MODEL_REPOSITORY": str(repository),  # /models
        "THINKSERVE_TRITON__LOG_DIR": str(tmp_path / "data" / "logs"),
        "THINKSERVE_TRITON__EXIT_TIMEOUT_S": "5",
        "THINKSERVE_STORAGE__DATA_DIR": str(tmp_path / "data"),  # /data
        "THINKSERVE_AUTH__TOKENS_FILE": str(secret),  # /run/secrets/thinkserve-tokens.toml
        "THINKSERVE_SERVER__HOST": "127.0.0.1", "THINKSERVE_SERVER__PORT": str(port),
        "THINKSERVE_HTTP__HOST": "127.0.0.1", "THINKSERVE_HTTP__PORT": "0",
    }


def test_the_image_command_serves_with_the_containers_own_backends(model_repository, tmp_path):
    token, _, secret = token_file(tmp_path)
    port = _free_port()
    environment = image_environment(tmp_path, model_repository, secret, port)
    serve = subprocess.Popen([str(THINKSERVE), "--config", str(CONTAINER_CONFIG), "serve"], cwd=tmp_path, env=environment,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        lines = _lines_until(serve.stdout, "serving", 300)
        assert any(line.startswith("serving") for line in lines), "".join(lines)
        servers = _tritonservers_of(serve.pid)
        assert len(servers) == 1, servers
        command = Path(f"/proc/{servers[0]}/cmdline").read_bytes().decode().split("\0")
        # the installation's own backends/ as it is: no folder assembled beside it
        assert f"--backend-directory={environment['THINKSERVE_TRITON__INSTALL_ROOT']}/backends" in command
        probe = subprocess.run([str(THINKSERVE), "--config", str(CONTAINER_CONFIG), "health", "--probe"],  # HEALTHCHECK
                               env=environment, capture_output=True, text=True, timeout=60)
        assert (probe.returncode, probe.stdout.strip()) == (0, "SERVING"), probe.stdout + probe.stderr
        with ThinkServeClient(f"127.0.0.1:{port}", token=token) as client:  # the grant from the mounted secret
            client.create_collection("image")
            assert [c.name for c in client.list_collections()] == ["image"]
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGTERM)  # `docker stop`
            try:
                serve.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(serve.pid, signal.SIGKILL)
        for pid in _tritonservers_of(serve.pid):
            os.killpg(pid, signal.SIGKILL)
    assert serve.returncode == 0, serve.stdout.read()


def test_a_repository_for_a_backend_the_image_lacks_is_refused_before_triton_starts(model_repository, tmp_path):
    repository = repository_subset(model_repository, tmp_path / "models", sorted(
        p.name for p in MODEL_REPOSITORY.iterdir() if (p / "config.pbtxt").is_file()))
    write_model(repository, "page_encoder_trt", 'platform: "tensorrt_plan"', files=("model.plan",))
    _, _, secret = token_file(tmp_path)
    environment = image_environment(tmp_path, repository, secret, _free_port())
    refused = subprocess.run([str(THINKSERVE), "--config", str(CONTAINER_CONFIG), "serve"], cwd=tmp_path, env=environment,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    message = refused.stderr.strip()
    assert "\n" not in message, message
    assert message.startswith("thinkserve: error: model page_encoder_trt needs Triton's tensorrt backend, which "
                              f"{environment['THINKSERVE_TRITON__INSTALL_ROOT']}/backends lacks (it has onnxruntime, python)")
    assert not list((tmp_path / "data").glob("logs/triton-*.log"))  # refused before any server was started
