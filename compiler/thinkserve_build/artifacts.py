"""The build cache: exported files of one model role, kept under a fingerprint of everything that made them.

A role is rebuilt only when its fingerprint changes: the checkpoint's identity, the role's spec, the export
code, or the versions of torch / transformers / onnx / onnxruntime / tokenizers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .checkpoints import ResolvedCheckpoint, source_hash

TOOL_PACKAGES = ("torch", "transformers", "onnx", "onnxruntime", "tokenizers")


@dataclass(frozen=True)
class Artifact:
    role: str
    directory: Path
    facts: dict  # what the exporter reported: file names, dimensions, special token ids, ...

    def file(self, key: str) -> Path:
        return self.directory / self.facts[key]


def fingerprint(role: str, spec, checkpoint: ResolvedCheckpoint, formats: frozenset[str] = frozenset({"onnx"})) -> str:
    from thinkserve_backend import decoding, generator_runtime, images, relevance, torch_decoding, torch_modules

    from orchestrator import prompts
    from orchestrator.models import chat_template

    from . import calibration, decoder_graph, export, onnx_tools

    material = {
        "role": role,
        "spec": dataclasses.asdict(spec),
        "checkpoint": checkpoint.identity,
        "formats": sorted(formats),
        "code": source_hash(
            export, decoder_graph, onnx_tools, calibration, decoding, generator_runtime, images, relevance, torch_modules, torch_decoding,
            prompts, chat_template, *_ocr_code(role),
        ),
        "versions": {name: importlib.metadata.version(name) for name in TOOL_PACKAGES},
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _ocr_code(role: str) -> tuple:
    """The OCR role's own code (it imports OpenCV, which a build without the role need not have)."""
    if role != "ocr":
        return ()
    from thinkserve_backend import ocr, ocr_settings

    from . import ocr_export

    return (ocr_export, ocr, ocr_settings)


def build(
    role: str,
    spec,
    checkpoint: ResolvedCheckpoint,
    cache_dir: Path,
    exporter: Callable[[str, Path], dict],
    force: bool = False,
    formats: frozenset[str] = frozenset({"onnx"}),
) -> tuple[Artifact, bool]:
    """The role's artifact in `formats`, exported now unless an identical one is cached. Returns (artifact, was_built)."""
    directory = cache_dir / "artifacts" / f"{role}-{fingerprint(role, spec, checkpoint, formats)}"
    manifest = directory / "manifest.json"
    if manifest.exists() and not force:
        return Artifact(role, directory, json.loads(manifest.read_text())["facts"]), False
    directory.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{role}-", dir=directory.parent))
    try:
        facts = exporter(checkpoint.location, scratch)
        (scratch / "manifest.json").write_text(
            json.dumps({"role": role, "checkpoint": checkpoint.identity, "facts": facts}, indent=2)
        )
        shutil.rmtree(directory, ignore_errors=True)
        scratch.rename(directory)  # the artifact appears complete or not at all
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Artifact(role, directory, facts), True
