"""Deployment-level ablations: switches that are not per-request options, each served by a deployment of its own
(a second Triton + orchestrator) in the same run as the baseline.

  dynamic batching off   the deployment's model repository with `dynamic_batching` removed from every config
                         (a new folder of hard links to the same files: no weight is copied; only the changed
                         config.pbtxt files are new files, so the original repository is never written)
  int8 embedder          the same repository with the models whose config differs taken from a repository built
                         with `thinkserve_build --embedder-precision int8` (the text embedder's encoder)
  queue policy           (only when named) every dynamically batched model with the queue policy the build wrote
                         until 2026-11-30 (1,024 requests, 120 s, timeouts overridable), which turns off
                         tritonserver's batch prefetching (compiler profiles.ServingOptions.max_queue_size)

Each variant ingests the same documents into its own data folder (the int8 embedder must embed the collection
it searches), so the questions, expected pages and options are the baseline's.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Callable, Optional, Sequence

from orchestrator.config import Settings
from orchestrator.errors import ConfigurationError
from .stats import percentile

NO_BATCHING = "dynamic batching off"
INT8 = "int8 embedder"
QUEUE_POLICY = "queue policy"
VARIANTS = (NO_BATCHING, INT8, QUEUE_POLICY)
BY_DEFAULT = (NO_BATCHING, INT8)  # the ones an ablations run without --ablations starts
# the policy every model carried before the build stopped writing one
OLD_QUEUE_POLICY = {"max_queue_size": 1024, "default_timeout_microseconds": 120_000_000, "allow_timeout_override": True}
CONFIG = "config.pbtxt"


def wanted_variants(mode: str, named: Optional[Sequence[str]]) -> list[str]:
    """The deployment variants a run starts: an ablations run's named ones, or BY_DEFAULT when it names none."""
    if mode != "ablations":
        return []
    return [v for v in VARIANTS if (v in named if named else v in BY_DEFAULT)]


def remove_block(text: str, name: str) -> str:
    """`text` (protobuf text format) without its top-level `name { ... }` blocks, nested braces included."""
    out, at = [], 0
    pattern = re.compile(rf"^{re.escape(name)}\s*{{", re.MULTILINE)
    while (match := pattern.search(text, at)) is not None:
        out.append(text[at : match.start()])
        depth, i = 1, match.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth:
            raise ValueError(f"unbalanced braces in the {name} block")
        at = i + 1 if text[i : i + 1] == "\n" else i
    return "".join(out) + text[at:]


def _link_tree(source: Path, target: Path, skip_configs: bool) -> None:
    """Hard links of every file (a copy where the filesystem refuses links); configs left out when asked."""

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    ignore = shutil.ignore_patterns("__pycache__", *((CONFIG,) if skip_configs else ()))
    shutil.copytree(source, target, copy_function=link, ignore=ignore)


def without_dynamic_batching(source: Path, target: Path) -> list[str]:
    """A repository at `target` serving `source`'s models without dynamic batching; the models changed."""
    changed = []
    for model in sorted(p for p in source.iterdir() if (p / CONFIG).is_file()):
        _link_tree(model, target / model.name, skip_configs=True)
        text = (model / CONFIG).read_text()
        stripped = remove_block(text, "dynamic_batching")
        (target / model.name / CONFIG).write_text(stripped)  # a new file: the link tree has no config
        if stripped != text:
            changed.append(model.name)
    return changed


def add_old_queue_policy(config) -> None:
    """OLD_QUEUE_POLICY, timeouts rejected, on a model config's dynamic batching (a ModelConfig message)."""
    policy = config.dynamic_batching.default_queue_policy
    for field_name, value in OLD_QUEUE_POLICY.items():
        setattr(policy, field_name, value)
    policy.timeout_action = policy.REJECT


def with_queue_policy(source: Path, target: Path) -> list[str]:
    """A repository at `target` serving `source`'s models, each dynamically batched one with OLD_QUEUE_POLICY
    (timeouts rejected); the models changed."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    changed = []
    for model in sorted(p for p in source.iterdir() if (p / CONFIG).is_file()):
        _link_tree(model, target / model.name, skip_configs=True)
        text = (model / CONFIG).read_text()
        config = text_format.Parse(text, mc.ModelConfig())
        if config.HasField("dynamic_batching"):
            add_old_queue_policy(config)
            text = text_format.MessageToString(config)
            changed.append(model.name)
        (target / model.name / CONFIG).write_text(text)  # a new file: the link tree has no config
    return changed


def with_models_from(source: Path, other: Path, target: Path) -> list[str]:
    """`source`'s models at `target`, except those whose config differs in `other`, taken from there."""
    taken = []
    for model in sorted(p for p in source.iterdir() if (p / CONFIG).is_file()):
        alternative = other / model.name
        if (alternative / CONFIG).is_file() and (alternative / CONFIG).read_text() != (model / CONFIG).read_text():
            _link_tree(alternative, target / model.name, skip_configs=False)
            taken.append(model.name)
        else:
            _link_tree(model, target / model.name, skip_configs=False)
    return taken


def int8_repository(profile: str, given: Optional[Path], progress: Callable[[str], None] = print) -> Path:
    """The int8-embedder build of the profile: `given`, or model_repository/<profile>-int8, built when missing."""
    path = given or Path("model_repository") / f"{profile}-int8"
    if (path / "text_embedder" / CONFIG).is_file():
        return path
    if given is not None:
        raise ConfigurationError(f"{given} is not a model repository (no text_embedder/{CONFIG})")
    command = [sys.executable, "-m", "thinkserve_build", "--profile", profile, "--embedder-precision", "int8", "--output", str(path)]
    progress("building the int8 embedder's repository: " + " ".join(command))
    if subprocess.run(command).returncode:
        raise ConfigurationError(f"building {path} failed (run from the ThinkServe checkout, with `make setup` done)")
    return path


@dataclass(frozen=True)
class VariantRepository:
    label: str
    path: Path
    changed: tuple[str, ...]  # models whose config (and for int8, files) differ from the baseline's
    source: str  # how it was made


@contextlib.contextmanager
def variant_repositories(baseline: Path, labels: Sequence[str], profile: str, int8_source: Optional[Path] = None,
                         progress: Callable[[str], None] = print):
    """The variants' repositories beside the baseline's (same filesystem, so hard links work), removed after."""
    baseline = baseline.resolve()
    folder = Path(tempfile.mkdtemp(prefix=".bench-variants-", dir=baseline.parent))
    try:
        out = {}
        for label in labels:
            path = folder / label.replace(" ", "-")
            if label == NO_BATCHING:
                changed = without_dynamic_batching(baseline, path)
                out[label] = VariantRepository(label, path, tuple(changed), f"{baseline.name} without dynamic_batching")
            elif label == INT8:
                built = int8_repository(profile, int8_source, progress)
                changed = with_models_from(baseline, built, path)
                if not changed:
                    raise ConfigurationError(f"{built} serves the same models as {baseline}: is it an int8 build?")
                out[label] = VariantRepository(label, path, tuple(changed), f"{baseline.name} with {', '.join(changed)} from {built}")
            elif label == QUEUE_POLICY:
                changed = with_queue_policy(baseline, path)
                out[label] = VariantRepository(label, path, tuple(changed), f"{baseline.name} with the old queue policy")
            else:
                raise ValueError(f"unknown deployment variant {label!r} (known: {', '.join(VARIANTS)})")
        yield out
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.asynccontextmanager
async def variant_targets(settings: Settings, labels: Sequence[str], documents: Sequence[Path], collection: str,
                          work: Path, int8_source: Optional[Path] = None,
                          progress: Callable[[str], None] = print) -> AsyncIterator[dict]:
    """{label: (Target, VariantRepository, corpus)}: one deployment per variant, each loaded with `documents`."""
    from .target import bench_settings_for, ingest, own_deployment

    with variant_repositories(settings.triton.model_repository, labels, settings.profile, int8_source, progress) as repositories:
        async with contextlib.AsyncExitStack() as stack:
            out = {}
            for label, repository in repositories.items():
                progress(f"variant {label!r}: {repository.source}")
                varied = settings.model_copy(update={"triton": settings.triton.model_copy(update={"model_repository": repository.path, "url": ""})})
                target = await stack.enter_async_context(
                    own_deployment(bench_settings_for(varied, work / f"data-{repository.path.name}"), progress))
                corpus = await ingest(target.address, collection, documents, progress)
                out[label] = (target, repository, corpus)
            yield out


async def embedding_agreement(baseline_triton: str, variant_triton: str, texts: Sequence[str]) -> dict:
    """Cosine between the two deployments' text embeddings of the same texts (int8 against fp32)."""
    import numpy as np

    from orchestrator.triton.client import TritonClient
    from orchestrator.triton.models import TritonModels

    vectors = []
    for url in (baseline_triton, variant_triton):
        client = TritonClient(url, default_timeout_s=60)
        try:
            models = TritonModels(client)
            vectors.append(np.concatenate([await models.embed(list(texts[i : i + 16])) for i in range(0, len(texts), 16)]))
        finally:
            await client.close()
    a, b = (v / np.linalg.norm(v, axis=1, keepdims=True) for v in vectors)
    cosine = (a * b).sum(axis=1)
    return {"texts": len(texts), "mean_cosine": float(cosine.mean()), "min_cosine": float(cosine.min()),
            "p5_cosine": percentile(cosine, 5)}
