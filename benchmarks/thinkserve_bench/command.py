"""`thinkserve-bench NAME [its options]` (also `python -m thinkserve_bench`): every benchmark behind one command and
one parser, each with the options it declares, and the glue from a mode's arguments to its run and report.

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
    thinkserve-bench SCRIPT [its options]                 a benchmark script of scripts/ (document_qa, ingest, ...;
                                                          catalogue.py)

Every mode takes `thinkserve`'s --config FILE (the deployment's settings), --profile NAME and -v; which other options
a mode reads is declared in mode_options.py. Without --address a mode starts its own deployment (Triton +
orchestrator, --profile/--config) in a child process, ingests the documents (default: the sample report and
generated PDFs) and stops it after.

`thinkserve-bench --help` lists every benchmark, `thinkserve-bench NAME --help` its options; the benchmarks run from
a checkout's root (they read and write benchmarks/results/).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import sys
from dataclasses import dataclass
from typing import Any, Optional

from orchestrator.errors import ConfigurationError

from .mode_options import MICRO_IN_PROCESS, MODE_SUMMARIES, MODES, declare_mode_options

DESCRIPTION = "ThinkServe's benchmarks: modes against a live deployment, and benchmark scripts"


@dataclass
class FrontDoor:
    """The one parser of `thinkserve-bench`, and each benchmark's own (to report its errors under its usage)."""

    parser: argparse.ArgumentParser
    benchmarks: dict[str, argparse.ArgumentParser]


def build_parser(selected: Optional[str] = None) -> FrontDoor:
    """A sub-command per benchmark, its options declared by the benchmark: the modes' from mode_options, a script's
    by its `declare_options`. Only the `selected` script is imported (several import torch or start clients)."""
    from .catalogue import import_script, listing, script_names, summary

    parser = argparse.ArgumentParser(prog="thinkserve-bench", description=DESCRIPTION, epilog=listing(MODE_SUMMARIES),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    names = parser.add_subparsers(dest="benchmark", metavar="NAME", required=True,
                                  help="a mode or a benchmark script (listed below), then its own options")
    benchmarks = {}
    for mode, text in MODE_SUMMARIES.items():
        benchmarks[mode] = names.add_parser(mode, description=text)
        declare_mode_options(benchmarks[mode], mode)
    for name in script_names():
        if name != selected:
            benchmarks[name] = names.add_parser(name, add_help=False)  # listed; parsed only when it is the one named
            continue
        module = import_script(name)
        benchmarks[name] = names.add_parser(name, description=summary(name, width=None),
                                            formatter_class=argparse.RawDescriptionHelpFormatter)
        module.declare_options(benchmarks[name])
    return FrontDoor(parser, benchmarks)


def main(argv: Optional[list[str]] = None) -> int:
    """`thinkserve-bench NAME [its options]`: a mode (errors are one line naming the cause, as `thinkserve`'s; -v:
    the traceback) or a benchmark script (errors in its options are reported under its usage)."""
    from orchestrator.cli.run import run_command

    from .catalogue import UsageError, import_script, name_of, script
    from .result_files import invocation

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and not argv[0].startswith("-"):
        argv[0] = name_of(argv[0])
    door = build_parser(selected=argv[0] if argv else None)
    if argv and argv[0] not in ("-h", "--help") and argv[0].startswith("-"):
        door.parser.error(f"the benchmark's name comes first, then its options: thinkserve-bench NAME {' '.join(argv)}")
    args = door.parser.parse_args(argv)
    if args.benchmark in MODES:
        return run_command("thinkserve-bench", args, cmd_bench)
    name = script(args.benchmark)
    del args.benchmark  # a script sees its own options only (some record vars(args) as their command)
    try:
        result = import_script(name).run_benchmark(args, invocation(name, argv[1:]))
    except UsageError as error:
        door.benchmarks[name].error(str(error))
    return int(result or 0)


def entry() -> int:
    """The installed command: SIGTERM stops a benchmark as Ctrl-C does, so a deployment it started (tritonserver in
    its own session) is stopped too. Not in main(): tests call main() in their own process."""
    signal.signal(signal.SIGTERM, _interrupt)
    return main()


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


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
