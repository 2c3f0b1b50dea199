"""The benchmark's own typed settings: the price table and the load/SLO knobs, from an optional TOML file.

The orchestrator's Settings reject unknown sections, so the bench reads its own file (`thinkserve-bench
--bench-config FILE`); every key is optional. The default prices are illustrative list prices (on-demand,
2025) so that reports carry numbers out of the box; a team replaces them with its own contract prices:

    deployment = "cpu"                      # which deployment kind prices this run's model-seconds
    [deployments.cpu]
    unit = "cpu_core"                       # cpu_core | gpu
    usd_per_unit_hour = 0.0446              # AWS c7i on-demand, us-east-1: $0.0893/h for 2 vCPUs
    units_per_model = 2                     # cores one model instance keeps busy while it computes
    [deployments.h100]
    unit = "gpu"
    usd_per_unit_hour = 3.00
    [hosted.llm]                            # $ per 1M tokens, to compare with a hosted API
    input_usd_per_million = 0.15
    output_usd_per_million = 0.60
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchestrator.errors import ConfigurationError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DeploymentPrice(_Section):
    """What one hour of the hardware a model computes on costs."""

    unit: Literal["cpu_core", "gpu"]
    usd_per_unit_hour: float = Field(ge=0)  # $ per core-hour or per GPU-hour
    # Units one model instance occupies while it computes: cores (the tiny profile's onnxruntime sessions run
    # 2 intra-op threads) or GPUs (1: a model-second on a GPU is charged the whole GPU, conservatively).
    units_per_model: float = Field(1.0, gt=0)
    # Units of the whole deployment (the machine): prices capacity, i.e. the machine-hour divided by the
    # queries it answers per hour at saturation.
    units_per_deployment: float = Field(1.0, gt=0)

    @property
    def usd_per_model_second(self) -> float:
        return self.usd_per_unit_hour * self.units_per_model / 3600.0

    @property
    def usd_per_deployment_hour(self) -> float:
        return self.usd_per_unit_hour * self.units_per_deployment


class TokenPrice(_Section):
    """A hosted API's price for the same model role, per million tokens."""

    input_usd_per_million: float = Field(0.0, ge=0)
    output_usd_per_million: float = Field(0.0, ge=0)


DEFAULT_DEPLOYMENTS: dict[str, DeploymentPrice] = {
    # AWS c7i on-demand (us-east-1, 2025): $0.08925/h for 2 vCPUs. This machine kind: 2 cores.
    "cpu": DeploymentPrice(unit="cpu_core", usd_per_unit_hour=0.0446, units_per_model=2.0, units_per_deployment=2.0),
    # Typical 2025 on-demand GPU-cloud rates for one GPU (hyperscalers charge more).
    "h100": DeploymentPrice(unit="gpu", usd_per_unit_hour=3.00),
    "h200": DeploymentPrice(unit="gpu", usd_per_unit_hour=3.80),
}
DEFAULT_HOSTED: dict[str, TokenPrice] = {
    # Small hosted models of each role (2025 list prices of the cheap tier): generation, embeddings, reranking.
    "llm": TokenPrice(input_usd_per_million=0.15, output_usd_per_million=0.60),
    "vlm": TokenPrice(input_usd_per_million=0.15, output_usd_per_million=0.60),
    "vlm_relevance": TokenPrice(input_usd_per_million=0.15),
    "router": TokenPrice(input_usd_per_million=0.02),
    "text_embedder": TokenPrice(input_usd_per_million=0.02),
    "page_text_clip": TokenPrice(input_usd_per_million=0.02),
    "page_text_siglip": TokenPrice(input_usd_per_million=0.02),
    "page_text_openclip": TokenPrice(input_usd_per_million=0.02),
    "reranker": TokenPrice(input_usd_per_million=0.05),
}


class PriceTable(_Section):
    deployment: str = "cpu"  # the deployment kind (a key of `deployments`) this run's model-seconds are priced as
    deployments: dict[str, DeploymentPrice] = Field(default_factory=lambda: dict(DEFAULT_DEPLOYMENTS))
    hosted: dict[str, TokenPrice] = Field(default_factory=lambda: dict(DEFAULT_HOSTED))

    @model_validator(mode="after")
    def _deployment_is_priced(self) -> "PriceTable":
        if self.deployment not in self.deployments:
            raise ValueError(f"deployment {self.deployment!r} has no price (known: {', '.join(sorted(self.deployments))})")
        return self

    @property
    def hardware(self) -> DeploymentPrice:
        return self.deployments[self.deployment]


class LoadSettings(_Section):
    concurrency_max: int = Field(32, ge=1)  # the closed-loop sweep doubles 1, 2, 4, ... up to this
    ceiling_concurrency_max: int = Field(64, ge=1)  # the ceiling's sweep (Triton alone) doubles up to this
    level_seconds: float = Field(20.0, gt=0)  # measured window per level (after its warm-up)
    warmup_seconds: float = Field(3.0, ge=0)  # run at each level before measuring
    # Saturation: the sweep stops once a doubling of concurrency gains less than this share of throughput.
    saturation_gain: float = Field(0.10, ge=0)
    # Open loop: target rates as fractions of the closed loop's best throughput (or absolute --qps).
    qps_fractions: tuple[float, ...] = (0.5, 0.8, 1.0, 1.2)


class BenchSettings(_Section):
    prices: PriceTable = PriceTable()
    slo_ms: float = Field(5000.0, gt=0)  # goodput counts the queries that finish within this
    load: LoadSettings = LoadSettings()
    warmup_queries: int = Field(3, ge=0)  # run and discarded before every measured series
    request_timeout_s: float = Field(300.0, gt=0)

    @classmethod
    def load_file(cls, path: Optional[Path]) -> "BenchSettings":
        if path is None:
            return cls()
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise ConfigurationError(f"cannot read bench settings {path}: {error}") from None
        if any(key in data for key in ("deployment", "deployments", "hosted")):  # a bare price table is accepted
            data = {"prices": {k: data.pop(k) for k in ("deployment", "deployments", "hosted") if k in data}, **data}
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
            raise ConfigurationError(f"invalid bench settings: {problems}") from None


def config_hash(*parts: BaseModel) -> str:
    """A short hash of settings objects, so two reports say whether they ran the same configuration."""
    text = json.dumps([part.model_dump(mode="json") for part in parts], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
