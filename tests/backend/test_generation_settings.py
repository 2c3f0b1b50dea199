"""The generation settings cross the wire between two packages that may not import each other (the contracts in
pyproject.toml): the service's GenerationOptions (orchestrator.models.protocol), sent as Triton inputs of the same
names, and the backend's GenerationParams (thinkserve_backend.decoding), read from them. They stay one set."""

from __future__ import annotations

import dataclasses

from orchestrator.models.protocol import GenerationOptions
from thinkserve_backend.decoding import GenerationParams


def _fields(cls) -> dict[str, object]:
    return {field.name: field.default for field in dataclasses.fields(cls)}


def test_the_service_sends_every_setting_the_backend_reads_with_the_same_defaults():
    assert _fields(GenerationOptions) == _fields(GenerationParams)
    assert list(_fields(GenerationOptions)) == ["max_tokens", "temperature", "top_p", "stop", "seed", "entropies"]
