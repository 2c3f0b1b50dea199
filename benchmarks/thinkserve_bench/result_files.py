"""Result files: JSON with every raw figure and the machine it ran on, a Markdown report beside it, the results folder
of the benchmark scripts, and how a run was invoked (so a result says which command and code produced it)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

RESULTS = Path("benchmarks/results")  # the scripts run from the checkout's root
# Raw JSON larger than this is committed gzipped (`gzip -9n`: FILE.json.gz), beside its Markdown report; the
# Markdown stays plain (benchmarks/results/README.md)
COMMITTED_RAW_LIMIT = 32 * 1024


def committed_path(path: Path) -> Path:
    """`path`, or its gzipped form when only that exists: a result named as the run wrote it (FILE.json) is found
    after it was committed compressed (FILE.json.gz)."""
    path = Path(path)
    packed = path.with_name(path.name + ".gz")
    return packed if not path.exists() and path.suffix != ".gz" and packed.exists() else path


def read_json(path: Path):
    """A results file, plain or gzipped (decided by the name found, see committed_path)."""
    found = committed_path(path)
    data = found.read_bytes()
    return json.loads(gzip.decompress(data) if found.suffix == ".gz" else data)


def write(directory: Path, name: str, payload: dict, markdown: str) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    json_path, md_path = directory / f"{name}.json", directory / f"{name}.md"
    json_path.write_text(json.dumps(payload, indent=1, default=_jsonable) + "\n")
    md_path.write_text(markdown)
    return json_path, md_path


def _jsonable(value):
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def write_results(name: str, payload: dict, markdown: str, directory: Path = RESULTS) -> tuple[Path, Path]:
    return write(directory, name, payload, markdown)


def write_and_show(name: str, payload: dict, markdown: str, directory: Path) -> None:
    """Write the results, print the report, and say on stderr where the files went."""
    paths = write_results(name, payload, markdown, directory)
    print(markdown)
    print(f"written: {', '.join(map(str, paths))}", file=sys.stderr)


def uncommitted_changes() -> list[str]:
    """Tracked files that differ from the commit in the machine facts (others may be editing the code measured)."""
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    return status.stdout.splitlines()


def invocation(name: str, argv: list[str]) -> str:
    """How benchmark `name` was run, as typed from the repository root: `thinkserve-bench NAME ...`, or the
    interpreter (path and PYTHONPATH included) when it ran as `python -m thinkserve_bench`."""
    launched = Path(sys.argv[0])
    if not (launched.name == "__main__.py" and launched.parent.name == "thinkserve_bench"):
        return f"thinkserve-bench {name} {' '.join(argv)}".strip()
    interpreter = Path(sys.executable)
    if interpreter.is_relative_to(Path.cwd()):
        interpreter = interpreter.relative_to(Path.cwd())
    prefix = f"PYTHONPATH={os.environ['PYTHONPATH']} " if os.environ.get("PYTHONPATH") else ""
    return f"{prefix}{interpreter} -m thinkserve_bench {name} {' '.join(argv)}".strip()
