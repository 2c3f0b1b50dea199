"""The model compiler: profile -> checkpoints -> ONNX artifacts (cached) -> model repository on disk."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Callable, Optional

from . import artifacts, checkpoints, export, repository
from .model_config import PlannedModel
from .profiles import ClassifierSpec, Profile
from .target_choice import select_target

Log = Callable[[str], None]


def _jobs(profile: Profile, log: Log):
    """(role, spec, exporter(location, out, formats) -> facts) for every model role of the profile."""
    from orchestrator.models.contracts import ROUTE_LABELS

    yield "embedder", profile.embedder, partial(export.export_embedder, spec=profile.embedder, log=log)
    yield "reranker", profile.reranker, partial(
        export.export_classifier, spec=profile.reranker, labels=("relevance",), output="score", pairs=True
    )
    if isinstance(profile.router, ClassifierSpec):  # else the router asks the LLM: served from the LLM's artifact
        yield "router", profile.router, partial(
            export.export_classifier, spec=profile.router, labels=ROUTE_LABELS, output="probabilities", pairs=False
        )
    for spec in profile.page_encoders:
        yield f"page_{spec.family}", spec, partial(export.export_page_encoder, spec=spec)
    yield "llm", profile.llm, partial(export.export_llm, spec=profile.llm)
    yield "vlm", profile.vlm, partial(export.export_vlm, spec=profile.vlm)
    if profile.ocr is not None:  # every target serves PP-OCR's ONNX graphs (onnxruntime, or TensorRT through it)
        from . import ocr_export  # OpenCV: only where the OCR role is built

        yield "ocr", profile.ocr, partial(ocr_export.export_ocr, spec=profile.ocr, log=log)


def compile_repository(
    profile: Profile, output: Path, cache_dir: Path, target: str = "cpu", force: bool = False, log: Log = print,
    device: str = "auto", gpu_memory_gb: Optional[float] = None,
) -> list[PlannedModel]:
    """Export what `target` serves (on `device`) for every role of the profile, and write the repository;
    `gpu_memory_gb`: the gpu target's serving GPU, which the repository must fit."""
    started = time.perf_counter()
    chosen = select_target(target, device, gpu_memory_gb)  # fails here, before any export, on a machine that cannot serve it
    built: dict[str, artifacts.Artifact] = {}
    jobs = list(_jobs(profile, log))
    for index, (role, spec, exporter) in enumerate(jobs, 1):
        step_started = time.perf_counter()
        checkpoint = checkpoints.resolve(spec.checkpoint, cache_dir, log)
        formats = chosen.formats_for(role)
        artifact, fresh = artifacts.build(
            role, spec, checkpoint, cache_dir, lambda location, out: exporter(location, out=out, formats=formats), force,
            formats=formats,
        )
        built[role] = artifact
        state = f"exported in {time.perf_counter() - step_started:.1f}s" if fresh else "unchanged (cached)"
        log(f"[{index}/{len(jobs)}] {role:<12} {spec.checkpoint.describe():<40} {state}")
    models = repository.plan(profile, built, chosen)
    for line in chosen.check_fits(models, profile, built):  # a repository that cannot fit is not written
        log(line)
    report = repository.write(models, output)
    for line in chosen.write_extras(output, profile, built):
        log(line)
    log(
        f"model repository {output} (target {chosen.describe()}): {len(models)} models, {len(report.written)} written, "
        f"{len(report.removed)} removed, {time.perf_counter() - started:.1f}s"
    )
    return models
