"""What serving the text embedder through Triton costs, against running the same files in-process.

Same tokenizer.json, same ONNX file, same onnxruntime session options and thread count as the Triton models;
all paths measured in one run, interleaved round by round so machine noise hits them alike.

    thinkserve-bench triton_overhead [--triton-url HOST:PORT] [--rounds 6] [--repeat 10]

Reports, per client batch size (1, 8, 32): sentences/s and latency percentiles for
  in-process          tokenizer + onnxruntime in this process (no Triton)
  ensemble            one call to Triton's `text_embedder` ensemble (tokenize step -> encode step)
  two calls           the client calls the tokenize model, then the encode model (two round trips)
  encode step         one call to the encode model alone with pre-tokenised inputs
  concurrent singles  `batch` concurrent one-sentence requests, batched by Triton's dynamic batcher
and the derived overheads: per Triton call, per ensemble step, ensemble versus client-side chaining.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import numpy as np
from google.protobuf import text_format
from thinkserve_backend.sessions import cpu_session
from thinkserve_backend.tokenization import encode, load_tokenizer
from tritonclient.grpc import model_config_pb2

from thinkserve_bench.machine import machine_facts
from thinkserve_bench.result_files import write_results
from thinkserve_bench.stats import summarize
from thinkserve_bench.timed_calls import time_async_calls, time_calls
from orchestrator.config import TritonSettings
from orchestrator.triton.client import TritonClient
from orchestrator.models.contracts import TEXT_EMBEDDER
from orchestrator.triton.launcher import TritonServer

BATCHES = (1, 8, 32)
SAMPLE = Path(__file__).resolve().parents[3] / "samples" / "northwind-2024-annual-report.md"
NAME = "triton_overhead"


def sentences(count: int) -> list[str]:
    text = " ".join(line for line in SAMPLE.read_text().splitlines() if line and not line.startswith("#"))
    found = [s.strip() + "." for s in text.split(". ") if len(s.split()) > 4]
    return [found[i % len(found)] for i in range(count)]


def parameters(repository: Path, model: str) -> dict[str, str]:
    config = text_format.Parse((repository / model / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    return {key: value.string_value for key, value in config.parameters.items()}


async def measure(url: str, repository: Path, rounds: int, repeat: int) -> dict:
    tokenize_params = parameters(repository, "text_embedder_tokenize")
    encode_params = parameters(repository, "text_embedder_encode")
    tokenizer = load_tokenizer(repository / "text_embedder_tokenize" / "1" / "tokenizer.json", int(tokenize_params["max_length"]))
    session = cpu_session(repository / "text_embedder_encode" / "1" / encode_params["onnx_file"], int(encode_params["intra_op_threads"]))
    graph_inputs = [i.name for i in session.get_inputs()]
    samples: dict[tuple[int, str], list[float]] = {}

    async with TritonClient(url, default_timeout_s=120) as client:

        async def triton(model, inputs, output):
            return (await client.infer(model, inputs, [output]))[output]

        for batch in BATCHES:
            texts = sentences(batch)
            strings = np.array([t.encode() for t in texts], dtype=np.object_).reshape(-1, 1)
            arrays = encode(tokenizer, texts)
            feeds = {name: arrays[name] for name in graph_inputs}

            def in_process():
                batch_arrays = encode(tokenizer, texts)
                return session.run(["embedding"], {name: batch_arrays[name] for name in graph_inputs})

            async def two_calls():
                ids = await client.infer("text_embedder_tokenize", {"text": strings})
                return await triton("text_embedder_encode", {name: ids[name] for name in graph_inputs}, "embedding")

            async def concurrent_singles():
                return await asyncio.gather(*(triton(TEXT_EMBEDDER.name, {"text": strings[i : i + 1]}, "embedding") for i in range(batch)))

            # In-process paths are timed synchronously: no event loop or thread hop inflates the baseline.
            local = {
                "in-process": in_process,
                "in-process tokenize": lambda: encode(tokenizer, texts),
                "in-process encode": lambda: session.run(["embedding"], feeds),
            }
            remote = {
                "ensemble": lambda: triton(TEXT_EMBEDDER.name, {"text": strings}, "embedding"),
                "two calls": two_calls,
                "encode step": lambda: triton("text_embedder_encode", feeds, "embedding"),
                "tokenize step": lambda: client.infer("text_embedder_tokenize", {"text": strings}),
            }
            if batch > 1:
                remote["concurrent singles"] = concurrent_singles
            reference = in_process()[0]
            served = await triton(TEXT_EMBEDDER.name, {"text": strings}, "embedding")
            assert float(np.min(np.sum(reference * served, axis=1))) > 0.999, "Triton and in-process disagree"
            for round_index in range(rounds):
                warmup = 3 if round_index == 0 else 1
                for name, call in local.items():
                    samples.setdefault((batch, name), []).extend(time_calls(call, repeat, warmup))
                for name, call in remote.items():
                    samples.setdefault((batch, name), []).extend(await time_async_calls(call, repeat, warmup))
            print(f"batch {batch}: done", file=sys.stderr)
    return {f"{batch}|{name}": summarize(values, batch) for (batch, name), values in samples.items()}


def report(stats: dict, command: str, machine: dict) -> tuple[dict, str]:
    def get(batch, name):
        return stats[f"{batch}|{name}"]

    derived = {}
    for batch in BATCHES:
        inproc, ensemble = get(batch, "in-process"), get(batch, "ensemble")
        derived[batch] = {
            "ensemble_throughput_vs_in_process": ensemble["items_per_s"] / inproc["items_per_s"],
            "triton_call_overhead_ms": get(batch, "encode step")["p50_ms"] - get(batch, "in-process encode")["p50_ms"],
            "overhead_per_ensemble_step_ms": (ensemble["p50_ms"] - inproc["p50_ms"]) / 2,
            "two_calls_minus_ensemble_ms": get(batch, "two calls")["p50_ms"] - ensemble["p50_ms"],
        }
        if batch > 1:
            derived[batch]["concurrent_singles_vs_in_process_batch"] = (
                get(batch, "concurrent singles")["items_per_s"] / inproc["items_per_s"]
            )
    goal = derived[32]["ensemble_throughput_vs_in_process"]
    lines = [
        "# Triton overhead: text embedder (all-MiniLM-L6-v2, fp32)",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine['cpu']}, {machine['logical_cores']} logical cores, {machine['memory_gib']} GiB, GPU: {machine['gpu']}  ",
        f"Commit: {machine['git_commit']}; onnxruntime {machine['packages'].get('onnxruntime')}, tritonserver 2.51 (python backend)",
        "",
        "Closed loop, one request in flight (except 'concurrent singles'); sentences/s from raw samples; all paths",
        "interleaved in the same run. Latencies in ms.",
        "",
        "| batch | path | sentences/s | p50 | p90 | p99 |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for batch in BATCHES:
        for name in ("in-process", "ensemble", "two calls", "encode step", "concurrent singles", "tokenize step", "in-process tokenize", "in-process encode"):
            key = f"{batch}|{name}"
            if key in stats:
                s = stats[key]
                lines.append(f"| {batch} | {name} | {s['items_per_s']:.1f} | {s['p50_ms']:.2f} | {s['p90_ms']:.2f} | {s['p99_ms']:.2f} |")
    lines += ["", "| batch | ensemble / in-process throughput | Triton call overhead (ms, p50) | overhead per ensemble step (ms) | two client calls - ensemble (ms) |", "|---:|---:|---:|---:|---:|"]
    for batch in BATCHES:
        d = derived[batch]
        lines.append(
            f"| {batch} | {d['ensemble_throughput_vs_in_process']:.3f} | {d['triton_call_overhead_ms']:.2f} | "
            f"{d['overhead_per_ensemble_step_ms']:.2f} | {d['two_calls_minus_ensemble_ms']:.2f} |"
        )
    verdict = "met" if goal >= 0.9 else "NOT met"
    lines += ["", f"Goal: the Triton path keeps >= 90% of in-process throughput at batch 32: **{goal:.1%}, {verdict}**.", ""]
    payload = {"benchmark": NAME, "command": command, "machine": machine, "stats": stats, "derived": derived, "goal_batch32_ratio": goal}
    return payload, "\n".join(lines)


def declare_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--triton-url", help="a running Triton serving the tiny repository (default: start one)")
    parser.add_argument("--repository", type=Path, default=Path("model_repository/tiny"))
    parser.add_argument("--model-environment", type=Path, default=Path(".venv-triton"))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=10, help="calls per path per round")
    parser.add_argument("--output", type=Path, default=None, help="results folder (default: benchmarks/results)")


def run_benchmark(args: argparse.Namespace, command: str) -> int:
    server = None
    url = args.triton_url
    if not url:
        server = TritonServer(TritonSettings(model_repository=args.repository, model_environment=args.model_environment))
        url = server.start().grpc
    try:
        stats = asyncio.run(measure(url, args.repository, args.rounds, args.repeat))
    finally:
        if server:
            server.stop()
    payload, markdown = report(stats, command.strip(), machine_facts())
    paths = write_results(NAME, payload, markdown, *( [args.output] if args.output else []))
    print(markdown)
    print(f"written: {', '.join(map(str, paths))}", file=sys.stderr)
    return 0
