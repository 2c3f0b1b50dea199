"""The deploy artefacts a user would apply, checked without Docker or a cluster: the compose file against the
Compose specification's schema, the Kubernetes manifests against Kubernetes' own schemas (strict), every
metric the Grafana dashboard and the alert rules query against the registry that exports them, and the image's
settings (deploy/container.toml) loaded as the image loads them, against what its Dockerfile lays out.
tests/integration/test_container_layout.py serves with those settings."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import PurePosixPath

import kubernetes_validate
import pytest
import yaml

from orchestrator.api.http_server import check_exposure
from orchestrator.api.security import new_token
from orchestrator.config import Settings
from orchestrator.errors import ConfigurationError
from orchestrator.observability.metrics import catalogue
from orchestrator.triton.installation import CONTAINER_ROOT
from tests.conftest import ROOT
from tests.deploy_checks import metric_names, queried_families

COMPOSE = ROOT / "deploy" / "compose.yaml"
KUBERNETES = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
DOCKERFILE = ROOT / "Dockerfile"
CONTAINER_CONFIG = ROOT / "deploy" / "container.toml"


def compose_errors(path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(path)],
                          capture_output=True, text=True)


def test_the_compose_file_follows_the_compose_specification(tmp_path):
    checked = compose_errors(COMPOSE)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    broken = tmp_path / "compose.yaml"  # the check can fail: a misspelt key is caught
    broken.write_text(COMPOSE.read_text().replace("    healthcheck:\n      test:", "    healthchek:\n      test:", 1))
    assert compose_errors(broken).returncode != 0


def test_the_compose_file_runs_one_writer_and_read_replicas_on_one_volume_and_triton_apart():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    assert services["writer"]["command"] == ["serve"] and services["reader"]["command"] == ["serve", "--read-only"]
    for name in ("writer", "reader"):
        assert services[name]["environment"]["THINKSERVE_TRITON__URL"] == "triton:8001"
        assert services[name]["volumes"] == ["thinkserve-data:/data"] and "healthcheck" in services[name]
    assert "healthcheck" in services["triton"]


def kubernetes_documents():
    return [(path.name, document) for path in KUBERNETES for document in yaml.safe_load_all(path.read_text()) if document]


@pytest.mark.parametrize("name, document", kubernetes_documents(), ids=lambda value: value if isinstance(value, str) else value["kind"] + "/" + value["metadata"]["name"])
def test_each_kubernetes_manifest_follows_the_kubernetes_schema(name, document):
    kubernetes_validate.validate(document, "1.37.0", strict=True)


def test_the_kubernetes_check_can_fail():
    deployment = next(d for _, d in kubernetes_documents() if d["kind"] == "Deployment")
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.37.0", strict=True)


def test_kubernetes_runs_one_writer_and_probes_the_standard_grpc_health():
    documents = {(d["kind"], d["metadata"]["name"]): d for _, d in kubernetes_documents()}
    writer = documents[("StatefulSet", "thinkserve-writer")]
    readers = documents[("Deployment", "thinkserve-reader")]
    assert writer["spec"]["replicas"] == 1
    assert writer["spec"]["template"]["spec"]["containers"][0]["args"] == ["serve"]
    assert readers["spec"]["template"]["spec"]["containers"][0]["args"] == ["serve", "--read-only"]
    for workload in (writer, readers):
        container = workload["spec"]["template"]["spec"]["containers"][0]
        assert container["readinessProbe"] == {"grpc": {"port": 50051}, "periodSeconds": 5}


def test_every_metric_the_dashboard_and_alerts_query_is_exported():
    exported = {series for series, *_ in catalogue()}
    ours, triton = queried_families()
    assert len(ours) >= 15 and len(triton) >= 5  # the parse found the metrics, not nothing
    assert ours <= exported, sorted(ours - exported)
    recorded = json.loads((ROOT / "tests" / "backend" / "trtllm_recorded" / "triton_metric_families.json").read_text())
    assert triton <= set(recorded["families"]), sorted(triton - set(recorded["families"]))


def test_the_promql_parse_finds_metrics_and_only_metrics():
    expression = ('sum by (stage, le) (rate(thinkserve_stage_time_ms_bucket{pool="queries"}[5m])) '
                  '/ scalar(sum(rate(thinkserve_queries_total[$__rate_interval]))) > 0.5')
    assert metric_names(expression) == {"thinkserve_stage_time_ms_bucket", "thinkserve_queries_total"}


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments left out."""
    joined = DOCKERFILE.read_text().replace("\\\n", " ")
    return [tuple(line.split(None, 1)) for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def instruction(name: str) -> list[str]:
    return [arguments for keyword, arguments in dockerfile_instructions() if keyword == name]


def token_file(tmp_path):
    """A grants file as `thinkserve token` writes them: (token, its digest, the file)."""
    token, digest = new_token()
    secret = tmp_path / "thinkserve-tokens.toml"
    secret.write_text(f'[[tokens]]\nname = "app"\nsha256 = "{digest}"\nwrite = true\n')
    return token, digest, secret


def test_the_image_config_listens_on_every_interface_only_with_token_grants(tmp_path):
    """What the image's `serve` does before starting anything: read deploy/container.toml and the environment,
    then refuse a listener off loopback without grants. The default secret path is not mounted here: refused,
    naming it; a mounted file, or grants in the environment with the file dropped, are accepted."""
    with pytest.raises(ConfigurationError, match="cannot read auth.tokens_file /run/secrets/thinkserve-tokens.toml"):
        Settings.load(CONTAINER_CONFIG, environment={})
    _, digest, secret = token_file(tmp_path)
    mounted = Settings.load(CONTAINER_CONFIG, environment={"THINKSERVE_AUTH__TOKENS_FILE": str(secret)})
    assert mounted.server.host == mounted.http.host == "0.0.0.0" and [g.name for g in mounted.auth.tokens] == ["app"]
    check_exposure(mounted)
    from_environment = Settings.load(CONTAINER_CONFIG, environment={
        "THINKSERVE_AUTH__TOKENS_FILE": "",
        "THINKSERVE_AUTH__TOKENS": f'[{{name = "ops", sha256 = "{digest}", write = true}}]',
    })
    assert from_environment.auth.tokens_file is None and [g.name for g in from_environment.auth.tokens] == ["ops"]
    check_exposure(from_environment)
    open_to_all = Settings.load(CONTAINER_CONFIG, environment={"THINKSERVE_AUTH__TOKENS_FILE": ""})
    with pytest.raises(ConfigurationError, match="reachable from the network but no auth.tokens are configured"):
        check_exposure(open_to_all)


def test_the_dockerfile_lays_out_what_the_image_config_names():
    config = tomllib.loads(CONTAINER_CONFIG.read_text())
    workdir = PurePosixPath(instruction("WORKDIR")[-1])
    entrypoint = json.loads(instruction("ENTRYPOINT")[-1])
    assert entrypoint == [str(workdir / ".venv/bin/thinkserve"), "--config", str(workdir / "deploy/container.toml")]
    assert json.loads(instruction("CMD")[-1]) == ["serve"]
    # the two environments the settings name, both made with the container's own python3 (its stub's Python)
    runs = " ".join(instruction("RUN"))
    assert "python3 -m venv .venv-triton" in runs and "python3 -m venv .venv " in runs and "python3." not in runs
    assert PurePosixPath(config["triton"]["model_environment"]) == workdir / ".venv-triton"
    assert PurePosixPath(config["triton"]["install_root"]) == PurePosixPath(CONTAINER_ROOT)
    volumes = json.loads(instruction("VOLUME")[-1])
    assert config["storage"]["data_dir"] in volumes and config["triton"]["log_dir"].startswith(config["storage"]["data_dir"] + "/")
    # both listeners published, a non-root user, a healthcheck asking the standard health service
    assert set(instruction("EXPOSE")[-1].split()) == {str(config["server"]["port"]), str(config["http"]["port"])}
    user = instruction("USER")[-1].split(":")[0]
    assert user not in ("0", "root") and int(user) > 0
    healthcheck = instruction("HEALTHCHECK")[-1]
    assert "--start-period=" in healthcheck
    probe = json.loads(healthcheck.split("CMD", 1)[1])
    assert probe == entrypoint + ["health", "--probe"]
    # the base images: one NGC Triton release, its -py3 image and its TensorRT-LLM one, chosen by TRITON_FLAVOUR
    bases = instruction("FROM")
    assert bases[0] == "nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-py3 AS triton-py3"
    assert bases[1] == "nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-trtllm-python-py3 AS triton-trtllm"
    assert bases[2] == "triton-${TRITON_FLAVOUR}"
    assert "--shm-size" in DOCKERFILE.read_text()


def test_the_healthcheck_asks_the_server_on_loopback(tmp_path, monkeypatch):
    """The probe reads the same settings: a server on every interface is asked at 127.0.0.1, on its port."""
    from orchestrator.cli import _address, build_parser

    _, _, secret = token_file(tmp_path)
    monkeypatch.setenv("THINKSERVE_AUTH__TOKENS_FILE", str(secret))
    probe = json.loads(instruction("HEALTHCHECK")[-1].split("CMD", 1)[1])
    args = build_parser().parse_args([str(CONTAINER_CONFIG) if part.endswith("container.toml") else part for part in probe[1:]])
    assert _address(args) == "127.0.0.1:50051"
    monkeypatch.setenv("THINKSERVE_SERVER__PORT", "6000")
    assert _address(args) == "127.0.0.1:6000"


def test_the_documented_docker_run_publishes_both_ports_sizes_shm_and_mounts_the_grants():
    config = tomllib.loads(CONTAINER_CONFIG.read_text())
    header = [line.lstrip("# ").rstrip("\\ ") for line in DOCKERFILE.read_text().splitlines() if line.startswith("#")]
    start = next(i for i, line in enumerate(header) if line.startswith("docker run"))
    run = " ".join(header[start:start + 3]).split()
    assert {f"{config['server']['port']}:{config['server']['port']}", f"{config['http']['port']}:{config['http']['port']}"} <= set(run)
    assert "--shm-size=2g" in run and yaml.safe_load(COMPOSE.read_text())["services"]["triton"]["shm_size"] == "2gb"
    assert any(part.endswith(":" + config["auth"]["tokens_file"] + ":ro") for part in run)
    assert any(part.endswith(":" + config["triton"]["model_repository"] + ":ro") for part in run)


def test_triton_mounts_where_the_gpu_target_puts_its_engines_and_tensorrt_caches():
    """The gpu repository names /engines (TensorRT-LLM's gpt_model_path) and /data/tensorrt-cache (onnxruntime's
    TensorRT caches): without those mounts its engines are not found and every encoder's TensorRT engine is built
    again at each start (or not written at all)."""
    from thinkserve_build.gpu_target import GpuTarget

    target = GpuTarget()
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    # "<host>:<container>[:ro]", the host part possibly "${VARIABLE:-default}"
    compose_mounts = {volume.removesuffix(":ro").rsplit(":", 1)[1] for volume in services["triton"]["volumes"]}
    assert {target.engines_mount, target.engine_cache} <= compose_mounts
    build = services["engine-build"]
    assert build["profiles"] == ["gpu-target"]
    # the build step starts the repository once (the encoders' TensorRT engines into the cache) and times a warm
    # start against Triton's start period
    build_mounts = {volume.removesuffix(":ro").rsplit(":", 1)[1] for volume in build["volumes"]}
    assert {target.engines_mount, target.engine_cache, "/models"} <= build_mounts and build["shm_size"] == "2gb"
    period = services["triton"]["healthcheck"]["start_period"]
    assert period == "${TRITON_START_PERIOD_S:-600}s" and build["environment"]["STARTUP_BUDGET_S"] == period.removesuffix("s")
    assert services["triton"]["depends_on"]["engine-build"]["required"] is False
    documents = {(d["kind"], d["metadata"]["name"]): d for _, d in kubernetes_documents()}
    pod = documents[("Deployment", "triton")]["spec"]["template"]["spec"]
    triton = pod["containers"][0]
    mounts = {mount["mountPath"] for mount in triton["volumeMounts"]}
    assert {target.engines_mount, target.engine_cache} <= mounts
    (init,) = pod["initContainers"]
    assert {mount["mountPath"] for mount in init["volumeMounts"]} == {target.engines_mount, target.engine_cache, "/models", "/dev/shm"}
    assert "build_engines.sh" in init["args"][0]
    probe = triton["startupProbe"]
    budget = {variable["name"]: variable["value"] for variable in init["env"]}["STARTUP_BUDGET_S"]
    assert int(budget) == probe["periodSeconds"] * probe["failureThreshold"]
    claims = {volume["persistentVolumeClaim"]["claimName"] for volume in pod["volumes"] if "persistentVolumeClaim" in volume}
    assert {("PersistentVolumeClaim", claim) for claim in claims} <= set(documents)
