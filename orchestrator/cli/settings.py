"""The settings a `thinkserve` command runs with: its --config file, the global options that override it, and the
THINKSERVE_SECTION__KEY environment variables. Shared by the CLI (orchestrator/cli/) and the benchmarks' command
`thinkserve-bench` (benchmarks/thinkserve_bench/command.py): neither imports the other for it."""

from __future__ import annotations

import os

from ..config import Settings


def settings_from_args(args) -> Settings:
    overrides = {"profile": getattr(args, "profile", None)}
    if getattr(args, "port", None) is not None:
        overrides["server.port"] = args.port
    if getattr(args, "triton_url", None):
        overrides["triton.url"] = args.triton_url
    if getattr(args, "model_repository", None):
        overrides["triton.model_repository"] = str(args.model_repository)
    if getattr(args, "read_only", False):
        overrides["storage.read_only"] = True
    return Settings.load(args.config, overrides, environment=os.environ)  # THINKSERVE_SECTION__KEY variables
