"""`thinkserve-bench MODE` (also `python -m thinkserve_bench`): the argparse command and the glue from arguments to
a mode's run and report.

    thinkserve-bench latency|load|cost|ceiling|ablations [--address HOST:PORT --triton-url HOST:PORT]
                     [--collection NAME] [--documents PATH ...] [--workload FILE.jsonl | --questions N --seed S]
                     [--option KEY=VALUE ...] [--bench-config FILE] [--out DIR]
    thinkserve-bench workload --out-file mix.jsonl ...     write the generated question mix for replay
    thinkserve-bench micro [--micro faiss graph] [--vectors N ...] [--graph-chunks N ...]
                                                          FAISS kinds and graph paths in process (micro.py)
    thinkserve-bench standins --from-cost bench-cost.json  a cost run's model calls timed on realistic-size stand-in
                                                          models in PyTorch (the GPU when present; modes/standin_costs.py)
    thinkserve-bench soak [--duration-minutes 120] [--rate Q/S]  hours of questions and document churn against a
                                                          writer and a read replica it starts (`serve`, `serve --read-only`):
                                                          memory, fds, threads, p99 and replica lag over time (modes/soak.py)

Global options as `thinkserve`'s: --config FILE (the deployment's settings), --profile NAME, -v.

Without --address the command starts its own deployment (Triton + orchestrator, --profile/--config) in a child
process, ingests the documents (default: the sample report and generated PDFs) and stops it after.

    thinkserve-bench SCRIPT [its options]                 a benchmark script of scripts/ (document_qa, ingest, ...;
                                                          catalogue.py), also `python -m thinkserve_bench.scripts.SCRIPT`

`thinkserve-bench --help` lists every benchmark; the scripts run from a checkout's root (they read and write
bench/results/).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Optional

from orchestrator.errors import ConfigurationError

MODE_SUMMARIES = {
    "latency": "one query in flight, per configuration and route, with stage and Triton timings",
    "load": "a closed-loop concurrency sweep to saturation and open-loop Poisson arrivals",
    "cost": "cost per query, routed against always-Complex, on the same questions",
    "ceiling": "the model-bound ceiling: the same model calls sent to Triton directly",
    "ablations": "the pipeline's per-request switches: latency, cost and page recall of each",
    "workload": "write the generated question mix for replay (--out-file)",
    "micro": "FAISS index kinds and graph paths in process",
    "standins": "a cost run's model calls timed on realistic-size stand-in models in PyTorch",
    "soak": "hours of questions and document churn against a writer and a read replica",
}
MODES = tuple(MODE_SUMMARIES)
MICRO_IN_PROCESS = ("faiss", "graph")
DEFAULT_OUT = Path("bench/results/bench")
DESCRIPTION = "latency, load, cost-per-query, model-bound ceiling and ablation benchmarks against a live deployment"


def build_parser() -> argparse.ArgumentParser:
    from .catalogue import listing, script_names

    bench = argparse.ArgumentParser(prog="thinkserve-bench", description=DESCRIPTION, epilog=listing(MODE_SUMMARIES),
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_argument("--config", type=Path, help="the deployment's settings file (TOML), as `thinkserve --config`")
    bench.add_argument("--profile", help="model profile (default tiny): serves model_repository/<profile> unless configured")
    bench.add_argument("-v", "--verbose", action="store_true", help="debug logs and tracebacks")
    bench.add_argument("mode", choices=MODES + tuple(script_names()), metavar="NAME",
                       help="a mode or a benchmark script (listed below)")
    target = bench.add_argument_group("target")
    target.add_argument("--address", default="", help="a running orchestrator (default: start one here)")
    target.add_argument("--triton-url", dest="bench_triton_url", default="",
                        help="its Triton's gRPC address, for server-side statistics (automatic when started here)")
    target.add_argument("--token", dest="bench_token", default="", help="bearer token (default: $THINKSERVE_TOKEN)")
    target.add_argument("--collection", default="bench")
    target.add_argument("--documents", nargs="+", type=Path, help="ingest these first (default when started here: "
                        "the sample report and generated PDFs)")
    work = bench.add_argument_group("workload")
    work.add_argument("--workload", type=Path, help="replay questions from a JSONL file (see bench/thinkserve_bench/workload.py)")
    work.add_argument("--questions", type=int, default=24, help="questions in the generated mix")
    work.add_argument("--seed", type=int, default=7)
    work.add_argument("--mix", help="question types and weights, e.g. lookup=3,comparison=1,unanswerable=1")
    work.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                      help="a QueryOptions field sent with every query, e.g. answerer=llm (repeatable)")
    work.add_argument("--rounds", type=int, default=1, help="passes over the questions (sequential modes)")
    work.add_argument("--out-file", type=Path, help="workload mode: where to write the JSONL")
    run = bench.add_argument_group("run")
    run.add_argument("--bench-config", type=Path, help="bench settings TOML: prices, SLO, load levels (bench/thinkserve_bench/prices.py)")
    run.add_argument("--slo-ms", type=float)
    run.add_argument("--concurrency", type=int, nargs="+", help="load/ceiling: these levels instead of the sweep")
    run.add_argument("--concurrency-max", type=int)
    run.add_argument("--ceiling-concurrency-max", type=int, help="load/ceiling: cap of the ceiling's own sweep (default 64)")
    run.add_argument("--qps", type=float, nargs="+", help="load: open-loop target rates (default: fractions of the best closed loop)")
    run.add_argument("--level-seconds", type=float)
    run.add_argument("--warmup-seconds", type=float)
    run.add_argument("--no-open-loop", action="store_true")
    run.add_argument("--no-ceiling", action="store_true", help="load: skip the model-bound ceiling run")
    run.add_argument("--ablations", nargs="+", help="ablations: run only these (default: all, with the deployment "
                     "variants 'dynamic batching off' and 'int8 embedder' when the command starts the deployment)")
    run.add_argument("--int8-repository", type=Path, help="ablations: the int8-embedder build (default: "
                     "model_repository/<profile>-int8, built with thinkserve_build when missing)")
    run.add_argument("--throughput-concurrency", type=int, default=4,
                     help="ablations: closed-loop throughput windows of the baseline and deployment variants (0: none)")
    run.add_argument("--configs", nargs="+", choices=("routed", "simple", "moderate", "complex"),
                     help="latency: these configurations only (default: routed and each forced route)")
    run.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results folder")
    run.add_argument("--name", help="base name of the result files (default: bench-MODE)")
    run.add_argument("--no-plots", action="store_true")
    micro = bench.add_argument_group("micro")
    micro.add_argument("--micro", nargs="+", choices=MICRO_IN_PROCESS,
                       help="micro: which benchmarks (default: faiss graph)")
    micro.add_argument("--vectors", type=int, nargs="+", default=[10_000, 100_000, 1_000_000], help="micro faiss: collection sizes")
    micro.add_argument("--index-kinds", nargs="+", default=["flat", "ivf", "hnsw"], choices=("flat", "ivf", "hnsw"))
    micro.add_argument("--micro-queries", type=int, default=1000, help="micro faiss: questions for recall (300 of them timed)")
    micro.add_argument("--graph-chunks", type=int, nargs="+", default=[10_000, 100_000], help="micro graph: chunks per graph")
    micro.add_argument("--seed-sets", type=int, default=20, help="micro graph: seed sets timed per graph")
    standins = bench.add_argument_group("standins")
    standins.add_argument("--from-cost", type=Path, default=DEFAULT_OUT / "bench-cost.json",
                          help="standins: the cost run whose model calls are replayed")
    standins.add_argument("--standin-concurrency", type=int, nargs="+", default=[1],
                          help="standins: queries whose calls are batched together (1: each query alone)")
    standins.add_argument("--device", default="auto", help="standins: torch device (auto: cuda when present)")
    standins.add_argument("--deployment", help="standins: price-table deployment (default: the GPU's kind, else the table's)")
    standins.add_argument("--source-image-tokens", type=int,
                          help="standins: prompt positions per image of the cost run's VLM (default: read from "
                               "model_repository/<profile>/vlm/config.pbtxt)")
    standins.add_argument("--repeats", type=int, default=3, help="standins: timed calls per shape (median)")
    standins.add_argument("--preset", choices=("hf", "test"), default="hf",
                          help="standins: hf = the hf profile's architectures; test = toy sizes (smoke tests)")
    soak = bench.add_argument_group("soak")
    soak.add_argument("--duration-minutes", type=float, default=120.0, help="soak: the whole run, warm-up included")
    soak.add_argument("--warmup-minutes", type=float, default=10.0, help="soak: left out of the growth fits")
    soak.add_argument("--rate", type=float, help="soak: questions per second (default: --knee-fraction of the "
                      "closed-loop throughput measured first)")
    soak.add_argument("--knee-fraction", type=float, default=0.6)
    soak.add_argument("--churn-interval", type=float, default=30.0, help="soak: mean seconds between document operations")
    soak.add_argument("--churn-slots", type=int, default=4, help="soak: documents that come and go (PDFs and Markdown)")
    soak.add_argument("--sample-interval", type=float, default=10.0, help="soak: seconds between process samples")
    soak.add_argument("--follow-interval", type=float, default=1.0, help="soak: the replica's storage.follow_interval_s")
    return bench


def main(argv: Optional[list[str]] = None) -> int:
    """`thinkserve-bench NAME`: a benchmark script when NAME is one (its own options follow), else a mode. A mode's
    errors are one line naming the cause, as `thinkserve`'s (-v: the traceback)."""
    from orchestrator.cli.run import run_command

    from .catalogue import run_script, script

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and script(argv[0]):
        return run_script(script(argv[0]), argv[1:])
    return run_command("thinkserve-bench", build_parser().parse_args(argv), cmd_bench)


def parse_options(pairs: list[str]) -> dict[str, Any]:
    """KEY=VALUE pairs as QueryOptions values: true/false, integers, floats, else strings."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise ConfigurationError(f"--option {pair!r}: expected KEY=VALUE")
        value: Any = raw
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            for kind in (int, float):
                try:
                    value = kind(raw)
                    break
                except ValueError:
                    pass
        out[key.strip().replace("-", "_")] = value
    from .workload import WorkloadQuestion

    WorkloadQuestion(question="check", options=out)  # unknown fields fail here, with their names
    return out


def parse_mix(text: Optional[str]) -> Optional[dict[str, float]]:
    if not text:
        return None
    mix = {}
    for part in text.split(","):
        kind, _, weight = part.partition("=")
        mix[kind.strip()] = float(weight or 1)
    return mix


def cmd_bench(args) -> int:
    from orchestrator.cli.settings import settings_from_args

    if args.mode not in MODES:
        raise ConfigurationError(f"{args.mode} is a benchmark script: its name comes first and its own options after "
                                 f"(thinkserve-bench {args.mode} --help); the global options are the modes'")

    if args.mode == "micro":
        return run_micro(args, settings_from_args(args))
    if args.mode == "standins":
        return run_standins_mode(args, settings_from_args(args))
    if args.mode == "soak":
        from .soak_command import run_soak_mode

        return run_soak_mode(args, settings_from_args(args), command_line(), bench_settings(args), parse_options(args.option))
    return asyncio.run(run_mode(args, settings_from_args(args)))


def bench_settings(args):
    from .prices import BenchSettings

    bench = BenchSettings.load_file(args.bench_config)
    load = {k: v for k, v in {"concurrency_max": args.concurrency_max, "level_seconds": args.level_seconds,
                              "warmup_seconds": args.warmup_seconds,
                              "ceiling_concurrency_max": args.ceiling_concurrency_max}.items() if v is not None}
    updates: dict[str, Any] = {"load": bench.load.model_copy(update=load)}
    if args.slo_ms is not None:
        updates["slo_ms"] = args.slo_ms
    return bench.model_copy(update=updates)


def command_line() -> str:
    return "thinkserve-bench " + " ".join(shlex.quote(a) for a in sys.argv[1:])


async def run_mode(args, settings) -> int:
    from .runner import Run

    options = parse_options(args.option)
    run = Run(
        mode=args.mode, settings=settings, bench=bench_settings(args), collection=args.collection,
        address=args.address, triton_url=args.bench_triton_url,
        token=args.bench_token or os.environ.get("THINKSERVE_TOKEN", ""), documents=args.documents, workload=args.workload,
        questions=args.questions, seed=args.seed, mix=parse_mix(args.mix), options=options, rounds=args.rounds,
        concurrency=args.concurrency, qps=args.qps, open_loop=not args.no_open_loop, ceiling=not args.no_ceiling,
        ablations=args.ablations, configs=args.configs, out=args.out, name=args.name or f"bench-{args.mode}", plots=not args.no_plots,
        out_file=args.out_file, command=command_line(), int8_repository=args.int8_repository,
        throughput_concurrency=args.throughput_concurrency,
    )
    paths = await run.execute()
    for path in paths:
        print(f"wrote {path}")
    return 0


def run_micro(args, settings) -> int:
    """The in-process micro benchmarks (FAISS, graph) into one report."""
    from .micro import faiss_micro, graph_micro, markdown
    from .prices import BenchSettings
    from .machine import machine_info
    from .result_files import write

    chosen = args.micro or list(MICRO_IN_PROCESS)
    payload: dict[str, Any] = {"command": command_line(), "machine": machine_info(settings, BenchSettings())}
    if "faiss" in chosen:
        payload["faiss"] = faiss_micro(args.vectors, args.index_kinds, args.micro_queries)
    if "graph" in chosen:
        payload["graph"] = graph_micro(args.graph_chunks, args.seed_sets)
    for path in write(args.out, args.name or "bench-micro", payload, markdown(payload)):
        print(f"wrote {path}")
    return 0


def run_standins_mode(args, settings) -> int:
    """Replay a cost run's calls on the stand-ins (no deployment: torch and transformers only)."""
    from .modes.standin_costs import device_deployment, markdown, run_standins, source_image_tokens
    from .machine import machine_info
    from .result_files import read_json, write
    from .standin_timing import TorchTimer

    try:
        cost = read_json(args.from_cost)  # committed gzipped: bench-cost.json finds bench-cost.json.gz
    except (OSError, ValueError) as error:
        raise ConfigurationError(f"--from-cost {args.from_cost}: cannot read a cost result ({error})") from None
    if cost.get("result", {}).get("mode") != "cost":
        raise ConfigurationError(f"--from-cost {args.from_cost}: not a `thinkserve-bench cost` result")
    image_tokens = args.source_image_tokens
    if image_tokens is None:
        image_tokens = source_image_tokens(cost.get("machine", {}).get("profile", settings.profile))
    if image_tokens is None:
        raise ConfigurationError("the cost run's VLM positions per image are unknown here (its model repository is not "
                                 "built): pass --source-image-tokens (the tiny profile's VLM: 36)")
    bench = bench_settings(args)
    timer = TorchTimer(args.preset, args.device, args.repeats, progress=lambda text: print(text, flush=True))
    device_name = timer.device
    if timer.device.startswith("cuda"):
        device_name = timer.torch.cuda.get_device_name()
    deployment = args.deployment or device_deployment(device_name, bench.prices)
    if deployment not in bench.prices.deployments:
        raise ConfigurationError(f"--deployment {deployment!r} has no price (known: {', '.join(bench.prices.deployments)})")
    result = run_standins(cost, timer, bench.prices, deployment, args.standin_concurrency, image_tokens,
                          progress=lambda text: print(text, flush=True))
    result["device_name"] = device_name
    payload = {"command": command_line(), "machine": machine_info(settings, bench), "result": result}
    for path in write(args.out, args.name or "bench-standins", payload, markdown(payload)):
        print(f"wrote {path}")
    return 0


def dump(value) -> str:
    return json.dumps(value, indent=1, default=str)
