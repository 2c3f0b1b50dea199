"""The device runner's Markdown: one or more measurements.py results (the commands of one lease) as one report.

    python -m thinkserve_bench.gpu.gpu_report gpu-encoders-generators.json gpu-mix.json [--setup gpu-setup.json] --output report.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional, Sequence

from ..result_files import read_json

ENCODER_GOAL = 0.10  # Triton's share of encoder throughput at batch 32, at most
GENERATOR_GOAL = 0.5  # Triton's generator tokens/s at 32 streams, at least this share of in-process


def percent(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def number(value: Optional[float], digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def usd(value: Optional[float]) -> str:
    if value is None:
        return "n/a"
    return f"${value:.6f}" if value < 0.01 else f"${value:.4f}"


def _header(results: Sequence[dict], setups: Sequence[dict]) -> list[str]:
    first = results[0]
    machine = first["machine"]
    dry = any(r.get("dry_run") for r in results)
    lines = ["# ThinkServe on a GPU: Triton against in-process PyTorch" if not dry else
             "# CPU dry run of the GPU device runner (tooling check, NOT GPU figures)", ""]
    if dry:
        lines += ["**This ran on a CPU with the tiny profile, to prove the runner's whole flow (pack, unpack, model "
                  "environment, build, the real tritonserver, every measurement, the report). Its numbers describe "
                  "a 2-core CPU and toy models; they say nothing about a GPU.**", ""]
    lines += [
        f"Machine: GPU {machine.get('gpu', 'none')} ({machine.get('gpu_memory_gib', '-')} GiB), {machine.get('cpu_count')} CPU cores; "
        f"torch {machine.get('torch')} (CUDA {machine.get('cuda')}), Python {machine.get('python')}, {machine.get('dtype')}  ",
        f"Repository: profile `{first.get('profile')}`, torch target on `{machine.get('device')}`"
        + ("  (the hf profile's architectures at full size with random weights: stand-ins; tokenizers are the tiny "
           "profile's, whose ids lie inside every larger vocabulary)" if first.get("profile") == "standin" else ""),
        "",
    ]
    for setup in setups:
        steps = setup.get("steps", {})
        lines.append("Setup of a command: " + ", ".join(f"{name} {step['seconds']:.0f} s" for name, step in steps.items())
                     + (f"; error: {setup['error']}" if setup.get("error") else ""))
    for r in results:
        lines.append(f"Command `{'+'.join(r['parts'])}`: Triton ready in {number(r.get('triton_start_s'))} s; parts "
                     + ", ".join(f"{k} {v:.0f} s" for k, v in (r.get("part_seconds") or {}).items())
                     + (f"; **error: {r['error']}**" if r.get("error") else ""))
        check = r.get("round_trip")
        if check:
            lines.append(f"Round trip before measuring: text through the embedder's ensemble vs its network fed the "
                         f"same ids, max |diff| {check['ensemble_vs_network']:.2e}; Triton vs in-process "
                         f"{check['triton_vs_in_process']:.2e}; {'ok' if check['ok'] else 'FAILED'}")
    return lines + [""]


def _encoders(rows: list[dict]) -> list[str]:
    measured = [r for r in rows if "batch" in r]
    if not rows:
        return []
    lines = [
        "## Encoders: Triton against in-process PyTorch, the same inputs",
        "",
        "One request of `batch` rows at a time both ways (sequential calls); Triton's share = 1 - Triton rows/s / "
        "in-process rows/s. `4 in flight`: four such requests outstanding at once (the largest batch only).",
        "",
        "| model | batch | input | in-process rows/s | Triton rows/s | Triton's share | p50 ms in-proc / Triton | "
        "p95 ms in-proc / Triton | 4 in flight rows/s | max abs diff |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in measured:
        i, t, f = r["in_process"], r["triton"], r.get("triton_inflight") or {}
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['input']} | {number(i['rows_per_s'])} | {number(t['rows_per_s'])} | "
            f"{percent(r['triton_share'])} | {number(i['p50_ms'], 2)} / {number(t['p50_ms'], 2)} | "
            f"{number(i['p95_ms'], 2)} / {number(t['p95_ms'], 2)} | {number(f.get('rows_per_s'))} | {r['max_abs_diff']:.1e} |")
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['model']} | skipped: {r['skipped']} | | | | | | | | |")
    largest = max((r["batch"] for r in measured), default=None)
    at_largest = [r for r in measured if r["batch"] == largest]
    if at_largest:
        passed = [r for r in at_largest if r["triton_share"] is not None and r["triton_share"] <= ENCODER_GOAL]
        worst = max(at_largest, key=lambda r: r["triton_share"] if r["triton_share"] is not None else -1)
        lines += ["", f"Goal (Triton's share at batch {largest} <= {percent(ENCODER_GOAL)}): {len(passed)} of "
                      f"{len(at_largest)} models meet it; the largest share is {worst['model']}'s, "
                      f"{percent(worst['triton_share'])}."]
    return lines + [""]


def _generators(rows: list[dict]) -> list[str]:
    measured = [r for r in rows if "in_process" in r]
    if not rows:
        return []
    lines = [
        "## Generators: Triton against in-process PyTorch, the same KV-cache code",
        "",
        "Each stream: a prompt of the stated positions (the VLM's one image included), greedy tokens; in-process, the "
        "same TorchKVCacheDecoder and decoding.generate in a thread pool as large as the served model's. tok/s = all "
        "streams' tokens over the level's wall time; TTFT from submission (queueing for a generation thread included).",
        "",
        "| model | streams | prompt | generated | threads | TTFT p50 ms in-proc / Triton | TTFT p95 ms in-proc / Triton | "
        "tok/s in-proc | tok/s Triton | Triton / in-proc | per-stream tok/s in-proc / Triton | same tokens |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in measured:
        i, t = r["in_process"], r["triton"]
        lines.append(
            f"| {r['model']} | {r['streams']} | {r['prompt_positions']} | {r['new_tokens']} | {r['served_threads']} | "
            f"{number(i.get('ttft_p50_ms'), 0)} / {number(t.get('ttft_p50_ms'), 0)} | "
            f"{number(i.get('ttft_p95_ms'), 0)} / {number(t.get('ttft_p95_ms'), 0)} | {number(i.get('tokens_per_s'))} | "
            f"{number(t.get('tokens_per_s'))} | {number(r.get('throughput_ratio'), 2)} | "
            f"{number(i.get('stream_decode_tokens_per_s'))} / {number(t.get('stream_decode_tokens_per_s'))} | "
            f"{'yes' if r.get('same_tokens') else 'no'} |")
        errors = [*(i.get("errors") or []), *(t.get("errors") or [])]
        if errors:
            lines.append(f"| | errors: {'; '.join(errors)} | | | | | | | | | | |")
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['model']} | {r['streams']} | skipped: {r['skipped']} | | | | | | | | | |")
    largest = max((r["streams"] for r in measured), default=None)
    for r in (r for r in measured if r["streams"] == largest):
        ratio = r.get("throughput_ratio")
        verdict = "meets" if ratio is not None and ratio >= GENERATOR_GOAL else "misses"
        lines.append(f"\nGoal ({r['model']}: Triton's tok/s at {largest} streams within 2x of in-process): {verdict} it "
                     f"(Triton / in-process {number(ratio, 2)}).")
    return lines + [""]


def _mix(mix: dict) -> list[str]:
    if not mix:
        return []
    source = mix.get("source", {})
    rates = source.get("rates_usd_per_hour", {})
    kinds = sorted(rates)
    lines = [
        "## The pipeline's call mix, replayed against this Triton",
        "",
        f"The model calls of {source.get('queries')} recorded queries (`{source.get('command')}`, series "
        f"`{source.get('config')}`; routes {source.get('routes')}) replayed by the ceiling mode's replay, per route, "
        f"closed loop. The VLM's prompt tokens re-counted for {source.get('image_tokens')} positions an image (the run's "
        f"VLM: {source.get('source_image_tokens')}). $ at the price table's rates: "
        + ", ".join(f"{k.upper()} ${v:.2f}/h" for k, v in rates.items()) + " (the whole GPU per deployment-hour).",
        "",
        "| route | concurrency | queries/s | model time p50 ms | p95 ms | queries | errors | "
        + " | ".join(f"$/query {k.upper()} | $/1,000 {k.upper()}" for k in kinds) + " |",
        "|---|---:|---:|---:|---:|---:|---:|" + "---:|" * (2 * len(kinds)),
    ]
    estimates = []
    for route, data in mix.items():
        if route == "source":
            continue
        for level in data["levels"]:
            if "skipped" in level:
                lines.append(f"| {route} | {level['concurrency']} | skipped: {level['skipped']} |" + " |" * (4 + 2 * len(kinds)))
                continue
            prices = " | ".join(f"{usd(level['cost'].get(k, {}).get('usd_per_query'))} | "
                                f"{usd(level['cost'].get(k, {}).get('usd_per_1000_queries'))}" for k in kinds)
            lines.append(f"| {route} | {level['concurrency']} | {number(level['queries_per_s'], 2)} | "
                         f"{number(level['p50_ms'], 0)} | {number(level['p95_ms'], 0)} | {level['completed']} | "
                         f"{level['errors']} | {prices} |")
        estimates.append((route, data))
    lines += ["", "**End-to-end estimate per route (an estimate, not a measurement):** the orchestrator's own time per "
                  "query as the cost run measured it on its CPU machine (p50) + the model time of one query alone "
                  "(concurrency 1) in this run.", "",
              "| route | orchestrator ms (CPU, measured) | model ms (this run, alone, p50) | end-to-end estimate ms | best queries/s |"
              + "".join(f" $/1,000 at best {k.upper()} |" for k in kinds),
              "|---|---:|---:|---:|---:|" + "---:|" * len(kinds)]
    for route, data in estimates:
        alone = next((lv for lv in data["levels"] if "p50_ms" in lv), {})
        best = data.get("best") or {}
        lines.append(f"| {route} | {number(data.get('orchestrator_ms_p50_cpu'))} | {number(alone.get('p50_ms'), 0)} | "
                     f"{number(data.get('end_to_end_estimate_ms'), 0)} | {number(best.get('queries_per_s'), 2)} |"
                     + "".join(f" {usd((best.get('cost') or {}).get(k, {}).get('usd_per_1000_queries'))} |" for k in kinds))
    return lines + [""]


def markdown(results: Sequence[dict], setups: Sequence[dict] = ()) -> str:
    lines = _header(results, setups)
    for r in results:
        lines += _encoders(r.get("encoders") or [])
        lines += _generators(r.get("generators") or [])
        lines += _mix(r.get("mix") or {})
    return "\n".join(lines).rstrip() + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m thinkserve_bench.gpu.gpu_report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, nargs="+", help="measurements.py JSON files (one per command)")
    parser.add_argument("--setup", type=Path, nargs="*", default=[], help="run_on_device's gpu-setup.json files")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    results = [read_json(path) for path in args.results]
    setups = [json.loads(path.read_text()) for path in args.setup]
    args.output.write_text(markdown(results, setups))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
