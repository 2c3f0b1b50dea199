"""The soak's report: the verdicts first (failed requests, growth per hour, p99 drift, replica lag), then the tables
behind them, and one PNG of every series over time."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

GROWTH_LABELS = {
    "writer_rss_kib": "writer orchestrator RSS", "writer_fds": "writer orchestrator open fds",
    "writer_threads": "writer orchestrator threads", "replica_rss_kib": "replica orchestrator RSS",
    "replica_fds": "replica orchestrator open fds", "replica_threads": "replica orchestrator threads",
    "triton_rss_kib": "tritonserver RSS", "triton_fds": "tritonserver open fds", "triton_threads": "tritonserver threads",
    "stubs_rss_kib": "python stubs RSS, all", "stubs_fds": "python stubs open fds, all",
    "shm_bytes": "Triton's /dev/shm regions", "data_bytes": "data folder",
}


def _value(name: str, value: Optional[float]) -> str:
    if value is None:
        return "-"
    if name.endswith("_kib"):
        return f"{value / 1024:.1f} MiB"
    if name.endswith("_bytes"):
        return f"{value / 2**20:.1f} MiB"
    return f"{value:.0f}"


def _ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.0f}"


def _yes(flag: Optional[bool]) -> str:
    return {True: "**yes**", False: "**NO**", None: "n/a"}[flag]


def markdown(payload: dict) -> str:
    r = payload["result"]
    plan, verdict, machine = r["plan"], r["verdict"], payload["machine"]
    lag = r["replica_lag"]["ms"]
    knee = r.get("knee")
    lines = [
        f"# Soak: {r['seconds'] / 3600:.2f} h of questions and document churn, a writer and a read replica"
        + (" (PARTIAL: the run is still going or was cut short)" if r.get("partial") else ""),
        "",
        f"Command: `{payload['command']}`  ",
        f"Machine: {machine['cpu']}, {machine['logical_cores']} logical cores, {machine['memory_gib']} GiB, GPU: "
        f"{machine['gpu']}, load average at the end {', '.join(f'{x:.1f}' for x in machine['load_average'])}  ",
        f"Commit: {machine.get('git_commit', '')}; profile {machine.get('profile', '')}; corpus: {payload['corpus']}",
        "",
        f"Questions: {r['rate_qps']:.2f}/s open loop (Poisson), alternating writer and replica"
        + (f"; {plan['knee_fraction']:g} x the {knee['queries_per_s']:.2f} q/s measured first in a closed loop at "
           f"{knee['concurrency']} in flight (p50 {_ms(knee['latency']['p50_ms'])} ms)" if knee else " (given)")
        + f". A document operation every {plan['churn_interval_s']:g} s on average on the writer, rotating over "
        f"{plan['churn_slots']} documents (PDFs parsed by MinerU and Markdown): add, replace, delete. Samples every "
        f"{plan['sample_interval_s']:g} s; growth fitted after a {plan['warmup_s'] / 60:g}-minute warm-up. "
        f"Options: {plan['options'] or 'the defaults'}.",
        "",
        "## Verdict",
        "",
        "| goal | result | met |",
        "|---|---|---|",
        f"| no failed request but deliberate 429s | {verdict['failed_requests']} failed of {r['questions']} questions and "
        f"{r['operations']['count']} document operations ({r['rejected_questions']} refused with RESOURCE_EXHAUSTED, "
        f"{r['dropped_by_generator']} dropped by the generator) | {_yes(verdict['failed_requests'] == 0)} |",
    ]
    for name in r["growth_gated"]:
        g = r["growth"][name]
        pct = g.get("pct_per_h")
        lines.append(f"| {GROWTH_LABELS.get(name, name)} flat (< {g['limit_pct_per_h']:g}%/h) | "
                     f"{'-' if pct is None else f'{pct:+.2f}%/h'} ({_value(name, g.get('first'))} -> "
                     f"{_value(name, g.get('last'))}) | {_yes(g.get('flat'))} |")
    ratio = r["p99_ratio"]
    base = r["baseline"]
    worst = "-" if ratio["max"] is None else f"{ratio['max']:.2f}x"
    lines += [
        f"| p99 of every minute within {ratio['limit']:g}x the baseline's | baseline p99 {_ms(base['p99_ms'])} ms "
        f"({base['start_s'] / 60:.0f}-{base['end_s'] / 60:.0f} min); worst later minute "
        f"{worst}, {ratio['minutes_over_limit']} of {ratio['minutes']} "
        f"minutes over | {_yes(verdict['p99_within_limit'])} |",
        f"| the replica follows every change, lag bounded | {r['replica_lag']['count']} changes followed, p50 "
        f"{_s(lag['p50_ms'])}, p95 {_s(lag['p95_ms'])}, max {_s(lag['max_ms'])}; {r['replica_lag']['not_followed']} "
        f"not within {plan['lag_timeout_s']:g} s | {_yes(verdict['replica_followed_every_change'])} |",
        f"| both servers alive at the end | {verdict['servers_alive'] or '-'} | "
        f"{_yes(all(verdict['servers_alive'].values()) if verdict['servers_alive'] else None)} |",
        "",
        "## Growth after the warm-up (least-squares slope)",
        "",
        "| series | samples | at warm-up end (fit) | slope / h | % / h | first | last | min | max |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, g in r["growth"].items():
        if g.get("flat") is None and "samples" not in g:
            continue
        label = GROWTH_LABELS.get(name, name.replace("_rss_kib", " RSS").replace("stub_", "stub "))
        pct = g.get("pct_per_h")
        lines.append(f"| {label} | {g['samples']} | {_value(name, g['level'])} | {_value(name, g['slope_per_h'])} | "
                     f"{'-' if pct is None else f'{pct:+.2f}'} | {_value(name, g['first'])} | {_value(name, g['last'])} | "
                     f"{_value(name, g['min'])} | {_value(name, g['max'])} |")
    lines += [
        "",
        "## Latency and errors",
        "",
        f"All answered questions: p50 {_ms(r['latency_all']['p50_ms'])} ms, p95 {_ms(r['latency_all']['p95_ms'])}, "
        f"p99 {_ms(r['latency_all']['p99_ms'])}, max {_ms(r['latency_all']['max_ms'])} ({r['latency_all']['count']}); "
        + "; ".join(f"{t}: p50 {_ms(d['p50_ms'])}, p99 {_ms(d['p99_ms'])} ({d['count']})"
                    for t, d in r["latency_by_target"].items())
        + f". Degraded answers: {r['degraded_answers']}. Questions by outcome: {r['codes']}.",
        "",
        f"Document operations: {r['operations']['by_kind']}, {r['operations']['failed']} failed; p50 "
        f"{_ms(r['operations']['seconds']['p50_ms'])} ms, max {_ms(r['operations']['seconds']['max_ms'])} ms.",
        "",
        "Replica lag per hour: " + ("; ".join(f"hour {h['hour']}: {h['count']} changes, p50 {h['p50_s']:.2f} s, p95 "
                                              f"{h['p95_s']:.2f} s, max {h['max_s']:.2f} s" for h in r["replica_lag"]["by_hour"])
                                    or "none") + ".",
        "",
        "The servers' own count of finished requests by method and code (their /metrics at the end):",
        "",
    ]
    for role, counts in r["server_request_counts"].items():
        lines.append(f"- {role}: " + (", ".join(f"{k}: {v:.0f}" for k, v in sorted(counts.items()) if isinstance(v, float))
                                      or str(counts)))
    if r["failure_examples"] or r["operations"]["failure_examples"]:
        lines += ["", "Failures (first 20 of each):", ""]
        lines += [f"- question at {q['t']:.0f} s on the {q['target']}: {q['error']}" for q in r["failure_examples"]]
        lines += [f"- {o['kind']} {o['document']} at {o['t']:.0f} s: {o['code']} {o.get('error', '')}"
                  for o in r["operations"]["failure_examples"]]
    lines += ["", "Per 10 minutes (p99 of each minute, its worst; errors by code):", "",
              "| minutes | questions | p50 ms | p99 ms (worst minute) | errors | operations | max lag s |",
              "|---|---:|---:|---:|---|---:|---:|"]
    minutes = r["minutes"]
    for start in range(0, len(minutes), 10):
        block = minutes[start:start + 10]
        p50s = [m["p50_ms"] for m in block if m["p50_ms"] is not None]
        p99s = [m["p99_ms"] for m in block if m["p99_ms"] is not None]
        errors: dict[str, int] = {}
        for m in block:
            for code, n in m["codes"].items():
                errors[code] = errors.get(code, 0) + n
        lags = [m["max_lag_s"] for m in block if m["max_lag_s"] is not None]
        lines.append(f"| {start}-{start + len(block)} | {sum(m['questions'] for m in block)} | "
                     f"{_ms(sorted(p50s)[len(p50s) // 2] if p50s else None)} | {_ms(max(p99s) if p99s else None)} | "
                     f"{errors or '-'} | {sum(m['operations'] for m in block)} | {max(lags) if lags else '-'} |")
    if payload.get("plots"):
        lines += ["", *(f"![{title}]({name})" for title, name in payload["plots"].items())]
    lines.append("")
    return "\n".join(lines)


def _s(ms: Optional[float]) -> str:
    return "-" if ms is None else f"{ms / 1000:.2f} s"


def plot(payload: dict, out: Path, name: str) -> dict:
    """One figure, every panel over the run's minutes: memory, descriptors, threads, latency, lag and errors."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .soak import growth_series

    r = payload["result"]
    series = growth_series(r["samples"])
    figure, axes = plt.subplots(5, 1, figsize=(11, 15), sharex=True)
    warm = r["plan"]["warmup_s"] / 60

    def draw(axis, names, scale, unit, title):
        for key in names:
            if key in series:
                times, values = series[key]
                axis.plot([t / 60 for t in times], [v / scale for v in values], label=GROWTH_LABELS.get(key, key), lw=1)
        axis.axvline(warm, color="grey", ls=":", lw=1)
        axis.set_ylabel(unit)
        axis.set_title(title, fontsize=10)
        axis.legend(fontsize=7, loc="upper left")

    draw(axes[0], ("writer_rss_kib", "replica_rss_kib", "triton_rss_kib", "stubs_rss_kib"), 1024, "MiB",
         "Resident memory (dotted: end of warm-up)")
    draw(axes[1], ("writer_fds", "replica_fds", "triton_fds", "stubs_fds"), 1, "open fds", "Open file descriptors")
    draw(axes[2], ("writer_threads", "replica_threads", "triton_threads"), 1, "threads", "Threads")
    minutes = r["minutes"]
    for key, style in (("p50_ms", "-"), ("p95_ms", "--"), ("p99_ms", ":")):
        points = [(m["minute"] + 0.5, m[key]) for m in minutes if m[key] is not None]
        axes[3].plot([p[0] for p in points], [p[1] for p in points], style, label=key.replace("_ms", ""), lw=1)
    if r["baseline"]["p99_ms"]:
        axes[3].axhline(r["baseline"]["p99_ms"] * r["p99_ratio"]["limit"], color="red", lw=0.8, label="limit (p99)")
    axes[3].set_yscale("log")
    axes[3].set_ylabel("ms")
    axes[3].set_title("Question latency per minute", fontsize=10)
    axes[3].legend(fontsize=7, loc="upper left")
    lags = [(o["t"] / 60, o["lag_s"]) for o in r["operations_raw"] if o.get("lag_s") is not None]
    axes[4].scatter([p[0] for p in lags], [p[1] for p in lags], s=6, label="replica lag (s)")
    errors = [(m["minute"] + 0.5, sum(n for c, n in m["codes"].items() if c != "RESOURCE_EXHAUSTED")) for m in minutes]
    axes[4].bar([p[0] for p in errors], [p[1] for p in errors], width=0.8, color="red", alpha=0.5, label="failed questions")
    axes[4].set_ylabel("s / count")
    axes[4].set_xlabel("minutes")
    axes[4].set_title("Replica lag after each document operation; failed questions per minute", fontsize=10)
    axes[4].legend(fontsize=7, loc="upper left")
    figure.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    file = f"{name}-timeline.png"
    figure.savefig(out / file, dpi=100)
    plt.close(figure)
    return {"over time": file}
