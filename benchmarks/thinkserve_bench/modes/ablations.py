"""Ablations: the pipeline's per-request switches, each measured for latency, cost and page recall, in one run.

The baseline takes the Complex route (every stage its policy allows: graph at 2 hops, rerank, page images with
the VLM filter, perception, decomposition); each ablation changes one switch of the baseline (or lets the router
choose). Questions are interleaved across configurations (question 1 under every configuration, then question 2,
...) with the configuration order rotating, so drift on a shared machine spreads evenly; each query runs alone
on the server with Triton's statistics snapshotted around it. Recall: the share of a question's expected pages
among the first 5 evidence items (generated or replayed questions with expected pages only).

Switches that need another deployment (dynamic batching off, the int8 embedder, and when named the old queue
policy; benchmarks/thinkserve_bench/variants.py)
run against a deployment of their own, started in the same run and loaded with the same documents, with the
baseline's options: their queries are interleaved with the others like any configuration. Dynamic batching
matters when requests meet, which one query alone on the server rarely shows, so those deployments (and the
baseline's) also get closed-loop throughput windows at a fixed concurrency, in the order A B C C B A to spread
drift.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ..record import QueryRecord, page_recall
from ..session import BenchSession
from ..summary import paired_ok, recall_summary, summarize
from ..workload import VISUAL_STAGES, WorkloadQuestion

RECALL_K = 5
DEPLOYMENT_VARIANTS = ("dynamic batching off", "int8 embedder")  # benchmarks/thinkserve_bench/variants.py, BY_DEFAULT
NAMED_VARIANTS = ("queue policy",)  # started only when --ablations names them
BASELINE = "complex (all stages)"
# rerank=True and the visual stages: a profile whose cross-encoder, page encoders and VLM have no say (tiny) would
# not run them otherwise
ALL_STAGES: dict[str, Any] = {"route": "complex", "rerank": True, **VISUAL_STAGES}
ABLATIONS: dict[str, dict[str, Any]] = {
    BASELINE: ALL_STAGES,
    "router decides": {key: value for key, value in ALL_STAGES.items() if key != "route"},
    "no graph": {**ALL_STAGES, "graph": False},
    "no sparse": {**ALL_STAGES, "sparse": False},
    "dense only": {**ALL_STAGES, "sparse": False, "graph": False},
    "no rerank": {**ALL_STAGES, "rerank": False},
    "no page images": {**ALL_STAGES, "page_images": False},
    "perception off": {**ALL_STAGES, "perception": "off"},
    "end-to-end VLM": {**ALL_STAGES, "perception": "end_to_end"},
    "LLM answerer": {**ALL_STAGES, "answerer": "llm"},
    "LLM, no uncertainty loop": {**ALL_STAGES, "answerer": "llm", "uncertainty": False},
}


async def run_ablations(session: BenchSession, questions: Sequence[WorkloadQuestion], rounds: int = 1,
                        common: Optional[dict[str, Any]] = None, names: Optional[Sequence[str]] = None,
                        variants: Optional[dict[str, BenchSession]] = None, variant_notes: Optional[dict[str, dict]] = None,
                        throughput_concurrency: int = 0) -> dict:
    """`variants`: deployment-level configurations, each a session on its own deployment, run with the
    baseline's options. `throughput_concurrency` > 0: closed-loop windows at that concurrency for the
    baseline and each variant."""
    variants = dict(variants or {})
    chosen = {name: ABLATIONS[name] for name in (names or ABLATIONS) if name in ABLATIONS}
    if BASELINE not in chosen:
        chosen = {BASELINE: ABLATIONS[BASELINE], **chosen}
    unknown = set(names or ()) - set(ABLATIONS) - set(variants) - set(DEPLOYMENT_VARIANTS) - set(NAMED_VARIANTS)
    options = {name: {**(common or {}), **switches} for name, switches in chosen.items()}
    sessions = {name: session for name in options}
    for label, other in variants.items():
        options[label], sessions[label] = options[BASELINE], other
    labels = list(options)
    for label in labels:
        await sessions[label].warm_up(questions[:1], options[label])
    records: dict[str, list] = {label: [] for label in labels}
    session.progress(f"ablations: {len(labels)} configurations x {len(questions) * rounds} questions, interleaved")
    for round_number in range(rounds):
        for i, question in enumerate(questions):
            shift = (i + round_number) % len(labels)
            for label in labels[shift:] + labels[:shift]:
                records[label].append(await sessions[label].sequential(question, label, options[label]))
    configs = compare_configurations(records, options, questions)
    for label in variants:
        configs[label]["deployment"] = (variant_notes or {}).get(label, {})
    throughput = {}
    if throughput_concurrency > 0 and variants:
        throughput = await throughput_windows({BASELINE: session, **variants}, questions, options[BASELINE], throughput_concurrency)
    missing = [name for name in DEPLOYMENT_VARIANTS + NAMED_VARIANTS
               if name not in variants and (name in names if names else name in DEPLOYMENT_VARIANTS)]
    return {"mode": "ablations", "rounds": rounds, "questions": len(questions), "recall_k": RECALL_K,
            "server_stats": session.server_stats, "baseline": BASELINE, "configs": configs,
            "deployment_variants": list(variants), "throughput": throughput,
            "unknown_names": sorted(unknown),
            "not_in_this_run": [f"{name}: needs a deployment of its own, which only a self-started run makes" for name in missing]}


def compare_configurations(records: dict[str, list[QueryRecord]], options: dict[str, dict[str, Any]],
                           questions: Sequence[WorkloadQuestion]) -> dict[str, dict]:
    """Each configuration's summary and page recall over all its queries, and its ratios to the baseline over
    the questions both answered (records of every configuration are in the same question order)."""
    by_question = {q.id: q for q in questions}
    configs = {}
    for label, rs in records.items():
        recall = recall_summary([(r.question_type, page_recall(r, by_question[r.question_id].expected_pages, RECALL_K)) for r in rs])
        mine, theirs = paired_ok(rs, records[BASELINE])
        s, base = summarize(mine, by_route=False), summarize(theirs, by_route=False)
        configs[label] = {
            "options": options[label], "summary": summarize(rs, by_route=False), "recall": recall,
            "records": [r.as_dict() for r in rs],
            "versus_baseline": {
                "questions": len(mine),
                "latency_p50": _ratio(s["client"]["p50_ms"], base["client"]["p50_ms"]),
                "cost": _ratio(s["cost"].get("hardware_usd_per_query"), base["cost"].get("hardware_usd_per_query")),
                "tokens": _ratio(s["cost"].get("tokens_per_query"), base["cost"].get("tokens_per_query")),
            },
        }
    return configs


async def throughput_windows(sessions: dict[str, BenchSession], questions: Sequence[WorkloadQuestion], options: dict[str, Any],
                             concurrency: int) -> dict:
    """Closed-loop throughput of each deployment at one concurrency: windows in the order A B C C B A, pooled."""
    from .load import closed_level

    order = list(sessions) + list(reversed(sessions))
    levels: dict[str, list[dict]] = {label: [] for label in sessions}
    for n, label in enumerate(order):
        sessions[label].progress(f"ablations: throughput of {label!r} at concurrency {concurrency} (window {n + 1}/{len(order)})")
        levels[label].append(await closed_level(sessions[label], questions, concurrency, options, offset=n * 5))
    out = {}
    for label, windows in levels.items():
        completed, wall = sum(w["completed"] for w in windows), sum(w["wall_s"] for w in windows)
        out[label] = {"concurrency": concurrency, "windows": len(windows), "completed": completed, "wall_s": wall,
                      "throughput_qps": completed / wall if wall else 0.0,
                      "errors": sum(w["errors"] for w in windows), "rejected": sum(w["rejected"] for w in windows),
                      "per_window_qps": [w["throughput_qps"] for w in windows],
                      "latency_p50_ms_per_window": [w["latency"]["client"]["p50_ms"] for w in windows],
                      "batches": _batches(windows)}
    baseline = out[next(iter(sessions))]  # the first deployment given is the baseline
    for row in out.values():
        row["versus_baseline"] = _ratio(row["throughput_qps"], baseline["throughput_qps"])
    return out


def _batches(windows: list[dict]) -> dict[str, dict[str, int]]:
    """Executions per batch size per leaf model, summed over the windows (shows whether batching happened)."""
    out: dict[str, dict[str, int]] = {}
    for window in windows:
        for model, row in (window.get("server") or {}).items():
            for size, count in row["batches"].items():
                out.setdefault(model, {})
                out[model][size] = out[model].get(size, 0) + count
    return {m: dict(sorted(b.items(), key=lambda kv: int(kv[0]))) for m, b in sorted(out.items())}


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def markdown(payload: dict) -> str:
    from ..mode_reports import _counts, _ms, _usd, header

    r = payload["result"]
    lines = header("Ablations: one switch at a time, in one run", payload)
    lines += [
        f"{r['questions']} questions x {r['rounds']} round(s) under each configuration, interleaved, each query alone on "
        f"the server. Ratios are against `{r['baseline']}` on the same questions in the same run. Recall: expected pages "
        f"among the first {r['recall_k']} evidence items (a failed query found none). The x baseline ratios are over the "
        "questions both the configuration and the baseline answered.", "",
        "| configuration | ok | p50 ms | p95 ms | x baseline latency | $ / 1,000 queries | x baseline cost | tokens / query | recall@5 | answers | degraded |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for label, data in r["configs"].items():
        s, v = data["summary"], data["versus_baseline"]
        c = s["cost"]
        recall = data["recall"]["recall"]
        lines.append(
            f"| {label} | {s['ok']}/{s['queries']} | {_ms(s['client']['p50_ms'])} | {_ms(s['client']['p95_ms'])} | {_x(v['latency_p50'])} | "
            f"{_usd(c.get('hardware_usd_per_1000_queries'))} | {_x(v['cost'])} | {c.get('tokens_per_query', 0):,.0f} | "
            f"{'' if recall is None else f'{recall:.2f}'} | {_counts(s['answer_sources'])} | {s['degraded']} |"
        )
    for label in r.get("deployment_variants", []):
        note = r["configs"][label].get("deployment", {})
        agreement = note.get("embedding_agreement")
        lines += ["", f"`{label}`: its own Triton + orchestrator in this run, serving {note.get('repository', '')} "
                  f"(models changed: {', '.join(note.get('models_changed', []))}), loaded with the same documents, asked "
                  f"with the baseline's options."]
        if agreement:
            lines += [f"Embeddings int8 vs fp32 on {agreement['texts']} texts (questions and evidence): mean cosine "
                      f"{agreement['mean_cosine']:.4f}, 5th percentile {agreement['p5_cosine']:.4f}, min {agreement['min_cosine']:.4f}."]
    if r.get("throughput"):
        t = r["throughput"]
        first = next(iter(t.values()))
        lines += ["", f"Throughput of the deployments, closed loop at concurrency {first['concurrency']} with the baseline's "
                  f"options, {first['windows']} windows each in the order A B C C B A (pooled: completed / measured seconds):", "",
                  "| deployment | throughput q/s | x baseline | per window q/s | p50 ms per window | errors | rejected |",
                  "|---|---:|---:|---|---|---:|---:|"]
        for label, row in t.items():
            lines.append(f"| {label} | {row['throughput_qps']:.3f} | {_x(row['versus_baseline'])} | "
                         f"{', '.join(f'{q:.2f}' for q in row['per_window_qps'])} | "
                         f"{', '.join('' if v is None else f'{v:,.0f}' for v in row['latency_p50_ms_per_window'])} | "
                         f"{row['errors']} | {row['rejected']} |")
        lines += ["", "Batch sizes Triton executed in those windows (size x executions), embedder and reranker:", ""]
        for label, row in t.items():
            shown = {m: b for m, b in row["batches"].items() if m in ("text_embedder_encode", "reranker_score")}
            lines.append(f"- {label}: " + "; ".join(f"{m} " + " ".join(f"{k}x{v}" for k, v in b.items()) for m, b in shown.items()))
    if r["not_in_this_run"]:
        lines += ["", "Not in this run: " + "; ".join(r["not_in_this_run"])]
    lines += [""]
    if "plots" in payload:
        lines += [f"![{name}]({path})" for name, path in payload["plots"].items()] + [""]
    return "\n".join(lines)


def _x(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.2f}x"
