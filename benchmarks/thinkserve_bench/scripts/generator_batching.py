"""Tokens/s of the torch target's LLM served by the real tritonserver, with in-flight batching against one
generation per worker thread (the loop it replaced), at 1, 8 and 32 concurrent streams (issue 50).

    thinkserve-bench generator_batching [--repository model_repository/tiny-torch]
        [--streams 1 8 32] [--new-tokens 64] [--prompt-tokens 64] [--rounds 3] [--name generator_batching] [--output DIR]
        [--attention-copy] [--threads-copy N]

One Triton serves two copies of the repository's `llm` (hard links; only their scheduling parameters differ):
`batched`, as the build writes it (in-flight batching, its max_batch_sequences rows), and `per_thread`
(inflight_batching off: max_concurrent_generations worker threads, each running decoding.generate); with
`--attention-copy` a third, `batched_sdpa` (the grouped decode attention off: transformers' sdpa path; where the
model environment's transformers folds grouped heads itself, as 5.23 does, both batched copies run its path); with
`--threads-copy N` another, `batched_N_threads` (N intra-op threads instead of the build's). Each level runs
`--rounds` rounds per copy; rounds are the outer loop (round 1 of every level and copy, then round 2, ...) and which
copy goes first alternates, so every level and copy sees the same load on this shared machine. A round: that many
streams at once over gRPC, each a distinct prompt of about `--prompt-tokens` tokens (each round its own prompts),
greedy, `--new-tokens` tokens each (a random-weight model ends some prompts early at its end-of-sequence id: only
prompts that run to --new-tokens alone are used, so every stream generates as many tokens). Reported per copy and
level: tokens/s of all streams over the rounds' wall time, per-stream tokens/s, time to first token p50/p95 and time
between tokens p50/p95 (arrival gaps of the chunks at the client), and whether every stream's tokens equal those of
the same prompt generated alone by the per-thread copy (greedy decoding: batched must be token-identical).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from orchestrator.config import TritonSettings
from orchestrator.models import contracts
from orchestrator.triton.client import TritonClient
from orchestrator.triton.launcher import TritonServer
from orchestrator.triton.models import _chunks, _strings
from thinkserve_bench.gpu.served_models import parameters, read_config, renamed_copy
from thinkserve_bench.machine import machine_facts
from thinkserve_bench.result_files import RESULTS, uncommitted_changes, write_and_show
from thinkserve_bench.stats import distribution, gaps_ms, ratio

COPIES = {"batched": {}, "per_thread": {"inflight_batching": "false"}}
# --attention-copy: a third copy, batched with transformers' sdpa attention in its decode steps (the grouped decode
# attention off), to compare the two attentions in the same run
SDPA_COPY = ("batched_sdpa", {"grouped_decode_attention": "false"})


def threads_copy(threads: int) -> tuple[str, dict[str, str]]:
    """--threads-copy N: a copy batched as built but with N intra-op threads (the build's is the profile's
    generator_cpu_threads), to compare thread counts in the same run."""
    return f"batched_{threads}_threads", {"intra_op_threads": str(threads)}


def copies_of(options) -> dict[str, dict[str, str]]:
    """The copies served and measured: batched and per_thread, batched_sdpa with --attention-copy, and
    batched_N_threads with --threads-copy N."""
    copies = dict(COPIES)
    if getattr(options, "attention_copy", False):
        copies.update([SDPA_COPY])
    if getattr(options, "threads_copy", None):
        copies.update([threads_copy(options.threads_copy)])
    return copies


WORDS = ("revenue", "factory", "report", "employees", "risk", "growth", "market", "energy", "board", "customers",
         "margin", "plant", "supply", "forecast", "region", "product")


def prompt(index: int, tokens: int) -> str:
    """A distinct chat prompt of about `tokens` tokens (a few words a token in the tiny BPE)."""
    rng = np.random.default_rng(index)
    words = " ".join(rng.choice(WORDS, size=max(1, tokens // 2)))
    return f"<|im_start|>user\nQuestion {index}: {words}?<|im_end|>\n<|im_start|>assistant\n"


async def one_stream(client: TritonClient, model: str, text: str, max_tokens: int) -> dict:
    arrays = {"text_input": _strings([text]), "max_tokens": np.array([[max_tokens]], dtype=np.int32)}
    started = time.monotonic()
    arrivals, tokens = [], []
    async with client.stream(model, arrays) as responses:
        async for chunk in _chunks(responses):
            arrivals.append(time.monotonic())
            tokens += chunk.token_ids
    return {"tokens": tokens, "ttft_ms": (arrivals[0] - started) * 1000 if arrivals else None,
            "gaps_ms": gaps_ms(arrivals), "seconds": (arrivals[-1] - started) if arrivals else 0.0}


async def one_round(client: TritonClient, model: str, prompts: list[str], options) -> dict:
    started = time.monotonic()
    results = await asyncio.gather(*(one_stream(client, model, text, options.new_tokens) for text in prompts))
    return {"wall_s": time.monotonic() - started, "streams": results}


def summary(rounds: list[dict]) -> dict:
    streams = [s for r in rounds for s in r["streams"]]
    tokens = sum(len(s["tokens"]) for s in streams)
    wall = sum(r["wall_s"] for r in rounds)
    per_stream = [len(s["tokens"]) / s["seconds"] for s in streams if s["seconds"] > 0]
    return {
        "tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 1),
        "per_stream_tokens_per_s": round(statistics.median(per_stream), 1) if per_stream else None,
        "ttft_ms": distribution(s["ttft_ms"] for s in streams if s["ttft_ms"] is not None),
        "inter_token_ms": distribution(g for s in streams for g in s["gaps_ms"]),
    }


async def full_length_prompts(client: TritonClient, count: int, options) -> dict[int, list[int]]:
    """`count` prompts that run to --new-tokens alone (a random-weight model ends some early at its end-of-sequence
    id, which would make levels generate different amounts), with the tokens each generates alone through the
    per-thread loop: the reference every stream is compared with."""
    chosen: dict[int, list[int]] = {}
    index = 0
    while len(chosen) < count:
        if index >= 20 * count:
            raise RuntimeError(f"only {len(chosen)} of {20 * count} prompts ran to {options.new_tokens} tokens")
        tokens = (await one_stream(client, "per_thread", prompt(index, options.prompt_tokens), options.new_tokens))["tokens"]
        if len(tokens) == options.new_tokens:
            chosen[index] = tokens
        index += 1
    return chosen


async def measure(endpoint: str, options) -> dict:
    copies = copies_of(options)
    async with TritonClient(endpoint, default_timeout_s=600) as client:
        reference = await full_length_prompts(client, max(options.streams), options)
        pool = list(reference)
        for copy in copies:  # warm-up: first calls pay lazy initialisation
            await one_round(client, copy, [prompt(i, options.prompt_tokens) for i in pool[:2]], options)
        rounds = {streams: {copy: [] for copy in copies} for streams in options.streams}
        used = {streams: {copy: [] for copy in copies} for streams in options.streams}
        for number in range(options.rounds):  # rounds outermost: every level and copy sees the machine's load alike
            for streams in options.streams:
                # each round its own prompts from the pool (a level of one stream is not one prompt's figure)
                chosen = [pool[(number * streams + i) % len(pool)] for i in range(streams)]
                order = list(copies) if number % 2 == 0 else list(reversed(copies))
                for copy in order:
                    rounds[streams][copy].append(
                        await one_round(client, copy, [prompt(i, options.prompt_tokens) for i in chosen], options))
                    used[streams][copy].append(chosen)
            print(f"round {number + 1} of {options.rounds} done", file=sys.stderr)
        levels = []
        for streams in options.streams:
            level = {"streams": streams}
            for copy, measured in rounds[streams].items():
                level[copy] = summary(measured)
                level[copy]["same_tokens_as_alone"] = all(
                    s["tokens"] == reference[i]
                    for r, chosen in zip(measured, used[streams][copy]) for i, s in zip(chosen, r["streams"]))
            level["batched_over_per_thread"] = ratio(level["batched"]["tokens_per_s"], level["per_thread"]["tokens_per_s"])
            if SDPA_COPY[0] in level:
                level["batched_over_batched_sdpa"] = ratio(level["batched"]["tokens_per_s"], level[SDPA_COPY[0]]["tokens_per_s"])
            if getattr(options, "threads_copy", None):
                name = threads_copy(options.threads_copy)[0]
                level["batched_over_threads_copy"] = ratio(level["batched"]["tokens_per_s"], level[name]["tokens_per_s"])
            levels.append(level)
        return {"levels": levels, "reference_tokens": {str(k): v for k, v in reference.items()}}


def report(payload: dict) -> str:
    options, levels = payload["options"], payload["result"]["levels"]
    machine = payload["machine"]
    copies = payload.get("copies") or list(COPIES)  # results before --attention-copy: the two copies
    single = {copy: next((lv[copy]["tokens_per_s"] for lv in levels if lv["streams"] == 1), None) for copy in copies}
    lines = [
        "# The torch target's LLM: in-flight batching against one generation per thread",
        "",
        f"Machine: {machine['cpu']}, {machine['logical_cores']} logical cores, GPU {machine['gpu']}; commit "
        f"{machine['git_commit']}{' (uncommitted changes)' if payload['uncommitted'] else ''}  ",
        f"Model: `{options['repository']}/llm` ({model_shape(payload['model'])}), served by tritonserver on the CPU; "
        f"batched: {payload['parameters']['max_batch_sequences']} rows; per-thread: "
        f"{payload['parameters']['max_concurrent_generations']} worker threads  ",
        f"Each stream: a distinct prompt of about {options['prompt_tokens']} tokens, greedy, up to "
        f"{options['new_tokens']} new tokens; {options['rounds']} rounds per copy and level, rounds outermost, the copies alternating.  ",
        f"Command: `{payload['command']}`",
        "",
        "| streams | copy | tok/s (all streams) | vs 1 stream | per-stream tok/s | TTFT p50 / p95 ms | between tokens p50 / p95 ms | tokens | same tokens as alone |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for level in levels:
        for copy in copies:
            s = level[copy]
            lines.append(
                f"| {level['streams']} | {copy} | {s['tokens_per_s']:,.1f} | {times(ratio(s['tokens_per_s'], single[copy]))} "
                f"| {s['per_stream_tokens_per_s']} | {ms(s['ttft_ms'], 50)} / {ms(s['ttft_ms'], 95)} "
                f"| {ms(s['inter_token_ms'], 50)} / {ms(s['inter_token_ms'], 95)} | {s['tokens']} "
                f"| {'yes' if s['same_tokens_as_alone'] else 'NO'} |"
            )
    lines += ["", "Batched over per-thread, tokens/s: " + ", ".join(
        f"{lv['streams']} streams {times(lv['batched_over_per_thread'])}" for lv in levels)]
    if SDPA_COPY[0] in copies:
        lines += ["", "Batched, the grouped decode attention over transformers' sdpa path, tokens/s: " + ", ".join(
            f"{lv['streams']} streams {times(lv.get('batched_over_batched_sdpa'))}" for lv in levels)]
    if options.get("threads_copy"):
        lines += ["", f"Batched as built (intra_op_threads {payload['parameters'].get('intra_op_threads')}) over "
                      f"{threads_copy(int(options['threads_copy']))[0]}, tokens/s: " + ", ".join(
            f"{lv['streams']} streams {times(lv.get('batched_over_threads_copy'))}" for lv in levels)]
    eight = next((lv for lv in levels if lv["streams"] == 8), None)
    if eight and single["batched"]:
        reached = ratio(eight["batched"]["tokens_per_s"], single["batched"])
        lines += ["", f"Goal (8 streams >= 3x one stream's tokens/s, batched): {times(reached)}: "
                      f"{'meets it' if reached and reached >= 3 else 'does not meet it'}."]
    return "\n".join(lines) + "\n"


def times(value) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def ms(summary: dict, p: int) -> str:
    value = summary.get(f"p{p}_ms")
    return "n/a" if value is None else f"{value:,.1f}"


def model_shape(model: dict) -> str:
    return (f"{(model.get('architectures') or ['?'])[0]}, hidden {model['hidden_size']}, {model['num_hidden_layers']} layers, "
            f"{model['num_attention_heads']} heads / {model['num_key_value_heads']} KV heads, vocabulary {model['vocab_size']:,}")


def declare_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repository", type=Path, default=Path("model_repository/tiny-torch"))
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--name", default="generator_batching")
    parser.add_argument("--output", type=Path, default=RESULTS / "generator_batching")
    parser.add_argument("--model-environment", type=Path, default=Path(".venv-triton"))
    parser.add_argument("--attention-copy", action="store_true",
                        help="also serve batched_sdpa (the grouped decode attention off) and compare it in the same run")
    parser.add_argument("--threads-copy", type=int, default=None, metavar="N",
                        help="also serve batched_N_threads (N intra-op threads) and compare it in the same run")


def run_benchmark(options: argparse.Namespace, command: str) -> None:
    built = parameters(read_config(options.repository, contracts.LLM.name))
    shape = json.loads((options.repository / contracts.LLM.name / "1" / built["config_file"]).read_text())
    with tempfile.TemporaryDirectory(prefix="generator-batching-") as folder:
        repository = Path(folder) / "repository"
        repository.mkdir()
        for copy, overrides in copies_of(options).items():
            renamed_copy(options.repository, contracts.LLM.name, repository, copy, overrides)
        settings = TritonSettings(model_repository=repository, model_environment=options.model_environment, log_dir=Path(folder))
        with TritonServer(settings, required=()) as server:
            result = asyncio.run(measure(server.endpoints.grpc, options))
    payload = {
        "command": command,
        "machine": machine_facts(),
        "copies": list(copies_of(options)),
        "uncommitted": uncommitted_changes(),
        "options": {**vars(options), **{key: str(getattr(options, key)) for key in ("repository", "model_environment", "output")}},
        "model": {key: shape.get(key) for key in ("architectures", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                                  "num_key_value_heads", "vocab_size")},
        "parameters": {key: built.get(key) for key in ("max_batch_sequences", "max_concurrent_generations", "max_context", "intra_op_threads")},
        "result": result,
    }
    write_and_show(options.name, payload, report(payload), options.output)
