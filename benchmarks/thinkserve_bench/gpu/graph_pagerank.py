"""Personalized PageRank on the GPU (CuPy, or cuGraph where installed) against the scipy path: same scores,
and the time of each, on random graphs from the size of a 100,000-chunk collection's graph upwards.

    python -m thinkserve_bench.gpu.graph_pagerank [--sizes 16000:130000 262144:1000000 1000000:5000000] [--repeat 5]

Needs a GPU and CuPy; run it on the GPU machine (results come back as gpu_graph.json / .md). For each graph:
  global     PageRank over the whole graph, teleporting to 10 seeds (the case GPU_MIN_NODES routes to the GPU)
  local      PageRank restricted to a 2-hop neighbourhood capped at 2,000 nodes (what a query runs)
Reports the largest absolute score difference between the two engines, and p50 wall times after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from thinkserve_bench.machine import machine_facts
from orchestrator.knowledge.graph.graph import DocumentGraph
from orchestrator.knowledge.graph.merge import build_graph
from orchestrator.knowledge.graph.pagerank import gpu_engine
from orchestrator.knowledge.storage.segments import RelationMention


def random_graph(nodes: int, edges: int, seed: int = 0):
    """A graph of `nodes` entities with about `edges` weighted relations, degrees skewed like real corpora."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, nodes + 1) ** 0.8
    weights /= weights.sum()
    a = rng.choice(nodes, size=edges, p=weights)
    b = rng.integers(0, nodes, size=edges)
    relations = [RelationMention(f"e{x}", f"e{y}", "", "", 1.0, "d:c0") for x, y in zip(a.tolist(), b.tolist()) if x != y]
    return build_graph([DocumentGraph("d", (), relations, ())])


def timed(call, repeat: int) -> tuple[list[float], object]:
    result = call()  # warm-up (CUDA context, kernels, transfers)
    samples = []
    for _ in range(repeat):
        began = time.perf_counter()
        result = call()
        samples.append((time.perf_counter() - began) * 1000)
    return samples, result


def measure(nodes: int, edges: int, repeat: int) -> dict:
    began = time.perf_counter()
    graph = random_graph(nodes, edges)
    built = time.perf_counter() - began
    rng = np.random.default_rng(1)
    seeds = {int(n): float(w) for n, w in zip(rng.choice(graph.node_count, 10, replace=False), rng.random(10) + 0.1)}
    neighbourhood = np.fromiter((n for n, _ in graph.k_hop(sorted(seeds), 2, 2000)), dtype=np.int64)
    out = {"nodes": graph.node_count, "edges": len(graph.edges), "build_s": built}
    for case, restrict in (("global", None), ("local", neighbourhood)):
        cpu_ms, cpu = timed(lambda: graph.personalized_pagerank(seeds, restrict_to=restrict, backend="cpu"), repeat)
        gpu_ms, gpu = timed(lambda: graph.personalized_pagerank(seeds, restrict_to=restrict, backend="gpu"), repeat)
        out[case] = {
            "nodes": graph.node_count if restrict is None else len(restrict),
            "cpu_p50_ms": float(np.median(cpu_ms)),
            "gpu_p50_ms": float(np.median(gpu_ms)),
            "speedup": float(np.median(cpu_ms) / np.median(gpu_ms)),
            "max_abs_diff": float(np.abs(np.asarray(cpu) - np.asarray(gpu)).max()),
            "score_sum_gpu": float(np.asarray(gpu).sum()),
            "top10_same": bool(np.array_equal(np.argsort(-np.asarray(cpu))[:10], np.argsort(-np.asarray(gpu))[:10])),
        }
    return out


def markdown(command: str, machine: dict, engine: str, results: list[dict]) -> str:
    lines = [
        "# Personalized PageRank: GPU against the scipy path",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine['cpu']}, {machine['logical_cores']} logical cores, GPU: {machine['gpu']}; GPU engine: {engine}",
        "",
        "| graph nodes | edges | case | PageRank nodes | scipy p50 ms | GPU p50 ms | GPU speed-up | max abs score diff | same top 10 |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        for case in ("global", "local"):
            c = r[case]
            lines.append(
                f"| {r['nodes']:,} | {r['edges']:,} | {case} | {c['nodes']:,} | {c['cpu_p50_ms']:.2f} | {c['gpu_p50_ms']:.2f} | "
                f"{c['speedup']:.1f}x | {c['max_abs_diff']:.1e} | {c['top10_same']} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["16000:130000", "262144:1000000", "1000000:5000000"])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")))
    args = parser.parse_args()
    engine = gpu_engine()
    if engine is None:
        raise SystemExit("no GPU engine: this benchmark needs a visible GPU with CuPy or cuGraph")
    command = "python -m thinkserve_bench.gpu.graph_pagerank --sizes " + " ".join(args.sizes) + f" --repeat {args.repeat}"
    results = []
    for size in args.sizes:
        nodes, edges = (int(x) for x in size.split(":"))
        results.append(measure(nodes, edges, args.repeat))
        print(json.dumps(results[-1]), flush=True)
    machine = machine_facts()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_graph.json").write_text(json.dumps({"command": command, "machine": machine, "engine": engine, "results": results}, indent=2) + "\n")
    (args.out / "gpu_graph.md").write_text(markdown(command, machine, engine, results))
    print(markdown(command, machine, engine, results))


if __name__ == "__main__":
    main()
