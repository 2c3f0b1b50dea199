"""Ablations: the pipeline's per-request switches, each measured for latency, cost and page recall, in one run.

The baseline takes the Complex route (every stage its policy allows: graph at 2 hops, rerank, page images with
the VLM filter, perception, decomposition); each ablation changes one switch of the baseline (or lets the router
choose). Questions are interleaved across configurations (question 1 under every configuration, then question 2,
...) with the configuration order rotating, so drift on a shared machine spreads evenly; each query runs alone
on the server with Triton's statistics snapshotted around it. Recall: the share of a question's expected pages
among the first 5 evidence items (generated or replayed questions with expected pages only).

Switches that need another deployment (dynamic batching off, the int8 embedder) are not per-request: they are
not in this run.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ..record import page_recall
from ..session import BenchSession
from ..summary import recall_summary, summarize
from ..workload import WorkloadQuestion

RECALL_K = 5
BASELINE = "complex (all stages)"
ABLATIONS: dict[str, dict[str, Any]] = {
    BASELINE: {"route": "complex"},
    "router decides": {},
    "no graph": {"route": "complex", "graph": False},
    "no sparse": {"route": "complex", "sparse": False},
    "dense only": {"route": "complex", "sparse": False, "graph": False},
    "no rerank": {"route": "complex", "rerank": False},
    "no page images": {"route": "complex", "page_images": False},
    "perception off": {"route": "complex", "perception": "off"},
    "end-to-end VLM": {"route": "complex", "perception": "end_to_end"},
    "LLM answerer": {"route": "complex", "answerer": "llm"},
    "LLM, no uncertainty loop": {"route": "complex", "answerer": "llm", "uncertainty": False},
}


async def run_ablations(session: BenchSession, questions: Sequence[WorkloadQuestion], rounds: int = 1,
                        common: Optional[dict[str, Any]] = None, names: Optional[Sequence[str]] = None) -> dict:
    chosen = {name: ABLATIONS[name] for name in (names or ABLATIONS) if name in ABLATIONS}
    if BASELINE not in chosen:
        chosen = {BASELINE: ABLATIONS[BASELINE], **chosen}
    unknown = set(names or ()) - set(ABLATIONS)
    options = {name: {**(common or {}), **switches} for name, switches in chosen.items()}
    labels = list(options)
    for label in labels:
        await session.warm_up(questions[:1], options[label])
    records: dict[str, list] = {label: [] for label in labels}
    session.progress(f"ablations: {len(labels)} configurations x {len(questions) * rounds} questions, interleaved")
    for round_number in range(rounds):
        for i, question in enumerate(questions):
            shift = (i + round_number) % len(labels)
            for label in labels[shift:] + labels[:shift]:
                records[label].append(await session.sequential(question, label, options[label]))
    by_question = {q.id: q for q in questions}
    configs = {}
    for label, rs in records.items():
        recall = recall_summary([(r.question_type, page_recall(r, by_question[r.question_id].expected_pages, RECALL_K)) for r in rs])
        configs[label] = {"options": options[label], "summary": summarize(rs, by_route=False), "recall": recall,
                          "records": [r.as_dict() for r in rs]}
    base = configs[BASELINE]["summary"]
    for label, data in configs.items():
        s = data["summary"]
        data["versus_baseline"] = {
            "latency_p50": _ratio(s["client"]["p50_ms"], base["client"]["p50_ms"]),
            "cost": _ratio(s["cost"].get("hardware_usd_per_query"), base["cost"].get("hardware_usd_per_query")),
            "tokens": _ratio(s["cost"].get("tokens_per_query"), base["cost"].get("tokens_per_query")),
        }
    return {"mode": "ablations", "rounds": rounds, "questions": len(questions), "recall_k": RECALL_K,
            "server_stats": session.server_stats, "baseline": BASELINE, "configs": configs,
            "unknown_names": sorted(unknown),
            "not_in_this_run": ["dynamic batching on/off and int8 vs fp32 embedder need a differently built model "
                                "repository and their own deployment"]}


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def markdown(payload: dict) -> str:
    from ..report import _counts, _ms, _usd, header

    r = payload["result"]
    lines = header("Ablations: one switch at a time, in one run", payload)
    lines += [
        f"{r['questions']} questions x {r['rounds']} round(s) under each configuration, interleaved, each query alone on "
        f"the server. Ratios are against `{r['baseline']}` on the same questions in the same run. Recall: expected pages "
        f"among the first {r['recall_k']} evidence items.", "",
        "| configuration | p50 ms | p95 ms | x baseline latency | $ / 1,000 queries | x baseline cost | tokens / query | recall@5 | answers | degraded |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for label, data in r["configs"].items():
        s, v = data["summary"], data["versus_baseline"]
        c = s["cost"]
        recall = data["recall"]["recall"]
        lines.append(
            f"| {label} | {_ms(s['client']['p50_ms'])} | {_ms(s['client']['p95_ms'])} | {_x(v['latency_p50'])} | "
            f"{_usd(c.get('hardware_usd_per_1000_queries'))} | {_x(v['cost'])} | {c.get('tokens_per_query', 0):,.0f} | "
            f"{'' if recall is None else f'{recall:.2f}'} | {_counts(s['answer_sources'])} | {s['degraded']} |"
        )
    lines += ["", "Not in this run: " + "; ".join(r["not_in_this_run"]), ""]
    if "plots" in payload:
        lines += [f"![{name}]({path})" for name, path in payload["plots"].items()] + [""]
    return "\n".join(lines)


def _x(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.2f}x"
