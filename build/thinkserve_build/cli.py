"""`thinkserve-build`: compile a profile's models into a Triton model repository."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .profiles import PROFILES, load_profile


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="thinkserve-build", description=__doc__)
    parser.add_argument("--profile", default="tiny", choices=sorted(PROFILES))
    parser.add_argument("--output", type=Path, help="repository folder (default: model_repository/<profile>)")
    parser.add_argument("--cache", type=Path, default=Path(".thinkserve/cache"), help="checkpoints and exported artifacts")
    parser.add_argument("--target", default="cpu", help="serving target deciding each network's backend (cpu)")
    parser.add_argument("--embedder-precision", choices=("fp32", "int8"), default="fp32")
    parser.add_argument("--force", action="store_true", help="re-export even when nothing changed")
    parser.add_argument("--verbose", action="store_true", help="show tracebacks")
    args = parser.parse_args(argv)

    profile = load_profile(args.profile).with_embedder_precision(args.embedder_precision)
    if profile.name == "tiny":
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tiny profile never touches the network
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # our own progress lines say what is happening
    from .compiler import compile_repository  # heavy imports (torch) only once arguments are valid

    output = args.output or Path("model_repository") / profile.name
    try:
        compile_repository(profile, output, args.cache, target=args.target, force=args.force)
    except Exception as error:
        if args.verbose:
            raise
        print(f"thinkserve-build: error: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return 0
