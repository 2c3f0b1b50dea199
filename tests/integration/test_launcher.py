"""Starting and stopping the real tritonserver: clean exits, bounded stops, and one-line errors."""

from __future__ import annotations

import asyncio
import glob
import os
import queue
import shutil
import socket
import subprocess
import time

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2_grpc

from orchestrator.errors import TritonSetupError
from orchestrator.models import contracts
from orchestrator.triton.client import TritonClient, build_request
from orchestrator.triton.installation import TritonInstallation
from orchestrator.triton.launcher import TritonServer
from tests.conftest import ROOT
from tests.integration.conftest import repository_subset

pytestmark = pytest.mark.integration

EMBEDDER_MODELS = ["text_embedder", "text_embedder_tokenize", "text_embedder_encode"]


@pytest.fixture
def embedder_repository(model_repository, tmp_path):
    return repository_subset(model_repository, tmp_path / "repo", EMBEDDER_MODELS)


def small_server(triton_settings, repository, required=(contracts.TEXT_EMBEDDER,), **changes) -> TritonServer:
    return TritonServer(triton_settings.model_copy(update={"model_repository": repository, **changes}), required)


def assert_nothing_left(server: TritonServer, pid: int, env_dirs_before: set[str]) -> None:
    assert not glob.glob(f"/dev/shm/{server.shm_prefix}*"), "shared-memory regions leaked"
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # no server, no stub left in its process group
    assert not set(glob.glob("/tmp/python_env_*")) - env_dirs_before, "python backend temp folders leaked"


def test_start_serve_and_stop_cleanly(triton_settings, embedder_repository):
    env_dirs_before = set(glob.glob("/tmp/python_env_*"))
    server = small_server(triton_settings, embedder_repository)
    with server:
        pid = server.pid

        async def embed():
            async with TritonClient(server.endpoints.grpc) as client:
                assert await client.server_id() == server.server_id
                return (await client.infer("text_embedder", {"text": np.array([[b"hello"]], dtype=np.object_)}))["embedding"]

        assert asyncio.run(embed()).shape == (1, 384)
        assert glob.glob(f"/dev/shm/{server.shm_prefix}*")  # the stubs' regions exist while serving
    assert not server.is_running()
    assert_nothing_left(server, pid, env_dirs_before)


def test_stop_is_bounded_when_a_client_never_closes_its_stream(triton_settings, model_repository, tmp_path):
    repository = repository_subset(model_repository, tmp_path / "repo", ["llm"])
    server = small_server(triton_settings, repository, required=(contracts.LLM,), exit_timeout_s=3)
    env_dirs_before = set(glob.glob("/tmp/python_env_*"))
    server.start()
    pid = server.pid
    requests: queue.Queue = queue.Queue()
    channel = grpc.insecure_channel(server.endpoints.grpc)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    inputs = {"text_input": np.array([[b"a long story"]], dtype=np.object_), "max_tokens": np.array([[3]], dtype=np.int32)}
    requests.put(build_request("llm", inputs, (), "left-open"))
    # A bidi stream whose request side is never closed: Triton cannot shut down gracefully while it exists.
    responses = stub.ModelStreamInfer(iter(requests.get, None))
    first = next(responses)
    assert not first.error_message
    started = time.monotonic()
    server.stop()
    elapsed = time.monotonic() - started
    channel.close()
    assert elapsed < 3 + 5 + 3, f"stop took {elapsed:.1f}s"
    assert_nothing_left(server, pid, env_dirs_before)


def test_readiness_is_only_accepted_from_our_own_server(triton, triton_settings, embedder_repository):
    server = small_server(triton_settings, embedder_repository)
    taken = int(triton.endpoints.http.rsplit(":", 1)[1])

    def ports_racing_with_another_server():
        free = []
        for _ in range(2):
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                free.append(probe.getsockname()[1])
        return {"grpc_port": free[0], "http_port": taken, "metrics_port": free[1]}

    server._ports = ports_racing_with_another_server  # as if the session's server grabbed the port after our pick
    with pytest.raises(TritonSetupError, match="another server answered on Triton's ports"):
        server.start()
    assert not server.is_running()


def test_a_taken_port_is_named(triton_settings, embedder_repository):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        server = small_server(triton_settings, embedder_repository, grpc_port=port)
        with pytest.raises(TritonSetupError, match=f"port {port} \\(triton.grpc_port\\) on 127.0.0.1 is already in use"):
            server.start()


def test_numpy_2_in_the_model_environment_is_refused(triton_settings, embedder_repository):
    server = small_server(triton_settings, embedder_repository, model_environment=ROOT / ".venv")
    with pytest.raises(TritonSetupError, match=r"has numpy 2\.\d+\.\d+; Triton's python-backend stub needs numpy<2"):
        server.start()


def test_a_missing_model_environment_is_named(triton_settings, embedder_repository, tmp_path):
    server = small_server(triton_settings, embedder_repository, model_environment=tmp_path / "nowhere")
    with pytest.raises(TritonSetupError, match="has no bin/python3: run `make setup`"):
        server.start()


def test_a_missing_backend_stub_is_named(triton_settings, embedder_repository, tmp_path):
    real = TritonInstallation.locate()
    root = tmp_path / "tritonserver"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tritonserver").symlink_to(real.server_binary)
    (root / "backends").mkdir()
    (root / "backends" / "python").symlink_to(real.python_backend)
    (root / "python_backend_stubs" / "3.8").mkdir(parents=True)  # a stub for another Python only
    server = small_server(triton_settings, embedder_repository, install_root=root)
    with pytest.raises(TritonSetupError, match=r"no python-backend stub for Python 3\.11 .*\(stubs exist for 3\.8\)"):
        server.start()


def test_missing_models_and_model_files_are_named_before_starting(triton_settings, embedder_repository):
    server = small_server(triton_settings, embedder_repository, required=contracts.all_contracts())
    with pytest.raises(TritonSetupError, match="lacks models reranker"):
        server.start()
    (embedder_repository / "text_embedder_encode" / "1" / "encoder.onnx").unlink()
    with pytest.raises(TritonSetupError, match="model text_embedder_encode: file 1/encoder.onnx is missing"):
        small_server(triton_settings, embedder_repository).start()


def test_a_model_that_fails_to_load_is_reported_in_one_line(triton_settings, embedder_repository):
    onnx = embedder_repository / "text_embedder_encode" / "1" / "encoder.onnx"
    onnx.unlink()  # a hard link into the build cache: replace it, never write through it
    onnx.write_bytes(b"this is not an onnx model")
    server = small_server(triton_settings, embedder_repository)
    with pytest.raises(TritonSetupError) as caught:
        server.start()
    message = str(caught.value)
    assert "\n" not in message
    assert "text_embedder_encode" in message and "failed to load" in message
    assert not server.is_running()


def test_cli_errors_are_one_line(tmp_path):
    thinkserve = shutil.which("thinkserve", path=str(ROOT / ".venv" / "bin"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        unused = probe.getsockname()[1]
    down = subprocess.run([thinkserve, "health", "--address", f"127.0.0.1:{unused}"], capture_output=True, text=True, timeout=60)
    assert down.returncode == 2
    assert down.stderr.strip().count("\n") == 0 and "UNAVAILABLE" in down.stderr
    missing = subprocess.run([thinkserve, "--config", str(tmp_path / "none.toml"), "health"], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "cannot read settings file" in missing.stderr
    assert missing.stderr.strip().count("\n") == 0
