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
        carry = r.get("carry")
        if carry:
            parts = [(k, carry[k]) for k in ("tracked", "untracked", "shared", "tree", "pack", "corpus") if k in carry]
            lines.append(f"Carried by the command (measured from {carry.get('measured', '?')}): **{carry['total'] / 2**20:.1f} MiB** "
                         f"of the 60 MiB goal (64 MiB limit): " + ", ".join(f"{k} {v / 2**20:.1f}" for k, v in parts))
        lines.append(f"Command `{'+'.join(r['parts'])}`: Triton ready in {number(r.get('triton_start_s'))} s; parts "
                     + ", ".join(f"{k} {v:.0f} s" for k, v in (r.get("part_seconds") or {}).items())
                     + _errors(r))
        flags = (r.get("triton") or {}).get("flags")
        if flags is not None:
            lines.append(f"Triton's GPU flags: {' '.join(flags) or 'none'}")
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
    lines += _stage_table(measured)
    lines += _observed_table([(f"{r['model']} batch {r['batch']}", r.get("observed")) for r in measured],
                             "each row since the previous one, both paths (GPU utilisation covers both; Triton's counters "
                             "only its own).")
    return lines + [""]


def _stage_table(rows: list[dict]) -> list[str]:
    """Inside the served model's execute (thinkserve_backend.stage_times), per row and rows per execute."""
    timed = [(r, rows_per_execute, means) for r in rows for rows_per_execute, means in (r.get("triton_stages") or {}).items()]
    if not timed:
        return []
    lines = ["", "Inside Triton's `execute` of the served model (`stage_timing`: mean ms per execute; the forward pass waited "
                 "for on a GPU, so its time is the device's): rows per execute, executions, inputs out of the requests, onto "
                 "the device, the forward pass, the responses made.", "",
             "| model | batch | rows per execute | executions | inputs | to device | forward | outputs |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r, rows_per_execute, means in timed:
        lines.append(f"| {r['model']} | {r['batch']} | {rows_per_execute} | {int(means['executions'])} | "
                     + " | ".join(number(means.get(f"{stage}_ms"), 2) for stage in ("inputs", "to_device", "forward", "outputs")) + " |")
    return lines


def _decode_steps(rows: list[dict]) -> list[str]:
    """The in-process decode step alone: as served (CUDA graphs on a GPU) against eager, ms a step by running rows."""
    if not rows:
        return []
    columns = sorted({n for r in rows for by_rows in r["decode_step_ms"].values() for n in by_rows}, key=int)
    lines = ["", "The decode step alone, in process, as served and eagerly at exact shapes (ms a step, 20 steps after 3 "
                 "untimed, at the prompt's length; by running rows):", "",
             "| model | decode step | " + " | ".join(f"{n} rows" for n in columns) + " |",
             "|---|---|" + "---:|" * len(columns)]
    for r in rows:
        for mode, by_rows in r["decode_step_ms"].items():
            lines.append(f"| {r['model']} | {mode} | " + " | ".join(number(by_rows.get(n), 2) for n in columns) + " |")
    return lines


def _decode_kernels(rows: list[dict]) -> list[str]:
    """One eager decode step's device time by kernel, per attention (the served one, and sdpa's copying path)."""
    if not rows:
        return []
    lines = ["", "One decode step's device time, eagerly at exact shapes (torch.profiler: kernels on a GPU, operators on a "
                 "CPU), with the attention served and, where that is the project's grouped decode attention, with "
                 "transformers' sdpa path (which then copies key/value heads), at the largest level's rows:", "",
             "| model | rows | attention | ms a step | largest kernels (ms a step, calls) |", "|---|---:|---|---:|---|"]
    for r in rows:
        found = r["decode_step_kernels"]
        for attention, step in found["by_attention"].items():
            top = "; ".join(f"`{k['kernel'][:70]}` {k['ms']:.2f} ({k['calls']})" for k in step["top"][:4])
            lines.append(f"| {r['model']} | {found['rows']} | {attention} | {step['ms']:.2f} | {top} |")
    return lines


def _errors(result: dict) -> str:
    """The command's failures: each part's (a failed part leaves the next ones their time), or its one error."""
    if result.get("part_errors"):
        return "; **failed: " + "; ".join(f"{part}: {error}" for part, error in result["part_errors"].items()) + "**"
    return f"; **error: {result['error']}**" if result.get("error") else ""


def _scheduling(row: dict) -> str:
    """How the served model (and the in-process side with it) scheduled generations: its rows, or its threads."""
    if row.get("batch_rows"):
        step = f", decode step {row['decode_step']}" if row.get("decode_step") else ""  # rows of earlier runs: eager
        return f"{row['batch_rows']} rows (batched{step})"
    return f"{row['served_threads']} threads"


def _generators(rows: list[dict]) -> list[str]:
    measured = [r for r in rows if "in_process" in r]
    if not rows:
        return []
    lines = [
        "## Generators: Triton against in-process PyTorch, the same KV-cache code",
        "",
        "Each stream: a prompt of the stated positions (the VLM's one image included), greedy tokens; in-process, the "
        "served model's scheduling on the same checkpoint: with in-flight batching (`scheduling`), the same "
        "InflightBatcher over a BatchDecoder of the served rows; otherwise TorchKVCacheDecoder and decoding.generate in "
        "a thread pool as large as the served model's (rows before issue 50 have no `scheduling`: that). Either is kept "
        "for the whole part and warmed before anything is timed. A level runs in rounds (both paths each); "
        "tok/s = all streams' tokens over a round's wall time, the mean of the rounds with the half-width of its 95% "
        "interval; TTFT from submission (queueing for a generation thread included), over every round's streams. "
        "Rows without rounds are from a runner before issue 57 (one round, an in-process pool made per level).",
        "",
        "| model | streams | prompt | generated | threads / rows | rounds | TTFT p50 ms in-proc / Triton | TTFT p95 ms in-proc / Triton | "
        "tok/s in-proc | tok/s Triton | Triton / in-proc | per-stream tok/s in-proc / Triton | tokens differ |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in measured:
        i, t = r["in_process"], r["triton"]
        lines.append(
            f"| {r['model']} | {r['streams']} | {r['prompt_positions']} | {r['new_tokens']} | {_scheduling(r)} | "
            f"{r.get('rounds', 1)} | {number(i.get('ttft_p50_ms'), 0)} / {number(t.get('ttft_p50_ms'), 0)} | "
            f"{number(i.get('ttft_p95_ms'), 0)} / {number(t.get('ttft_p95_ms'), 0)} | {_rate(i)} | {_rate(t)} | "
            f"{number(r.get('throughput_ratio'), 2)}{_relative(r.get('throughput_ratio_relative'))} | "
            f"{number(i.get('stream_decode_tokens_per_s'))} / {number(t.get('stream_decode_tokens_per_s'))} | "
            f"{_differ(r)} |")
        errors = [*(i.get("errors") or []), *(t.get("errors") or [])]
        if errors:
            lines.append(f"| | errors: {'; '.join(errors)} | | | | | | | | | | | |")
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['model']} | {r['streams']} | skipped: {r['skipped']} | | | | | | | | | | |")
    lines += _decode_steps([r for r in rows if "decode_step_ms" in r])
    lines += _decode_kernels([r for r in rows if "decode_step_kernels" in r])
    lines += [f"\n{r['model']}'s decode step was not profiled: {r['decode_step_kernels_error']}."
              for r in rows if "decode_step_kernels_error" in r]
    largest = max((r["streams"] for r in measured), default=None)
    for r in (r for r in measured if r["streams"] == largest):
        ratio = r.get("throughput_ratio")
        verdict = "meets" if ratio is not None and ratio >= GENERATOR_GOAL else "misses"
        lines.append(f"\nGoal ({r['model']}: Triton's tok/s at {largest} streams within 2x of in-process): {verdict} it "
                     f"(Triton / in-process {number(ratio, 2)}{_relative(r.get('throughput_ratio_relative'))}).")
    lines += _divergences(measured)
    lines += _observed_table([(f"{r['model']} {r['streams']} streams", r.get("observed")) for r in measured],
                             "Generators are decoupled models: Triton's compute time stops when a stream starts, so "
                             "their queue time is what it shows; GPU utilisation covers both paths of the row.")
    return lines + [""]


def _rate(path: dict) -> str:
    interval = path.get("tokens_per_s_interval") or {}
    return f"{number(path.get('tokens_per_s'))}{_relative(interval.get('relative'))}"


def _relative(relative: Optional[float]) -> str:
    return "" if relative is None else f" ±{100 * relative:.0f}%"


def _differ(row: dict) -> str:
    summary = row.get("divergence_summary")
    if summary is None:  # a runner before issue 57 compared the first stream only
        return "no" if row.get("same_tokens") else "yes (first stream; where not recorded)"
    if not summary["diverged"]:
        return "no"
    margins = ("" if summary["margin_min"] is None else
               f", top-2 margin {summary['margin_min']:.3g}-{summary['margin_max']:.3g}")
    return f"{summary['diverged']} of {summary['streams']} streams, from token {summary['earliest']}{margins}"


def _divergences(rows: list[dict]) -> list[str]:
    parted = [(r, s) for r in rows for s in r.get("divergence") or [] if s.get("first_divergent_token") is not None]
    if not parted:
        return []
    lines = ["", "Where the greedy tokens part (first round; in-process logits replayed on its own thread, as it "
                 "stepped): the step, both tokens, the gap between the in-process model's two largest logits there and "
                 "between its logits of the two tokens. A small gap points at numerics (bf16 kernels, batch or "
                 "reduction order), a large one at another cause.", "",
             "| model | streams | stream | first differing token | in-process / Triton token | top-1 minus top-2 logit | "
             "in-process minus Triton logit | replay chose the in-process token |",
             "|---|---:|---:|---:|---|---:|---:|---|"]
    for r, s in parted:
        replayed = "top1_minus_top2" in s
        lines.append(
            f"| {r['model']} | {r['streams']} | {s['stream']} | {s['first_divergent_token']} | "
            f"{s.get('in_process_token')} / {s.get('triton_token')} | "
            + (f"{s['top1_minus_top2']:.4g} | {number(s.get('in_process_minus_triton'), 4)} | "
               f"{'yes' if s.get('replay_matches') else 'no'} |" if replayed else f"{s.get('margin', 'n/a')} | | |"))
    return lines


def _observed_table(units: list[tuple[str, Optional[dict]]], note: str) -> list[str]:
    """What the server and the GPU did in each unit (observation.py), where the run recorded it."""
    units = [(name, observed) for name, observed in units if observed]
    if not units:
        return []
    lines = ["", "Server side, per unit: " + note, "",
             "| unit | seconds | GPU utilisation mean / max | GPU memory max MiB | Triton per model: requests, queue / "
             "compute input / infer / output ms per request |", "|---|---:|---:|---:|---|"]
    for name, observed in units:
        gpu = observed.get("gpu") or {}
        gpu_cells = (f"{gpu['utilization_mean_pct']:.0f}% / {gpu['utilization_max_pct']:.0f}% | {gpu['memory_used_max_mib']:,.0f}"
                     if gpu.get("available") else f"n/a ({gpu.get('reason', 'not sampled')}) | n/a")
        triton = observed.get("triton") or {}
        models = triton.get("error") or "; ".join(
            f"{model} {m['requests']}, {m['queue_ms_per_request']:.2f} / {m['compute_input_ms_per_request']:.2f} / "
            f"{m['compute_infer_ms_per_request']:.2f} / {m['compute_output_ms_per_request']:.2f}" for model, m in triton.items())
        lines.append(f"| {name} | {observed.get('window_s', 0):.1f} | {gpu_cells} | {models or 'none'} |")
    return lines


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
        "| route | concurrency | queries/s | model time p50 ms | p95 ms | queries | errors (abandoned) | "
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
                         f"{level['errors']}{' (' + str(level['abandoned']) + ')' if level.get('abandoned') else ''} | {prices} |")
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
    lines += _observed_table([(f"{route} at {level['concurrency']}", level.get("observed")) for route, data in estimates
                              for level in data["levels"]], "each replay level (its warm-up included).")
    return lines + [""]


def _end_to_end(e2e: dict) -> list[str]:
    if not e2e:
        return []
    source, deployment = e2e.get("source", {}), e2e.get("deployment", {})
    knowledge = deployment.get("knowledge_base", {})
    units = e2e.get("units") or []
    kinds = sorted({k for u in units for k in (u.get("cost") or {})})
    lines = [
        "## End to end: questions through the real orchestrator, against this Triton",
        "",
        f"The orchestrator's deployment (FAISS, graph, the query pipeline; a child process serving gRPC) started in "
        f"{number(deployment.get('orchestrator_start_s'))} s against this Triton and ingested the carried corpus through "
        f"its Ingest RPC: {len(knowledge.get('documents', []))} documents, {knowledge.get('pages', '?')} pages, "
        f"{knowledge.get('passages', '?')} passages in {number(knowledge.get('seconds'))} s. Questions: the cost run "
        f"`{source.get('command')}` ({source.get('questions')}), each with the route its router chose pinned and "
        f"options {source.get('options')}. Closed loop per route and concurrency; latency is the client's, request to "
        f"final event; model and orchestrator time are the pipeline's own per query; $ = the whole GPU's hourly rate "
        f"at that throughput.",
        "",
        "| concurrency | route | queries/s | p50 ms | p95 ms | model ms p50 | orchestrator ms p50 | queries | failed (by code) "
        "| cancelled at close | " + " | ".join(f"$/query {k.upper()}" for k in kinds) + " |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---|---:|" + "---:|" * len(kinds),
    ]
    for u in units:
        if "skipped" in u:
            lines.append(f"| {u['concurrency']} | {u['route']} | skipped: {u['skipped']} |" + " |" * (7 + len(kinds)))
            continue
        failed = ", ".join(f"{code} {n}" for code, n in (u.get("errors_by_code") or {}).items()) or "0"
        lines.append(f"| {u['concurrency']} | {u['route']} | {number(u['queries_per_s'], 2)} | {number(u['latency_p50_ms'], 0)} | "
                     f"{number(u['latency_p95_ms'], 0)} | {number(u['model_ms_p50'], 0)} | {number(u['orchestrator_ms_p50'], 1)} | "
                     f"{u['completed']} | {failed} | {u['cancelled_at_close']} | "
                     + " | ".join(usd((u.get('cost') or {}).get(k, {}).get('usd_per_query')) for k in kinds) + " |")
    messages = sorted({m for u in units for m in u.get("error_messages", [])})[:5]
    if messages:
        lines += ["", "Failures: " + "; ".join(messages)]
    return lines + [""]


def markdown(results: Sequence[dict], setups: Sequence[dict] = ()) -> str:
    lines = _header(results, setups)
    for r in results:
        lines += _encoders(r.get("encoders") or [])
        lines += _generators(r.get("generators") or [])
        lines += _mix(r.get("mix") or {})
        lines += _end_to_end(r.get("e2e") or {})
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
