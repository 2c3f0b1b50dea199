"""The benchmark scripts behind the one front door, `thinkserve-bench NAME` (command.py, beside the modes): a module
of scripts/ is one when it declares its options (`declare_options(parser)`) and runs from them
(`run_benchmark(args, command)`). Found and summarised from their source without importing them (several import
torch or start servers' clients at import)."""

from __future__ import annotations

import ast
import importlib
from functools import cache
from pathlib import Path
from typing import Optional

SCRIPTS_PACKAGE = "thinkserve_bench.scripts"
SCRIPTS_DIR = Path(__file__).parent / "scripts"
BENCHMARK_FUNCTIONS = {"declare_options", "run_benchmark"}
# The GPU machine's tools keep their own entry: they start on its bare python3 (PYTHONPATH=benchmarks), before the
# pack that holds the front door's dependencies is on the path (gpu/README.md). Listed in --help all the same.
GPU_DIR = Path(__file__).parent / "gpu"
GPU_TOOLS = ("pack", "run_on_device", "measurements", "gpu_report", "graph_pagerank", "corpus")


class UsageError(Exception):
    """Options that parse but do not fit together: the front door reports it under the benchmark's usage, as argparse
    reports its own errors (status 2)."""


def name_of(token: str) -> str:
    """`document-qa` and `document_qa` both name the script document_qa."""
    return token.replace("-", "_")


@cache
def _parsed(name: str, folder: Path = SCRIPTS_DIR) -> ast.Module:
    return ast.parse((folder / f"{name}.py").read_text())


@cache
def script_names() -> tuple[str, ...]:
    """The benchmark scripts: the modules of scripts/ that define both benchmark functions (the others are the
    scripts' shared code, or a process one of them starts)."""
    names = []
    for path in sorted(SCRIPTS_DIR.glob("*.py")):
        if path.stem.startswith("_"):
            continue
        defined = {node.name for node in _parsed(path.stem).body if isinstance(node, ast.FunctionDef)}
        if BENCHMARK_FUNCTIONS <= defined:
            names.append(path.stem)
    return tuple(names)


def summary(name: str, width: Optional[int] = 96, folder: Path = SCRIPTS_DIR) -> str:
    """The first sentence of the script's docstring, cut at a word within `width` characters; the whole first
    paragraph when `width` is None (the script's own --help)."""
    paragraph = " ".join((ast.get_docstring(_parsed(name, folder)) or "").split("\n\n")[0].split())
    if width is None:
        return paragraph
    sentence = paragraph.partition(". ")[0].rstrip(".")
    return sentence if len(sentence) <= width else sentence[: width - 3].rsplit(" ", 1)[0].rstrip(",;:(") + "..."


def script(token: str) -> Optional[str]:
    """The script `token` names, or None when it names none (a mode, or a typo the modes' parser reports)."""
    name = name_of(token)
    return name if name in script_names() else None


def import_script(name: str):
    """The module of benchmark script `name`."""
    return importlib.import_module(f"{SCRIPTS_PACKAGE}.{name}")


def listing(modes: dict[str, str]) -> str:
    """The --help epilog: every benchmark with its one-line summary."""
    width = max(map(len, [*modes, *script_names()])) + 2
    lines = ["modes (a live deployment or in process; their options: thinkserve-bench NAME --help):"]
    lines += [f"  {name:<{width}}{text}" for name, text in modes.items()]
    lines += ["", "benchmark scripts (their options: thinkserve-bench NAME --help):"]
    lines += [f"  {name:<{width}}{summary(name)}" for name in script_names()]
    lines += ["", "the GPU machine's tools (their own entry, run there; gpu/README.md):",
              "  PYTHONPATH=benchmarks python3 -m thinkserve_bench.gpu.NAME --help"]
    lines += [f"  {name:<{width}}{summary(name, folder=GPU_DIR)}" for name in GPU_TOOLS]
    return "\n".join(lines)
