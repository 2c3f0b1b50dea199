"""Every benchmark behind the one front door, `thinkserve-bench NAME`: the modes that drive a live deployment
(command.py) and the benchmark scripts (scripts/), found by their `main` and summarised from their docstrings
without importing them (several import torch or start servers' clients at import)."""

from __future__ import annotations

import ast
import importlib
from functools import cache
from pathlib import Path
from typing import Optional

SCRIPTS_PACKAGE = "thinkserve_bench.scripts"
SCRIPTS_DIR = Path(__file__).parent / "scripts"
# Modules of scripts/ with a `main` that are parts of another benchmark, not benchmarks of their own.
HELPERS = {"grpc_query_timing": "own_time's client, run in a process of its own"}


def name_of(token: str) -> str:
    """`document-qa` and `document_qa` both name the script document_qa."""
    return token.replace("-", "_")


@cache
def _parsed(name: str) -> ast.Module:
    return ast.parse((SCRIPTS_DIR / f"{name}.py").read_text())


def script_names() -> list[str]:
    """The benchmark scripts: the modules of scripts/ that define `main`, less the helpers."""
    names = []
    for path in sorted(SCRIPTS_DIR.glob("*.py")):
        name = path.stem
        if name.startswith("_") or name in HELPERS:
            continue
        if any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in _parsed(name).body):
            names.append(name)
    return names


def summary(name: str, width: int = 96) -> str:
    """The first sentence of the script's docstring, cut at a word within `width` characters."""
    text = " ".join((ast.get_docstring(_parsed(name)) or "").split("\n\n")[0].split())
    sentence = text.partition(". ")[0].rstrip(".")
    return sentence if len(sentence) <= width else sentence[: width - 3].rsplit(" ", 1)[0].rstrip(",;:(") + "..."


def script(token: str) -> Optional[str]:
    """The script `token` names, or None when it names none (a mode, or a typo the modes' parser reports)."""
    name = name_of(token)
    return name if name in script_names() else None


def run_script(name: str, argv: list[str]) -> int:
    """Run script `name` with its own options, as `python -m thinkserve_bench.scripts.NAME ARGV` would."""
    result = importlib.import_module(f"{SCRIPTS_PACKAGE}.{name}").main(argv)
    return int(result or 0)


def listing(modes: dict[str, str]) -> str:
    """The --help epilog: every benchmark with its one-line summary."""
    width = max(map(len, [*modes, *script_names()])) + 2
    lines = ["modes (a live deployment, the options above):"]
    lines += [f"  {name:<{width}}{text}" for name, text in modes.items()]
    lines += ["", "benchmark scripts (each with its own options: thinkserve-bench NAME --help):"]
    lines += [f"  {name:<{width}}{summary(name)}" for name in script_names()]
    return "\n".join(lines)
