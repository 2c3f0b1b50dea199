"""The Markdown summary of each mode's results (the JSON beside it: result_files.py)."""

from __future__ import annotations

from typing import Optional

# ---------------------------------------------------------------------------------------------- Markdown


def _ms(value: Optional[float], digits: int = 0) -> str:
    return "" if value is None else f"{value:,.{digits}f}"


def _usd(value: Optional[float]) -> str:
    if value is None:
        return ""
    return f"${value:.6f}" if value < 0.01 else f"${value:.4f}"


def _pct(value: Optional[float]) -> str:
    return "" if value is None else f"{100 * value:.1f}%"


def header(title: str, payload: dict) -> list[str]:
    m = payload["machine"]
    lines = [
        f"# {title}",
        "",
        f"Command: `{payload['command']}`  ",
        f"Machine: {m['cpu']}, {m['logical_cores']} logical cores, {m['memory_gib']} GiB, GPU: {m['gpu']}; "
        f"load average at start {', '.join(f'{v:.2f}' for v in m['load_average'])} (a shared machine: other work may "
        "have been running)  ",
        f"Profile: {m['profile']}, config hash {m['config_hash']}, commit {m['git_commit']}, Python {m['python']}  ",
        f"Target: {payload['target']}; Triton statistics: {'yes' if payload['target_triton'] else 'no (no --triton-url)'}  ",
        f"Workload: {payload['workload']['description']}",
        "",
    ]
    return lines


def latency_table(configs: dict) -> list[str]:
    lines = [
        "| configuration | queries | p50 ms | p90 ms | p95 ms | p99 ms | rag_ttft p50 | rag_ttft p95 | LLM TTFT p50 | inter-token p50 | routes taken | answers |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for label, data in configs.items():
        s = data["summary"]
        c = s["client"]
        lines.append(
            f"| {label} | {s['ok']}/{s['queries']} | {_ms(c['p50_ms'])} | {_ms(c['p90_ms'])} | {_ms(c['p95_ms'])} | {_ms(c['p99_ms'])} | "
            f"{_ms(s['rag_ttft']['p50_ms'])} | {_ms(s['rag_ttft']['p95_ms'])} | {_ms(s['llm_ttft']['p50_ms'])} | "
            f"{_ms(s['inter_token']['p50_ms'], 1)} | {_counts(s['routes'])} | {_counts(s['answer_sources'])} |"
        )
    return lines


def _counts(counts: dict) -> str:
    return ", ".join(f"{k or '-'} {v}" for k, v in sorted(counts.items()))


def stage_table(configs: dict) -> list[str]:
    stages = sorted({s for d in configs.values() for s in d["summary"]["stages"]}, key=_stage_order)
    lines = ["| stage (p50 / p95 ms) | " + " | ".join(configs) + " |", "|---|" + "---:|" * len(configs)]
    for stage in stages:
        cells = []
        for d in configs.values():
            v = d["summary"]["stages"].get(stage)
            cells.append(f"{_ms(v['p50_ms'], 1)} / {_ms(v['p95_ms'], 1)}" if v and v["count"] else "")
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    return lines


STAGE_ORDER = ("route", "embed", "dense", "sparse", "graph", "fusion", "retrieval", "rerank", "page_images", "vlm_filter",
               "context", "perception", "uncertainty", "answer", "llm_ttft", "llm_generation", "rag_ttft", "total")


def _stage_order(stage: str) -> int:
    return STAGE_ORDER.index(stage) if stage in STAGE_ORDER else len(STAGE_ORDER)


def server_table(server: Optional[dict], queries: int) -> list[str]:
    if not server:
        return ["Triton's statistics were not available."]
    lines = [
        "| Triton model | requests | executions | mean batch | queue ms / request | compute ms / request | queue share | compute ms / query |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in sorted(server.items(), key=lambda item: -item[1]["compute_ms"]):
        lines.append(
            f"| {name} | {row['requests']} | {row['executions']} | {_ms(row['mean_batch'], 2)} | {_ms(row.get('queue_ms_per_request'), 2)} | "
            f"{_ms(row.get('compute_ms_per_request'), 2)} | {_pct(row.get('queue_share'))} | {_ms(row['compute_ms'] / max(1, queries), 1)} |"
        )
    lines += ["", "Compute ms / request: the duration of the execution that served a request (with dynamic batching, its "
              "whole batch's); compute ms / query: the model's busy time (each execution once) per query."]
    return lines


def cost_table(summaries: dict) -> list[str]:
    lines = [
        "| series | queries | model-seconds / query | $ / query (hardware) | $ / 1,000 queries | hosted-API $ / 1,000 | tokens / query | LLM + VLM tokens / query |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, c in summaries.items():
        if not c.get("queries"):
            continue
        lines.append(
            f"| {label} | {c['queries']} | {c['model_seconds_per_query']:.3f} | {_usd(c['hardware_usd_per_query'])} | "
            f"{_usd(c['hardware_usd_per_1000_queries'])} | {_usd(c['hosted_usd_per_1000_queries'])} | {c['tokens_per_query']:,.0f} | "
            f"{c.get('generative_tokens_per_query', 0):,.0f} |"
        )
    return lines


def latency_markdown(payload: dict) -> str:
    r = payload["result"]
    lines = header("Latency (sequential queries)", payload)
    lines += [
        f"{r['questions']} questions x {r['rounds']} round(s) per configuration, one query at a time, after "
        f"{payload['bench']['warmup_queries']} warm-up queries per configuration (discarded). End-to-end latency is "
        "client-observed (request sent -> final event, monotonic clock); rag_ttft is the pipeline's time to the first "
        "answer text; LLM TTFT and inter-token latency exist only where an LLM or VLM generated the answer.",
        "",
        *latency_table(r["configs"]),
        "",
        "Per-stage time from the pipeline's own timing events:",
        "",
        *stage_table(r["configs"]),
        "",
    ]
    for label, data in r["configs"].items():
        s = data["summary"]
        lines += [f"Triton server-side, configuration `{label}` (the same queries; each query alone on the server):", ""]
        lines += server_table(s["server"], s["ok"]) + [""]
    if "plots" in payload:
        lines += [f"![{name}]({path})" for name, path in payload["plots"].items()] + [""]
    return "\n".join(lines)


def cost_markdown(payload: dict) -> str:
    r = payload["result"]
    prices = r["prices"]
    hw = prices["deployments"][prices["deployment"]]
    lines = header("Cost per query: routed vs always-Complex", payload)
    routed, complex_ = r["configs"]["routed"]["summary"], r["configs"]["complex"]["summary"]
    saving = r["saving_routed_vs_complex"] or {}
    lines += [
        f"{r['questions']} questions x {r['rounds']} round(s), each asked routed and with route=complex in the same run "
        "(interleaved, each query alone on the server). Model-seconds: Triton's compute time per query for every "
        "model it measures, the orchestrator's measured stream time for streaming (decoupled) models. Priced as "
        f"deployment `{prices['deployment']}`: ${hw['usd_per_unit_hour']}/{hw['unit']}-hour x {hw['units_per_model']} "
        "unit(s) per model-second; hosted-API column: the price table's $/1M tokens per model role.",
        "",
        f"What ran: routes taken by the router {_counts(r['routes_taken'])} (decided by {_counts(routed['route_sources'])}); "
        f"answers routed {_counts(routed['answer_sources'])}, complex {_counts(complex_['answer_sources'])}.",
        "",
        *cost_table({"routed": routed["cost"], "always complex": complex_["cost"],
                     **{f"routed, route {k}": v["cost"] for k, v in routed["by_route"].items()}}),
        "",
        f"**Routed saves {_pct(saving.get('hardware_usd_per_query'))} of the hardware cost, "
        f"{_pct(saving.get('generative_tokens_per_query'))} of the LLM + VLM tokens "
        f"({_pct(saving.get('tokens_per_query'))} of all models' tokens, encoders included) and "
        f"{_pct(saving.get('hosted_usd_per_query'))} of the hosted-API cost** against always taking the Complex path "
        f"on the same {r.get('paired_questions', routed['cost'].get('queries', 0))} questions, those answered both ways "
        "(AutoThinkRAG reports 18.2% cost / 18.9% tokens; the goal here is at least 40%). "
        "LLM + VLM tokens are those an API bill counts; the embedder's and reranker's tokens are compute, "
        "priced in model-seconds.",
        "",
        "| question type | routed $ / 1,000 | complex $ / 1,000 | hardware saving | LLM + VLM token saving | all-token saving |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind, row in r["by_question_type"].items():
        lines.append(
            f"| {kind} | {_usd(row['routed']['hardware_usd_per_1000_queries'])} | {_usd(row['complex']['hardware_usd_per_1000_queries'])} | "
            f"{_pct(row['saving'].get('hardware_usd_per_query'))} | {_pct(row['saving'].get('generative_tokens_per_query'))} | "
            f"{_pct(row['saving'].get('tokens_per_query'))} |"
        )
    lines += ["", "Model-seconds per query by model (routed / complex):", "", "| model | routed s | complex s |", "|---|---:|---:|"]
    a, b = routed["cost"].get("model_seconds_per_query_by_model", {}), complex_["cost"].get("model_seconds_per_query_by_model", {})
    for model in sorted(set(a) | set(b)):
        lines.append(f"| {model} | {a.get(model, 0):.3f} | {b.get(model, 0):.3f} |")
    lines += ["", f"Sources: {', '.join(routed['cost'].get('sources', []))}", ""]
    if "plots" in payload:
        lines += [f"![{name}]({path})" for name, path in payload["plots"].items()] + [""]
    return "\n".join(lines)


def load_markdown(payload: dict) -> str:
    r = payload["result"]
    s = r["settings"]
    lines = header("Load: closed-loop sweep and open-loop arrivals", payload)
    lines += [
        f"Each level: {s['warmup_seconds']:g} s warm-up, then a {s['level_seconds']:g} s measured window; throughput counts "
        "queries that ended inside it. Latency percentiles come from raw samples: closed loop, of the queries that ended "
        "inside the window; open loop, of the queries due inside it, each followed to its end and timed from when it was "
        "due (under overload the latest arrivals wait longest and end after the window). SLO for goodput: "
        f"{payload['bench']['slo_ms']:g} ms end to end. Options on every query: {r['options'] or 'server defaults'}. "
        f"Sweep stopped: {r['saturation']}.",
        "",
        "| level | throughput q/s | goodput q/s | p50 ms | p90 ms | p95 ms | p99 ms | rag_ttft p50 | ok | rejected | errors | generator CPU (cores) | loop lag p99 ms | $ / query at this rate |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for level in r["closed_loop"] + r["open_loop"]:
        c = level["latency"]["client"]
        name = level["label"] + (f" (offered {level['offered_qps']:.2f})" if "offered_qps" in level else "")
        lines.append(
            f"| {name} | {level['throughput_qps']:.2f} | {level['goodput_qps']:.2f} | {_ms(c['p50_ms'])} | {_ms(c['p90_ms'])} | "
            f"{_ms(c['p95_ms'])} | {_ms(c['p99_ms'])} | {_ms(level['latency']['rag_ttft']['p50_ms'])} | {level['completed']} | "
            f"{level['rejected']} | {level['errors']} | {level['generator']['cpu_cores']:.2f} | "
            f"{_ms(level['generator']['loop_lag']['p99_ms'], 1)} | {_usd((level.get('cost') or {}).get('usd_per_query_at_throughput'))} |"
        )
    best = r["best_closed_loop"]
    lines += ["", f"Best closed-loop throughput: **{best['throughput_qps']:.2f} q/s** at concurrency {best['concurrency']} "
              f"(goodput {best['goodput_qps']:.2f} q/s): the capacity cost is {_usd(best.get('capacity_usd_per_query'))} "
              "per query. $ / query at this rate: the deployment's hourly price over the queries a level completed per hour."]
    if payload["result"].get("ceiling"):
        lines += ceiling_section(payload["result"]["ceiling"])
    lines += ["", "Batch sizes Triton executed (executions per batch size) at each closed-loop level:", "",
              "| level | " + " | ".join(_batched_models(r)) + " |", "|---|" + "---|" * len(_batched_models(r))]
    for level in r["closed_loop"]:
        server = level.get("server") or {}
        lines.append(f"| {level['label']} | " + " | ".join(
            " ".join(f"{size}x{count}" for size, count in server.get(m, {}).get("batches", {}).items()) for m in _batched_models(r)) + " |")
    lines += ["", "Generator overhead: CPU seconds of the load generator's process per wall second, and how late its event "
              "loop's 10 ms ticker woke (p99). The generator uses asyncio with the grpc.aio client.", ""]
    if "plots" in payload:
        lines += [f"![{name}]({path})" for name, path in payload["plots"].items()] + [""]
    return "\n".join(lines)


def ceiling_section(ceiling: dict) -> list[str]:
    """The model-bound ceiling of a load run: its sweep, end to end as a share of it, and the replay's fidelity."""
    if "error" in ceiling:
        return ["", "## Model-bound ceiling", "", f"The ceiling run failed, so end to end is not compared with it: {ceiling['error']}"]
    lines = ["", "## Model-bound ceiling", "",
             "The same model calls, learned from one pass of the questions through the orchestrator, sent to Triton "
             "directly with the pipeline's concurrency per question (`->` in sequence, `||` side by side, `&` at once), "
             f"closed loop, same window lengths, in this run after the end-to-end levels. Sweep stopped: {ceiling.get('saturation', '')}.", "",
             "| ceiling concurrency | throughput q/s | p50 ms | p95 ms | completed | errors | replay client CPU (cores) |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for lv in ceiling["levels"]:
        cpu = lv.get("client_cpu_cores")
        lines.append(f"| {lv['concurrency']} | {lv['throughput_qps']:.2f} | {_ms(lv['latency']['p50_ms'])} | "
                     f"{_ms(lv['latency']['p95_ms'])} | {lv['completed']} | {lv['errors']} | {'' if cpu is None else f'{cpu:.2f}'} |")
    lines += ["", f"Sweeps: ceiling {ceiling['best_qps']:.2f} q/s at concurrency {ceiling['best_concurrency']}; end to end "
              f"{ceiling['end_to_end_best_qps']:.2f} q/s at concurrency {ceiling.get('end_to_end_best_concurrency', '')}: "
              f"{_pct(ceiling.get('fraction_of_sweeps', ceiling['fraction']))} (measured minutes apart on a shared machine)."]
    paired = ceiling.get("paired")
    if paired:
        lines += ["", "Paired check: each at its best level, windows in the order end to end, ceiling, ceiling, end to end "
                  "(pooled per side), so that both see the same machine:", "",
                  "| window | side | concurrency | throughput q/s | p50 ms | load average |", "|---:|---|---:|---:|---:|---:|"]
        rows = [("end to end", paired["windows"]["end_to_end"][0]), ("ceiling", paired["windows"]["ceiling"][0]),
                ("ceiling", paired["windows"]["ceiling"][1]), ("end to end", paired["windows"]["end_to_end"][1])]
        for n, (side, w) in enumerate(rows, 1):
            lines.append(f"| {n} | {side} | {w['concurrency']} | {w['throughput_qps']:.2f} | {_ms(w['p50_ms'])} | {w['load_average']:.1f} |")
        e, c = paired["windows"]["end_to_end"], paired["windows"]["ceiling"]
        adjacent = [e[0]["throughput_qps"] / c[0]["throughput_qps"] if c[0]["throughput_qps"] else None,
                    e[1]["throughput_qps"] / c[1]["throughput_qps"] if c[1]["throughput_qps"] else None]
        lines += ["", f"**End to end reaches {_pct(paired['fraction'])} of the model-bound ceiling** "
                  f"({paired['end_to_end_qps']:.2f} vs {paired['ceiling_qps']:.2f} q/s, paired windows; windows next to "
                  f"each other: {', '.join(_pct(a) for a in adjacent)})."]
    else:
        lines += ["", f"End to end reaches **{_pct(ceiling['fraction'])}** of the ceiling."]
    if ceiling.get("ceiling_below_end_to_end"):
        lines += ["", "**The ceiling came out below end to end.** When the paired windows straddle 100%, end to end is "
                  "within this machine's noise of what the models alone do (the orchestrator is not what limits "
                  "capacity); the fidelity tables below say whether the replay was lighter or heavier than end to end."]
    if ceiling.get("schedules"):
        lines += ["", "Replay schedules of these questions:", ""] + [f"- `{s}`" for s in ceiling["schedules"]]
    fidelity = ceiling.get("compute_s_per_query")
    if fidelity:
        lines += ["", f"Replay fidelity: Triton compute per query of the replay is {_pct(fidelity['replay_over_end_to_end'])} "
                  "of the end-to-end queries' (below 100%: the replayed inputs are lighter, so the ceiling is "
                  "optimistic and the fraction a lower bound).", "",
                  "| Triton model | end-to-end compute s / query | replay compute s / query |", "|---|---:|---:|"]
        for model in sorted(set(fidelity["end_to_end"]) | set(fidelity["replay"])):
            lines.append(f"| {model} | {fidelity['end_to_end'].get(model, 0):.3f} | {fidelity['replay'].get(model, 0):.3f} |")
    tokens = ceiling.get("completion_tokens_per_query")
    if tokens and (tokens["end_to_end"] or tokens["replay"]):
        lines += ["", "Streaming models (Triton's compute statistics miss their generation): tokens generated per query.", "",
                  "| model | end to end | replay |", "|---|---:|---:|"]
        for model in sorted(set(tokens["end_to_end"]) | set(tokens["replay"])):
            lines.append(f"| {model} | {tokens['end_to_end'].get(model, 0):.1f} | {tokens['replay'].get(model, 0):.1f} |")
    return lines


def _batched_models(result: dict) -> list[str]:
    names = set()
    for level in result["closed_loop"]:
        for name, row in (level.get("server") or {}).items():
            if any(int(size) > 1 for size in row["batches"]):
                names.add(name)
    return sorted(names)
