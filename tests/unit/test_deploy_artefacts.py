"""The deploy artefacts a user would apply, checked without Docker or a cluster: the compose file against the
Compose specification's schema, the Kubernetes manifests against Kubernetes' own schemas (strict), and every
metric the Grafana dashboard and the alert rules query against the registry that exports them."""

from __future__ import annotations

import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from orchestrator.observability.metrics import catalogue
from tests.conftest import ROOT
from tests.deploy_checks import expressions, families, metric_names

COMPOSE = ROOT / "deploy" / "compose.yaml"
KUBERNETES = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))


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
    queried = set().union(*(metric_names(expression) for expression in expressions()))
    assert len(queried) >= 15  # the parse found the metrics, not nothing
    assert families(queried) <= exported, sorted(families(queried) - exported)


def test_the_promql_parse_finds_metrics_and_only_metrics():
    expression = ('sum by (stage, le) (rate(thinkserve_stage_time_ms_bucket{pool="queries"}[5m])) '
                  '/ scalar(sum(rate(thinkserve_queries_total[$__rate_interval]))) > 0.5')
    assert metric_names(expression) == {"thinkserve_stage_time_ms_bucket", "thinkserve_queries_total"}
