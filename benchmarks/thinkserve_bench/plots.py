"""PNG plots of a benchmark's results (matplotlib, headless): per-stage waterfall and latency CDF, latency vs
throughput, batch-size histogram, cost per route, ablation trade-offs. Returns {title: file name}."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

# Leaf stages in pipeline order (retrieval, rag_ttft and total contain others).
WATERFALL_STAGES = ("route", "embed", "dense", "sparse", "graph", "fusion", "rerank", "page_images", "vlm_filter", "context",
                    "perception", "uncertainty", "answer")


def _save(figure, out: Path, name: str) -> str:
    out.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(out / name, dpi=110)
    plt.close(figure)
    return name


def waterfall(configs: dict, out: Path, name: str) -> str:
    """Per configuration, the p50 of each stage laid end to end in pipeline order, and the p50 total as a mark
    (stages that run concurrently, such as the page-image path, make the sum exceed the total)."""
    figure, axis = plt.subplots(figsize=(10, 1.8 + 0.7 * len(configs)))
    colours = plt.get_cmap("tab20").colors
    labels = list(configs)
    for row, label in enumerate(labels):
        stages = configs[label]["summary"]["stages"]
        left = 0.0
        for n, stage in enumerate(WATERFALL_STAGES):
            value = (stages.get(stage) or {}).get("p50_ms")
            if not value:
                continue
            axis.barh(row, value, left=left, color=colours[n % len(colours)], edgecolor="white",
                      label=stage if row == 0 or stage not in axis.get_legend_handles_labels()[1] else None)
            left += value
        total = (stages.get("total") or {}).get("p50_ms")
        if total:
            axis.plot([total], [row], marker="|", markersize=22, color="black")
    axis.set_yticks(range(len(labels)), labels)
    axis.invert_yaxis()
    axis.set_xlabel("ms (p50 per stage, end to end; | = p50 total)")
    axis.set_title("Per-stage waterfall")
    handles, names = axis.get_legend_handles_labels()
    unique = dict(zip(names, handles))
    axis.legend(unique.values(), unique.keys(), fontsize=7, ncol=7, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    return _save(figure, out, name)


def latency_cdf(configs: dict, out: Path, name: str) -> str:
    figure, axis = plt.subplots(figsize=(7, 4))
    for label, data in configs.items():
        samples = sorted(r["client_ms"] for r in data["records"] if r["status"] == "ok")
        if samples:
            axis.plot(samples, np.arange(1, len(samples) + 1) / len(samples), label=label)
    axis.set_xlabel("end-to-end latency, ms (client)")
    axis.set_ylabel("fraction of queries")
    axis.set_title("Latency distribution")
    axis.grid(alpha=0.3)
    axis.legend()
    return _save(figure, out, name)


def latency_vs_throughput(result: dict, out: Path, name: str) -> str:
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for series, marker in (("closed_loop", "o-"), ("open_loop", "s--")):
        levels = sorted((lv for lv in result.get(series, []) if lv["latency"]["client"]["count"]),
                        key=lambda lv: lv["throughput_qps"])
        if not levels:
            continue
        x = [lv["throughput_qps"] for lv in levels]
        for p in ("p50", "p95", "p99"):
            axis.plot(x, [lv["latency"]["client"][f"{p}_ms"] for lv in levels], marker, label=f"{series.replace('_', ' ')} {p}")
        if series == "closed_loop":
            for lv, xv in zip(levels, x):
                axis.annotate(f"c={lv['concurrency']}", (xv, lv["latency"]["client"]["p50_ms"]), fontsize=7,
                              textcoords="offset points", xytext=(3, -10))
    ceiling = result.get("ceiling")
    if ceiling and ceiling.get("best_qps"):
        axis.axvline(ceiling["best_qps"], color="grey", linestyle=":", label="model-bound ceiling")
    axis.set_xlabel("throughput, queries/s")
    axis.set_ylabel("end-to-end latency, ms")
    axis.set_title("Latency vs throughput")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
    return _save(figure, out, name)


def batch_histogram(result: dict, out: Path, name: str) -> str:
    """Executions per batch size, summed over the closed-loop levels, per model that ran any batch above 1."""
    totals: dict[str, dict[int, int]] = {}
    for level in result.get("closed_loop", []):
        for model, row in (level.get("server") or {}).items():
            for size, count in row["batches"].items():
                totals.setdefault(model, {})
                totals[model][int(size)] = totals[model].get(int(size), 0) + count
    models = sorted(totals, key=lambda m: -sum(totals[m].values()))[:8]
    figure, axes = plt.subplots(len(models) or 1, 1, figsize=(7, 1.6 + 1.3 * max(1, len(models))), squeeze=False)
    for axis, model in zip(axes[:, 0], models):
        sizes = sorted(totals[model])
        axis.bar([str(s) for s in sizes], [totals[model][s] for s in sizes], color="tab:blue")
        axis.set_ylabel(model, rotation=0, ha="right", fontsize=8)
    axes[-1, 0].set_xlabel("batch size Triton executed")
    axes[0, 0].set_title("Batch-size histogram (closed-loop levels)")
    return _save(figure, out, name)


def cost_per_route(result: dict, out: Path, name: str) -> str:
    routed = result["configs"]["routed"]["summary"]
    complex_ = result["configs"]["complex"]["summary"]
    bars = {f"routed: {route}": data["cost"] for route, data in routed.get("by_route", {}).items()}
    bars["routed (all)"] = routed["cost"]
    bars["always complex"] = complex_["cost"]
    bars = {k: v for k, v in bars.items() if v.get("queries")}
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = list(bars)
    left.bar(names, [bars[n]["hardware_usd_per_1000_queries"] for n in names], color="tab:green")
    left.set_ylabel("$ per 1,000 queries (model-seconds priced)")
    right.bar(names, [bars[n]["tokens_per_query"] for n in names], color="tab:orange")
    right.set_ylabel("tokens per query")
    for axis in (left, right):
        axis.tick_params(axis="x", rotation=30, labelsize=8)
    figure.suptitle("Cost per route")
    return _save(figure, out, name)


def ablation_tradeoff(result: dict, out: Path, name: str) -> str:
    figure, axis = plt.subplots(figsize=(7.5, 4.5))
    for label, data in result["configs"].items():
        s = data["summary"]
        x, y = s["client"]["p50_ms"], s["cost"].get("hardware_usd_per_1000_queries")
        if x is None or y is None:
            continue
        axis.scatter([x], [y])
        recall = data.get("recall", {}).get("recall")
        axis.annotate(label + (f" (R {recall:.2f})" if recall is not None else ""), (x, y), fontsize=7,
                      textcoords="offset points", xytext=(4, 3))
    axis.set_xlabel("p50 end-to-end latency, ms")
    axis.set_ylabel("$ per 1,000 queries")
    axis.set_title("Ablations: latency vs cost (R = page recall@5)")
    axis.grid(alpha=0.3)
    return _save(figure, out, name)


def plot(mode: str, payload: dict, out: Path, base: str) -> dict[str, str]:
    result = payload["result"]
    if mode == "latency":
        return {"per-stage waterfall": waterfall(result["configs"], out, f"{base}-waterfall.png"),
                "latency distribution": latency_cdf(result["configs"], out, f"{base}-cdf.png")}
    if mode == "load":
        return {"latency vs throughput": latency_vs_throughput(result, out, f"{base}-latency-throughput.png"),
                "batch sizes": batch_histogram(result, out, f"{base}-batch-sizes.png")}
    if mode == "cost":
        return {"cost per route": cost_per_route(result, out, f"{base}-per-route.png"),
                "per-stage waterfall": waterfall(result["configs"], out, f"{base}-waterfall.png")}
    if mode == "ablations":
        return {"ablations": ablation_tradeoff(result, out, f"{base}-tradeoff.png"),
                "per-stage waterfall": waterfall(result["configs"], out, f"{base}-waterfall.png")}
    return {}
