"""Cost per query, routed against always-Complex on the same questions in the same run.

Each question runs once routed (the deployment's router) and once with route="complex", the order alternating
from question to question so drift on a shared machine favours neither; each query alone on the server, so
Triton's compute time between two statistics snapshots is that query's own. Savings are taken over the
questions that succeeded both ways (summary.paired_ok); each series' own summary keeps all its queries.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from ..query_costs import savings
from ..session import BenchSession
from ..summary import paired_ok, summarize
from ..workload import VISUAL_STAGES, WorkloadQuestion

CONFIGS: dict[str, dict[str, Any]] = {"routed": {}, "complex": {"route": "complex"}}


async def run_cost(session: BenchSession, questions: Sequence[WorkloadQuestion], rounds: int = 1,
                   common: dict[str, Any] | None = None) -> dict:
    options = {label: {**VISUAL_STAGES, **(common or {}), **overrides} for label, overrides in CONFIGS.items()}
    for label in CONFIGS:
        await session.warm_up(questions, options[label])
    records: dict[str, list] = {label: [] for label in CONFIGS}
    session.progress(f"cost: {len(questions) * rounds} questions, routed and always-complex, interleaved")
    for round_number in range(rounds):
        for i, question in enumerate(questions):
            order = list(CONFIGS) if (i + round_number) % 2 == 0 else list(reversed(CONFIGS))
            for label in order:
                records[label].append(await session.sequential(question, label, options[label]))
    summaries = {label: summarize(rs) for label, rs in records.items()}
    paired = dict(zip(CONFIGS, paired_ok(records["routed"], records["complex"])))
    routed, complex_ = (summarize(paired[label], by_route=False)["cost"] for label in CONFIGS)
    # per question type: what routing saves where
    by_type = {}
    for kind in sorted({r.question_type for r in paired["routed"]}):
        pair = {label: summarize([r for r in rs if r.question_type == kind], by_route=False)["cost"] for label, rs in paired.items()}
        by_type[kind] = {"routed": pair["routed"], "complex": pair["complex"], "saving": savings(pair["routed"], pair["complex"])}
    return {
        "mode": "cost",
        "rounds": rounds,
        "questions": len(questions),
        "server_stats": session.server_stats,
        "prices": session.settings.prices.model_dump(mode="json"),
        "configs": {label: {"options": options[label], "summary": summaries[label], "records": [r.as_dict() for r in rs]}
                    for label, rs in records.items()},
        "paired_questions": len(paired["routed"]),  # succeeded both ways: what the savings are over
        "saving_routed_vs_complex": savings(routed, complex_) if paired["routed"] else None,
        "by_question_type": by_type,
        "routes_taken": dict(Counter(r.route for r in records["routed"] if r.ok)),
    }
