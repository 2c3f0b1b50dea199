"""A model's parameters: the `parameters` of its config.pbtxt, plus the folder holding its files. A module of its
own because everything else in models/ reads them (common.py and torch_device.py among them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional


class ModelParameters:
    """The `parameters` of a model's config.pbtxt, plus the folder holding its files."""

    def __init__(self, args: dict):
        self.config = json.loads(args["model_config"])
        self.model_name = args["model_name"]
        self.version_dir = Path(args["model_repository"]) / args["model_version"]
        self._values = {k: v.get("string_value", "") for k, v in self.config.get("parameters", {}).items()}

    def string(self, key: str, default: Optional[str] = None) -> str:
        if key in self._values:
            return self._values[key]
        if default is None:
            raise ValueError(f"model {self.model_name}: parameter {key!r} is missing from config.pbtxt")
        return default

    def integer(self, key: str, default: Optional[int] = None) -> int:
        return int(self.string(key, None if default is None else str(default)))

    def number(self, key: str, default: Optional[float] = None) -> float:
        return float(self.string(key, None if default is None else str(default)))

    def flag(self, key: str, default: bool = False) -> bool:
        return self.string(key, "true" if default else "false").lower() in ("1", "true", "yes")

    def json(self, key: str, default=None):
        return json.loads(self.string(key, None if default is None else json.dumps(default)))

    def file(self, key: str) -> Path:
        """A file named by a parameter, inside this model's version folder; it must exist."""
        path = self.version_dir / self.string(key)
        if not path.is_file():
            raise FileNotFoundError(f"model {self.model_name}: {key} file {path.name} is missing from {self.version_dir}")
        return path

    def output_names(self) -> list[str]:
        return [o["name"] for o in self.config.get("output", [])]

    def input_names(self) -> list[str]:
        return [i["name"] for i in self.config.get("input", [])]
