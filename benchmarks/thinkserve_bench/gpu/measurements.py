"""The device runner's measurements: every model through the real Triton and in-process PyTorch, in one run.

    python -m thinkserve_bench.gpu.measurements --repository R --install-root I --model-env M --device cuda \\
        --parts encoders,generators,mix [--quick] --out DIR

(run_on_device.py prepares R, I and M and passes them.) Triton is started by the project's launcher on the
models the parts need (a hard-linked copy of those model folders, served_models.py), with the model environment
given. The parts, each a module of its own:

- **encoders** (encoder_measurements.py): each network model of the repository (embedder, cross-encoder, page text and image towers; the
  router's classifier where the profile has one) at batch 1, 8 and 32, called directly with the same token ids or
  pixels both ways: through Triton (one request of `batch` rows at a time; at the largest batch also 4 in flight)
  and in-process (thinkserve_backend.torch_modules.load_network: the module, device and dtype the served model
  runs). Throughput is rows per second of sequential calls; Triton's share = 1 - Triton / in-process. Before
  anything, the embedder's ensemble (text in: BYTES through the tokenizer step) is checked against the network
  fed the same ids, and every network's Triton output against the in-process one.
- **generators** (generator_measurements.py): the LLM and the VLM (one image, its positions counted in the prompt) with prompts of exactly
  `--prompt-tokens` positions (1,024) and `--new-tokens` (128) greedy tokens, at 1, 8 and 32 concurrent streams:
  through Triton (grpc streams) and in-process (the served model's scheduling on the same checkpoint: the same
  InflightBatcher over a BatchDecoder of the served rows when it batches in flight, else TorchKVCacheDecoder and
  decoding.generate in a thread pool as large as the served model's; kept and warmed before anything is timed). TTFT (submit to first token, queueing in the pool included) and tokens per second (all streams' tokens
  over a round's wall time), each level in rounds until both paths' tokens/s are known within --generator-precision
  (95% interval) or the rounds run out; for every stream, where the two paths' tokens first differ and the
  in-process logit margins there.
- **mix** (call_mix.py): a cost run's recorded model calls (--cost, the routed questions) replayed by the ceiling mode's replay
  (thinkserve_bench.modes.ceiling: the pipeline's phases, branches and concurrency per question) against this
  Triton, per route (Simple, Moderate, Complex), closed loop at concurrency 1, 4 and 16: model-bound queries/s and model time per query (p50,
  p95); cost per query at the price table's H100 and H200 rates; an end-to-end estimate per route = the cost run's
  own orchestrator time (measured on the CPU machine) + this model time, labelled an estimate.
- **e2e** (end_to_end.py): the real orchestrator (a child process serving gRPC, given this Triton) ingests the
  carried corpus, then the cost run's questions go through its Query RPC with their routes pinned, Simple, Moderate
  then Complex at each concurrency (1, 8, 32): queries/s, latency p50/p95, the pipeline's model and orchestrator
  time, $ per query at the GPU rates, failures by gRPC code.

Every unit (an encoder row, a generator level, a replay level) carries `observed`: Triton's per-model statistics
over it (queue, compute input / infer / output, busy time) and the GPU's utilisation sampled by nvidia-smi
(observation.py). Triton's command-line flags are recorded, and its log is copied beside the results as it grows
(triton_log.py).

Results are written after every unit of work (`gpu-<parts>.json`, then `.md`), so a command stopped at its time
limit still returns what it measured; `--deadline` (from run_on_device) skips what would not finish in time, and
work running into it is cut there, not waited for.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from pathlib import Path
from typing import Awaitable, Callable, Optional

from orchestrator.config import TritonSettings
from orchestrator.triton.client import TritonClient
from orchestrator.triton.installation import repository_uses_gpu
from orchestrator.triton.launcher import TritonServer, gpu_flags

from ..machine import machine_facts
from . import gpu_report
from .call_mix import measure_mix
from .encoder_measurements import measure_encoders, round_trip_check
from .end_to_end import measure_end_to_end
from .generator_measurements import measure_generators
from .observation import GpuSampler, ServerStatistics, UnitObserver
from .options import DEFAULT_COST, PARTS, ROOT, Options
from .served_models import measured_networks, model_names, models_for, serving_repository
from .triton_log import TritonLogMirror


def device_facts(device: str) -> dict:
    """The machine's facts (thinkserve_bench.machine), with torch's version, CUDA's, the device measured on, its
    memory and the dtype the served models run in."""
    import torch

    base = machine_facts()
    facts = {**base, "torch": torch.__version__, "cuda": torch.version.cuda, "device": device,
             "cpu_count": base["logical_cores"]}
    if device == "cuda" and torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        facts.update(gpu=torch.cuda.get_device_name(0), gpu_memory_gib=round(total / 2**30, 1),
                     dtype="bfloat16")
    else:
        facts.update(gpu="none", dtype="float32")
    return facts


class Results:
    """The run's results, written to disk after every unit of work."""

    def __init__(self, out: Path, options: Options, repository: Path):
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.stem = "gpu-" + "-".join(options.parts)
        self.data: dict = {
            "kind": "thinkserve-gpu-measurements", "dry_run": options.device != "cuda", "parts": list(options.parts),
            "repository": str(repository), "profile": _profile_of(repository), "machine": device_facts(options.device),
            "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in options.__dict__.items() if k != "deadline"},
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "encoders": [], "generators": [], "mix": {}, "e2e": {}, "notes": [],
        }

    def save(self) -> None:
        for suffix, text in ((".json", json.dumps(self.data, indent=2, default=str) + "\n"), (".md", gpu_report.markdown([self.data]))):
            path = self.out / (self.stem + suffix)
            path.with_suffix(suffix + ".tmp").write_text(text)
            path.with_suffix(suffix + ".tmp").replace(path)


def _profile_of(repository: Path) -> str:
    name = repository.name.removeprefix("repo-")
    return name.rsplit("-", 1)[0] if name.endswith(("-cuda", "-cpu")) else name


async def run(args, options: Options, progress: Callable[[str], None]) -> int:
    results = Results(args.out, options, args.repository)
    if args.carry_json:  # what the command carried, as run_on_device measured it (pack.command_carry)
        results.data["carry"] = json.loads(args.carry_json)
    results.save()
    # the measured encoders time their execute's stages (thinkserve_backend.stage_times), read back per row
    timed = {network: {"stage_timing": "true"} for network in measured_networks(args.repository, options)} \
        if "encoders" in options.parts else {}
    serving = serving_repository(args.repository, models_for(args.repository, options), args.work / "serving", timed)
    settings = TritonSettings(
        model_repository=serving, model_environment=args.model_env, install_root=args.install_root,
        log_dir=args.work / "logs", startup_timeout_s=max(60.0, min(900.0, options.left() - 60)),
        call_timeout_s=600.0, supervise=False,
    )
    server = TritonServer(settings, required=())
    # the flags the launcher gives this repository (the first H200 run had GPU metrics off and no pinned pool)
    results.data["triton"] = {"flags": gpu_flags(repository_uses_gpu(serving))}
    mirror = TritonLogMirror(lambda: server.log_path, args.out / "gpu-triton.log").start()
    sampler = GpuSampler().start()
    began = time.monotonic()
    progress(f"starting tritonserver on {len(model_names(serving))} models ({', '.join(options.parts)})")
    try:
        server.start()
    except Exception as error:
        results.data["error"] = f"Triton did not start: {error}"
        results.save()
        mirror.stop()
        sampler.stop()
        progress(results.data["error"])
        return 1
    results.data["triton_start_s"] = round(time.monotonic() - began, 1)
    results.data["machine"].update(device_facts(options.device))
    progress(f"Triton ready in {results.data['triton_start_s']} s")
    client = TritonClient.from_settings(settings, server.endpoints.grpc)
    observer = UnitObserver(ServerStatistics(server.endpoints.http), sampler)

    def observed(row: dict) -> dict:
        """A row with what the server and the GPU did since the previous row (both paths of the row)."""
        row["observed"] = observer.end()
        return row

    status = 0
    try:
        if "encoders" in options.parts or "mix" in options.parts:
            check = await round_trip_check(client, serving, options.device)
            results.data["round_trip"] = check
            results.save()
            progress(f"round trip (text through the ensemble vs the network vs in-process): {check}")
            if not check["ok"]:
                raise RuntimeError("the round-trip check failed: Triton's answers are wrong, nothing else is measured")
    except Exception as error:  # noqa: BLE001 - what was measured is kept; the error is reported with it
        results.data["error"] = f"{type(error).__name__}: {error}"
        progress(f"error: {results.data['error']}")
        status = 1
    try:
        if status == 0:
            status = await measure_parts(
                options.parts,
                lambda part: _measure_part(part, args, options, client, server, serving, results, observed, observer, progress),
                results, progress,
            )
    finally:
        await client.close()
        server.stop()
        mirror.stop()
        sampler.stop()
        results.data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        results.save()
    return status


async def measure_parts(parts: tuple[str, ...], measure: Callable[[str], Awaitable[None]], results: "Results",
                        progress: Callable[[str], None]) -> int:
    """Each part in turn; a part that fails is recorded (`part_errors`, and the run's first `error`) and the next
    parts still get their time: on a 15-minute lease one broken part must not cost the others' figures."""
    status = 0
    for part in parts:
        try:
            await measure(part)
        except Exception as error:  # noqa: BLE001 - recorded with what was measured
            message = f"{type(error).__name__}: {error}"
            results.data.setdefault("part_errors", {})[part] = message
            results.data.setdefault("error", f"{part}: {message}")
            results.save()
            progress(f"error in {part}: {message}")
            status = 1
    return status


async def _measure_part(part: str, args, options: Options, client: TritonClient, server: TritonServer, serving: Path,
                        results: Results, observed: Callable[[dict], dict], observer: UnitObserver,
                        progress: Callable[[str], None]) -> None:
    """One part, its rows recorded (and the results written) as they come, its seconds recorded at the end."""
    began = time.monotonic()
    progress(f"{part}:")
    observer.begin()
    if part == "encoders":
        await measure_encoders(client, serving, options, lambda row: (results.data["encoders"].append(observed(row)), results.save()), progress,
                               lambda: server.log_path)
    elif part == "generators":
        await measure_generators(client, serving, options, lambda row: (results.data["generators"].append(observed(row)), results.save()), progress)
    elif part == "mix":
        await measure_mix(client, serving, options, lambda key, value: (results.data["mix"].__setitem__(key, value), results.save()), progress,
                          observer)
    elif part == "e2e":
        await measure_end_to_end(server.endpoints.grpc, serving, results.data["profile"], args.work, options,
                                 lambda key, value: (results.data["e2e"].__setitem__(key, value), results.save()), progress,
                                 observer)
    results.data.setdefault("part_seconds", {})[part] = round(time.monotonic() - began, 1)
    results.save()


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m thinkserve_bench.gpu.measurements", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, required=True, help="a torch-target model repository")
    parser.add_argument("--install-root", type=Path, required=True, help="tritonserver's folder (bin/, backends/, stubs)")
    parser.add_argument("--model-env", type=Path, required=True, help="Triton's model environment (numpy 1)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/thinkserve-gpu"))
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--quick", action="store_true", help="shorter windows and 32 generated tokens (about a third of the time)")
    parser.add_argument("--batches", help="encoder batch sizes (default 1,8,32)")
    parser.add_argument("--streams", help="generator concurrent streams (default 1,8,32)")
    parser.add_argument("--prompt-tokens", type=int, help="generator prompt positions (default 1024)")
    parser.add_argument("--new-tokens", type=int, help="generated tokens per stream (default 128; --quick 32)")
    parser.add_argument("--mix-concurrency", help="replay concurrency levels (default 1,4,16)")
    parser.add_argument("--mix-window", type=float, help="measured seconds per replay level")
    parser.add_argument("--networks", help="encoder networks to measure, comma-separated (default: every one)")
    parser.add_argument("--generators", help="generators to measure, comma-separated (default llm,vlm)")
    parser.add_argument("--cost", type=Path, help=f"the cost run to replay (default {DEFAULT_COST.relative_to(ROOT)})")
    parser.add_argument("--source-image-tokens", type=int, help="prompt positions per image of the cost run's VLM (tiny: 36)")
    parser.add_argument("--e2e-concurrency", help="end-to-end concurrent queries per level (default 1,8,32)")
    parser.add_argument("--e2e-window", type=float, help="end-to-end measured seconds per route and level")
    parser.add_argument("--e2e-questions", type=int, help="end-to-end questions replayed per route (default: all)")
    parser.add_argument("--corpus", type=Path, help="the end-to-end knowledge base's inputs (default .gpu-pack/corpus)")
    parser.add_argument("--carry-json", help="what the command carried (run_on_device passes it; recorded)")
    parser.add_argument("--generator-rounds", help="generator rounds per level, MIN,MAX (default 3,10; --quick 3,6)")
    parser.add_argument("--generator-precision", type=float,
                        help="relative half-width of the 95%% interval of tokens/s a level aims at (default 0.05; --quick 0.10)")
    parser.add_argument("--deadline", type=float, default=math.inf, help="epoch seconds: start no work that ends later")
    args = parser.parse_args(argv)
    parts = tuple(p.strip() for p in args.parts.split(",") if p.strip())
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown parts {unknown}; known: {', '.join(PARTS)}")
    overrides: dict = {"deadline": args.deadline}
    if args.networks:
        overrides["networks"] = tuple(n.strip() for n in args.networks.split(",") if n.strip())
    if args.generators:
        overrides["generators"] = tuple(n.strip() for n in args.generators.split(",") if n.strip())
    for name, value in (("batches", args.batches), ("streams", args.streams), ("mix_concurrency", args.mix_concurrency),
                        ("e2e_concurrency", args.e2e_concurrency)):
        if value:
            overrides[name] = tuple(int(v) for v in value.split(","))
    for name, value in (("prompt_tokens", args.prompt_tokens), ("new_tokens", args.new_tokens), ("mix_window_s", args.mix_window),
                        ("cost", args.cost), ("source_image_tokens", args.source_image_tokens),
                        ("e2e_window_s", args.e2e_window), ("e2e_questions", args.e2e_questions), ("corpus", args.corpus)):
        if value is not None:
            overrides[name] = value
    if args.generator_rounds:
        overrides["generator_min_rounds"], overrides["generator_max_rounds"] = (int(v) for v in args.generator_rounds.split(","))
    if args.generator_precision is not None:
        overrides["generator_precision"] = args.generator_precision
    options = Options.quick(parts, args.device, **overrides) if args.quick else Options(parts, args.device, **overrides)
    started = time.monotonic()

    def progress(line: str) -> None:
        print(f"[measure {time.monotonic() - started:6.1f}s] {line}", flush=True)

    return asyncio.run(run(args, options, progress))


if __name__ == "__main__":
    raise SystemExit(main())
