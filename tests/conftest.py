"""Shared paths and settings. Integration tests use the real tritonserver and the tiny repository that
`make models` builds; they fail (never skip) when it is missing, since `make test` always builds it first."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import Settings, TritonSettings

ROOT = Path(__file__).resolve().parents[1]
MODEL_REPOSITORY = ROOT / "model_repository" / "tiny"
MODEL_ENVIRONMENT = ROOT / ".venv-triton"
SAMPLE_DOCUMENT = ROOT / "samples" / "northwind-2024-annual-report.md"


def require_repository() -> Path:
    if not (MODEL_REPOSITORY / "text_embedder" / "config.pbtxt").is_file():
        pytest.fail(f"{MODEL_REPOSITORY} is not built: run `make models` (make test does it)")
    return MODEL_REPOSITORY


@pytest.fixture(scope="session")
def model_repository() -> Path:
    return require_repository()


@pytest.fixture(scope="session")
def triton_settings(model_repository, tmp_path_factory) -> TritonSettings:
    return TritonSettings(
        model_repository=model_repository,
        model_environment=MODEL_ENVIRONMENT,
        log_dir=tmp_path_factory.mktemp("triton-logs"),
        startup_timeout_s=300,
    )


def settings_with(triton: TritonSettings, data_dir: Path, **sections) -> Settings:
    """Settings for a test deployment: free orchestrator and HTTP ports, its own data folder."""
    sections["server"] = {"port": 0, **sections.get("server", {})}
    sections["http"] = {"port": 0, **sections.get("http", {})}
    sections["storage"] = {"data_dir": data_dir, **sections.get("storage", {})}
    return Settings(triton=triton, **sections)
