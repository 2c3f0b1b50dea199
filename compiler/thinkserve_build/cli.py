"""`thinkserve-build`: compile a profile's models into a Triton model repository.

The trained artefacts the service ships or serves are trained here too:
`thinkserve-build train-router --questions labelled.jsonl --base CHECKPOINT --output FOLDER` fine-tunes a router
classifier from labelled questions (`--router-checkpoint FOLDER` then serves it in place of asking the LLM);
`thinkserve-build train-answerability --examples RESULTS.json.gz` fits the answerability model and writes the file
the service ships, from the examples `thinkserve-bench answerability` collected.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable

from . import train_router
from .profiles import PROFILES, load_profile
from .targets import DEVICES, TARGET_NAMES


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["train-router"]:
        return _train_router(argv[1:])
    if argv[:1] == ["train-answerability"]:
        return _train_answerability(argv[1:])
    parser = argparse.ArgumentParser(prog="thinkserve-build", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="tiny", choices=sorted(PROFILES))
    parser.add_argument("--output", type=Path, help="repository folder (default: model_repository/<profile>)")
    parser.add_argument("--cache", type=Path, default=Path(".thinkserve/cache"), help="checkpoints and exported artifacts")
    parser.add_argument("--target", default="cpu",
                        help=f"one of {', '.join(TARGET_NAMES)}. cpu: onnxruntime in python models; torch: PyTorch in python models (a GPU or the CPU); "
                             "gpu: Triton's onnxruntime/TensorRT and TensorRT-LLM backends in NVIDIA's container")
    parser.add_argument("--device", default="auto", choices=DEVICES,
                        help="torch target: cuda or cpu (auto: a CUDA GPU when torch sees one)")
    parser.add_argument("--gpu-memory-gb", type=float,
                        help="gpu target: the serving GPU's memory; a repository that does not fit is refused (the plan is "
                             "written beside it either way, <repository>.engines/memory_plan.json)")
    parser.add_argument("--embedder-precision", choices=("fp32", "int8"), default="fp32")
    parser.add_argument("--router-checkpoint", help="serve this fine-tuned 3-way classifier (folder or hub id) as the router")
    parser.add_argument("--no-ocr", action="store_true",
                        help="leave the OCR models out (serve with ingest.ocr = \"off\"; a machine without OpenCV)")
    parser.add_argument("--force", action="store_true", help="re-export even when nothing changed")
    parser.add_argument("--verbose", action="store_true", help="show tracebacks")
    args = parser.parse_args(argv)

    profile = load_profile(args.profile).with_embedder_precision(args.embedder_precision)
    if args.router_checkpoint:
        profile = profile.with_router_checkpoint(args.router_checkpoint)
    if args.no_ocr:
        profile = profile.without_ocr()
    if profile.name in ("tiny", "offline"):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # these profiles never touch the network
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # our own progress lines say what is happening
    from .compiler import compile_repository  # heavy imports (torch) only once arguments are valid

    output = args.output or default_output(profile.name, args.target)
    return _reported("thinkserve-build", args.verbose, lambda: compile_repository(
        profile, output, args.cache, target=args.target, force=args.force, device=args.device,
        gpu_memory_gb=args.gpu_memory_gb,
    ))


def default_output(profile: str, target: str) -> Path:
    """model_repository/<profile> for the cpu target, model_repository/<profile>-<target> for the others."""
    return Path("model_repository") / (profile if target == "cpu" else f"{profile}-{target}")


def _reported(program: str, verbose: bool, work: Callable[[], object]) -> int:
    """Run `work`; an error is one line on stderr and exit status 1 (with --verbose, the traceback)."""
    try:
        work()
    except Exception as error:
        if verbose:
            raise
        print(f"{program}: error: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return 0


def _train_router(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="thinkserve-build train-router", description=train_router.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=Path, required=True, help='JSONL: {"question": ..., "route": simple|moderate|complex}')
    parser.add_argument("--base", required=True, help="sequence-classification checkpoint to start from (folder or hub id)")
    parser.add_argument("--output", type=Path, required=True, help="folder for the trained checkpoint")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--head-only", action="store_true", help="train only the new classification head")
    parser.add_argument("--verbose", action="store_true", help="show tracebacks")
    args = parser.parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    return _reported("thinkserve-build train-router", args.verbose, lambda: train_router.train_router(
        args.base, train_router.read_questions(args.questions), args.output, epochs=args.epochs,
        learning_rate=args.learning_rate, head_only=args.head_only,
    ))


def _train_answerability(argv: list[str]) -> int:
    from . import train_answerability  # scikit-learn only here
    from orchestrator.models.answerability import MODEL_FILE

    parser = argparse.ArgumentParser(prog="thinkserve-build train-answerability", description=train_answerability.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=Path, required=True,
                        help="a `thinkserve-bench answerability` results file (JSON, or .json.gz) with its examples")
    parser.add_argument("--output", type=Path, default=MODEL_FILE, help="the file written (default: the one the service ships)")
    parser.add_argument("--max-false-refusals", type=float, default=0.10)
    parser.add_argument("--verbose", action="store_true", help="show tracebacks")
    args = parser.parse_args(argv)
    command = "thinkserve-build train-answerability " + " ".join(argv)

    def train() -> None:
        shipped = train_answerability.train_answerability(train_answerability.read_examples(args.examples), args.output,
                                                          args.max_false_refusals, command)
        print(f"wrote {args.output}: version {shipped['version']}, trained on {shipped['training']}")

    return _reported("thinkserve-build train-answerability", args.verbose, train)
