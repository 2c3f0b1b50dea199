"""The options each mode of `thinkserve-bench` declares: one table, from which the front door builds every mode's
own parser, so `thinkserve-bench load --help` shows load's options only and an option a mode does not read is
refused instead of ignored. The modes share their run code (command.py), so a mode gets every option it does not
declare at its default."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
DEFAULT_OUT = Path("benchmarks/results/bench")

# Which modes read an option: the modes that drive a deployment through runner.Run, and those that also take the
# bench settings (prices, SLO, load levels).
RUN = frozenset({"latency", "load", "cost", "ceiling", "ablations", "workload"})
DEPLOYMENT = RUN | {"soak"}
BENCH_SETTINGS = DEPLOYMENT | {"standins"}
EVERY = frozenset(MODES)


@dataclass(frozen=True)
class Option:
    """One command-line option: argparse's flags and keywords, its group in --help and the modes that declare it."""

    flags: tuple[str, ...]
    group: str
    modes: frozenset[str]
    spec: dict[str, Any] = field(default_factory=dict)

    @property
    def dest(self) -> str:
        return self.spec.get("dest") or next(f for f in self.flags if f.startswith("--"))[2:].replace("-", "_")

    @property
    def default(self) -> Any:
        return self.spec.get("default", False if self.spec.get("action") == "store_true" else None)


def _option(group: str, modes: frozenset[str] | set[str], *flags: str, **spec: Any) -> Option:
    return Option(flags, group, frozenset(modes), spec)


OPTIONS = (
    _option("deployment", EVERY, "--config", type=Path, help="the deployment's settings file (TOML), as `thinkserve --config`"),
    _option("deployment", EVERY, "--profile",
            help="model profile (default tiny): serves model_repository/<profile> unless configured"),
    _option("deployment", EVERY, "-v", "--verbose", action="store_true", help="debug logs and tracebacks"),
    _option("target", DEPLOYMENT, "--address", default="", help="a running orchestrator (default: start one here)"),
    _option("target", RUN, "--triton-url", dest="bench_triton_url", default="",
            help="its Triton's gRPC address, for server-side statistics (automatic when started here)"),
    _option("target", RUN, "--token", dest="bench_token", default="", help="bearer token (default: $THINKSERVE_TOKEN)"),
    _option("target", DEPLOYMENT, "--collection", default="bench"),
    _option("target", DEPLOYMENT, "--documents", nargs="+", type=Path,
            help="ingest these first (default when started here: the sample report and generated PDFs)"),
    _option("workload", RUN, "--workload", type=Path,
            help="replay questions from a JSONL file (see benchmarks/thinkserve_bench/workload.py)"),
    _option("workload", DEPLOYMENT, "--questions", type=int, default=24, help="questions in the generated mix"),
    _option("workload", DEPLOYMENT, "--seed", type=int, default=7),
    _option("workload", RUN, "--mix", help="question types and weights, e.g. lookup=3,comparison=1,unanswerable=1"),
    _option("workload", DEPLOYMENT, "--option", action="append", default=[], metavar="KEY=VALUE",
            help="a QueryOptions field sent with every query, e.g. answerer=llm (repeatable)"),
    _option("workload", {"latency", "cost", "ablations"}, "--rounds", type=int, default=1, help="passes over the questions"),
    _option("workload", {"workload"}, "--out-file", type=Path, help="where to write the JSONL"),
    _option("run", BENCH_SETTINGS, "--bench-config", type=Path,
            help="bench settings TOML: prices, SLO, load levels (benchmarks/thinkserve_bench/prices.py)"),
    _option("run", BENCH_SETTINGS, "--slo-ms", type=float),
    _option("run", {"load", "ceiling"}, "--concurrency", type=int, nargs="+", help="these levels instead of the sweep"),
    _option("run", {"load", "ceiling", "soak"}, "--concurrency-max", type=int),
    _option("run", {"load", "ceiling"}, "--ceiling-concurrency-max", type=int,
            help="cap of the ceiling's own sweep (default 64)"),
    _option("run", {"load"}, "--qps", type=float, nargs="+",
            help="open-loop target rates (default: fractions of the best closed loop)"),
    _option("run", {"load", "ceiling", "soak"}, "--level-seconds", type=float),
    _option("run", {"load", "ceiling", "soak"}, "--warmup-seconds", type=float),
    _option("run", {"load"}, "--no-open-loop", action="store_true"),
    _option("run", {"load"}, "--no-ceiling", action="store_true", help="skip the model-bound ceiling run"),
    _option("run", {"ablations"}, "--ablations", nargs="+", help="run only these (default: all, with the deployment "
            "variants 'dynamic batching off' and 'int8 embedder' when the command starts the deployment; the "
            "deployment variant 'queue policy' only when named)"),
    _option("run", {"ablations"}, "--int8-repository", type=Path, help="the int8-embedder build (default: "
            "model_repository/<profile>-int8, built with thinkserve_build when missing)"),
    _option("run", {"ablations"}, "--throughput-concurrency", type=int, default=4,
            help="closed-loop throughput windows of the baseline and deployment variants (0: none)"),
    _option("run", {"latency"}, "--configs", nargs="+", choices=("routed", "simple", "moderate", "complex"),
            help="these configurations only (default: routed and each forced route)"),
    _option("run", EVERY, "--out", type=Path, default=DEFAULT_OUT, help="results folder"),
    _option("run", EVERY, "--name", help="base name of the result files (default: bench-MODE)"),
    _option("run", DEPLOYMENT, "--no-plots", action="store_true"),
    _option("micro", {"micro"}, "--micro", nargs="+", choices=MICRO_IN_PROCESS, help="which benchmarks (default: faiss graph)"),
    _option("micro", {"micro"}, "--vectors", type=int, nargs="+", default=[10_000, 100_000, 1_000_000],
            help="faiss: collection sizes"),
    _option("micro", {"micro"}, "--index-kinds", nargs="+", default=["flat", "ivf", "hnsw"], choices=("flat", "ivf", "hnsw")),
    _option("micro", {"micro"}, "--micro-queries", type=int, default=1000, help="faiss: questions for recall (300 of them timed)"),
    _option("micro", {"micro"}, "--graph-chunks", type=int, nargs="+", default=[10_000, 100_000], help="graph: chunks per graph"),
    _option("micro", {"micro"}, "--seed-sets", type=int, default=20, help="graph: seed sets timed per graph"),
    _option("standins", {"standins"}, "--from-cost", type=Path, default=DEFAULT_OUT / "bench-cost.json",
            help="the cost run whose model calls are replayed"),
    _option("standins", {"standins"}, "--standin-concurrency", type=int, nargs="+", default=[1],
            help="queries whose calls are batched together (1: each query alone)"),
    _option("standins", {"standins"}, "--device", default="auto", help="torch device (auto: cuda when present)"),
    _option("standins", {"standins"}, "--deployment", help="price-table deployment (default: the GPU's kind, else the table's)"),
    _option("standins", {"standins"}, "--source-image-tokens", type=int, help="prompt positions per image of the cost "
            "run's VLM (default: read from model_repository/<profile>/vlm/config.pbtxt)"),
    _option("standins", {"standins"}, "--repeats", type=int, default=3, help="timed calls per shape (median)"),
    _option("standins", {"standins"}, "--preset", choices=("hf", "test"), default="hf",
            help="hf = the hf profile's architectures; test = toy sizes (smoke tests)"),
    _option("soak", {"soak"}, "--duration-minutes", type=float, default=120.0, help="the whole run, warm-up included"),
    _option("soak", {"soak"}, "--warmup-minutes", type=float, default=10.0, help="left out of the growth fits"),
    _option("soak", {"soak"}, "--rate", type=float,
            help="questions per second (default: --knee-fraction of the closed-loop throughput measured first)"),
    _option("soak", {"soak"}, "--knee-fraction", type=float, default=0.6),
    _option("soak", {"soak"}, "--churn-interval", type=float, default=30.0, help="mean seconds between document operations"),
    _option("soak", {"soak"}, "--churn-slots", type=int, default=4, help="documents that come and go (PDFs and Markdown)"),
    _option("soak", {"soak"}, "--sample-interval", type=float, default=10.0, help="seconds between process samples"),
    _option("soak", {"soak"}, "--follow-interval", type=float, default=1.0, help="the replica's storage.follow_interval_s"),
)


def declare_mode_options(parser: argparse.ArgumentParser, mode: str) -> None:
    """Add the options `mode` declares, in their --help groups; every other option's default is set, so the
    modes' shared run code reads one namespace."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for option in OPTIONS:
        if mode in option.modes:
            if option.group not in groups:
                groups[option.group] = parser.add_argument_group(option.group)
            groups[option.group].add_argument(*option.flags, **option.spec)
    parser.set_defaults(mode=mode, **{option.dest: option.default for option in OPTIONS if mode not in option.modes})
