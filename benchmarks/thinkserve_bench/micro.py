"""Micro benchmarks of the retrieval internals, in process, on the product's own code.

FAISS (orchestrator/knowledge/storage/indexes.py's VectorIndex and IndexSpec, the builders a collection uses): Flat,
IVF and HNSW at several collection sizes of 384-d vectors. Recall@10 of each approximate index against the
exact Flat index's top 10 (Flat on inner product is exact), and the latency of one query at a time (as the
pipeline searches one question), p50/p95/p99 from raw samples; each kind at its product default and at a few
search breadths (IVF nprobe, HNSW efSearch) for the recall-latency trade-off. IVF trains on a sample (FAISS
k-means on every vector of a million would take most of an hour on two cores): VectorIndex.build on the
sample, then `extended` with the rest, both the product's code; the list count is the product's default
(4 sqrt(n)) for the full size. Vectors: benchmarks/thinkserve_bench/scripts/synthetic_collection.py's model (chunks mixing Zipf-drawn
entities), generated here in blocks so that a million fit in memory.

Graph (orchestrator/knowledge/graph/graph.py's CSR path against networkx on the same graph): co-occurrence graphs
shaped like benchmarks/thinkserve_bench/scripts/synthetic_collection.py's (three Zipf-drawn entities per chunk, a relation per pair,
repeated pairs merged with their weights summed). Per seed set (10 entities drawn uniformly, weights like similarities):
k-hop neighbourhoods (1 and 2 hops, uncapped: networkx's BFS layers give the same sets), personalized
PageRank on the query path's capped 2-hop neighbourhood and on the whole graph (networkx.pagerank, the same
iteration, damping and tolerance), with the agreement of the top 10.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence

import numpy as np

from .stats import distribution

DIMENSION = 384
K = 10
BLOCK = 50_000  # rows generated at a time (1M x 384 float64 noise at once would need 3 GB)


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


# ---------------------------------------------------------------------------------------------- FAISS


@dataclass(frozen=True)
class CorpusVectors:
    """benchmarks/thinkserve_bench/scripts/synthetic_collection.py's vector model, in blocks: entity vectors random unit vectors; a chunk
    the normalised mean of `per_chunk` Zipf-drawn entities' vectors plus noise; a question a random chunk's
    vector plus noise of norm `question_noise`, normalised. Chunks sharing entities are near neighbours, hub
    entities make dense regions, as in an ingested corpus."""

    count: int
    dimension: int = DIMENSION
    entities: int = 0  # 0: count // 5 (synthetic_collection's 20,000 for 100,000 chunks)
    per_chunk: int = 3
    exponent: float = 1.1
    noise: float = 0.02
    question_noise: float = 0.5
    seed: int = 0

    @property
    def pool(self) -> int:
        return self.entities or max(10, self.count // 5)

    def entity_vectors(self) -> np.ndarray:
        v = np.random.default_rng((self.seed, 0)).standard_normal((self.pool, self.dimension), dtype=np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    def vectors(self) -> np.ndarray:
        """Row r's noise comes from its block's own generator: the same rows whatever the block size."""
        entity = self.entity_vectors()
        weights = 1.0 / np.arange(1, self.pool + 1) ** self.exponent
        drawn = np.random.default_rng((self.seed, 1)).choice(self.pool, size=(self.count, self.per_chunk), p=weights / weights.sum())
        out = np.empty((self.count, self.dimension), dtype=np.float32)
        for start in range(0, self.count, BLOCK):
            rows = slice(start, min(self.count, start + BLOCK))
            noise = np.random.default_rng((self.seed, 2, start // BLOCK)).standard_normal((rows.stop - start, self.dimension), dtype=np.float32)
            v = entity[drawn[rows]].mean(axis=1) + self.noise * noise
            out[rows] = v / np.linalg.norm(v, axis=1, keepdims=True)
        return out

    def queries(self, vectors: np.ndarray, n: int) -> np.ndarray:
        rng = np.random.default_rng((self.seed, 3))
        rows = rng.choice(len(vectors), size=min(n, len(vectors)), replace=False)
        noise = rng.standard_normal((len(rows), self.dimension), dtype=np.float32)
        noise /= np.linalg.norm(noise, axis=1, keepdims=True)
        q = vectors[rows] + self.question_noise * noise
        return q / np.linalg.norm(q, axis=1, keepdims=True)


def recall_at_k(found: np.ndarray, exact: np.ndarray, k: int = K) -> float:
    """Mean over queries of |found top-k & exact top-k| / k (rows of -1 never match)."""
    hits = [len(set(f[:k].tolist()) & set(e[:k].tolist()) - {-1}) for f, e in zip(found, exact)]
    return float(np.mean(hits)) / k if hits else 0.0


def single_query_ms(search: Callable[[np.ndarray], object], queries: np.ndarray, warmup: int = 5) -> list[float]:
    """Wall time of one query at a time (a query is a [1, d] batch), raw samples in ms."""
    for q in queries[:warmup]:
        search(q[None, :])
    samples = []
    for q in queries:
        began = time.perf_counter()
        search(q[None, :])
        samples.append((time.perf_counter() - began) * 1000.0)
    return samples


def ivf_lists(n: int) -> int:
    """The product's default list count for n vectors (IndexSpec.ivf_lists = 0: about 4 sqrt(n))."""
    return max(1, int(4 * math.sqrt(n)))


def build_index(kind: str, vectors: np.ndarray, train_points_per_list: int = 40):
    """A VectorIndex as the product builds one; IVF trained on a sample (then extended with every vector)."""
    from orchestrator.knowledge.storage.indexes import IndexSpec, VectorIndex

    spec = IndexSpec(kind=kind)
    n = len(vectors)
    if kind != "ivf":
        return VectorIndex.build(spec, vectors, vectors.shape[1]), {}
    spec = replace(spec, ivf_lists=ivf_lists(n))
    sample = min(n, max(spec.ivf_min_vectors, train_points_per_list * spec.ivf_lists))
    picked = np.random.default_rng(3).permutation(n)[:sample]
    rest = np.setdiff1d(np.arange(n), picked)
    order = np.concatenate([picked, rest])  # rows of the index: sample first; mapped back to the data's rows
    index = VectorIndex.build(spec, vectors[picked], vectors.shape[1])
    if len(rest):
        index = index.extended(vectors[rest])
    return index, {"ivf_lists": spec.ivf_lists, "train_sample": int(sample), "row_order": order}


# search breadths tried per kind; the product default is marked in the report
BREADTHS = {"flat": [None], "ivf": [4, 16, 64], "hnsw": [32, 128, 512]}


def _set_breadth(index, kind: str, breadth: Optional[int]) -> None:
    if breadth is None:
        return
    if kind == "hnsw":
        index.set_ef_search(breadth)
    elif kind == "ivf":
        index._index.nprobe = breadth  # VectorIndex has no setter for nprobe: the FAISS index's own field


def faiss_micro(sizes: Sequence[int], kinds: Sequence[str] = ("flat", "ivf", "hnsw"), queries: int = 1000,
                timed_queries: int = 300, progress: Callable[[str], None] = print) -> dict:
    """Recall@10 against Flat and one-query latency per index kind, breadth and size."""
    import faiss

    from orchestrator.knowledge.storage.indexes import IndexSpec, gpu_count

    defaults = IndexSpec()
    threads = faiss.omp_get_max_threads()
    # FAISS's default (every core) is what the product runs; one thread shows what OpenMP's hand-off costs a
    # single query on a busy machine
    thread_counts = sorted({threads, 1}, reverse=True)
    out = {"dimension": DIMENSION, "k": K, "queries": queries, "timed_queries": timed_queries,
           "faiss_threads": threads, "thread_counts": thread_counts, "faiss_gpus": gpu_count(),
           "defaults": {"ivf_probe": defaults.ivf_probe, "hnsw_ef_search": defaults.hnsw_ef_search,
                        "hnsw_neighbors": defaults.hnsw_neighbors}, "sizes": []}
    for n in sizes:
        data = CorpusVectors(n)
        began = time.perf_counter()
        vectors = data.vectors()
        questions = data.queries(vectors, queries)
        row = {"vectors": n, "generate_s": time.perf_counter() - began, "load_average": load_average(), "kinds": {}}
        progress(f"micro faiss: {n:,} vectors (load average {row['load_average'][0]:.2f})")
        exact = None
        for kind in ["flat"] + [k for k in kinds if k != "flat"]:
            began = time.perf_counter()
            index, info = build_index(kind, vectors)
            built = time.perf_counter() - began
            order = info.pop("row_order", None)
            entry = {"built_as": index.kind, "build_s": built, **info, "breadths": []}
            for breadth in BREADTHS[kind] if index.kind == kind else [None]:  # IVF below its minimum is Flat
                _set_breadth(index, kind, breadth)
                _, rows = index.search(questions, K)
                if order is not None:
                    rows = np.where(rows >= 0, order[np.clip(rows, 0, None)], -1)
                if kind == "flat":
                    exact = rows
                latency = {}
                for count in thread_counts:
                    faiss.omp_set_num_threads(count)
                    latency[str(count)] = distribution(single_query_ms(lambda q, index=index: index.search(q, K),
                                                                    questions[:timed_queries]))
                faiss.omp_set_num_threads(threads)
                entry["breadths"].append({"breadth": breadth, "recall_at_10": recall_at_k(rows, exact), "latency": latency})
                progress(f"  {kind} breadth {breadth}: recall@10 {entry['breadths'][-1]['recall_at_10']:.3f}, p50 "
                         + ", ".join(f"{latency[str(c)]['p50_ms']:.3f} ms ({c} thread{'s' if c > 1 else ''})" for c in thread_counts)
                         + f" (built in {built:.1f} s)")
            if kind in kinds:
                row["kinds"][kind] = entry
            del index
        out["sizes"].append(row)
        del vectors
    return out


# ---------------------------------------------------------------------------------------------- graph


def cooccurrence_graph(chunks: int, entities: int, per_chunk: int = 3, exponent: float = 1.1, seed: int = 0):
    """A KnowledgeGraph from `chunks` chunks of `per_chunk` Zipf-drawn entities each, a relation per pair."""
    from orchestrator.knowledge.graph.graph import DocumentGraph
    from orchestrator.knowledge.graph.merge import build_graph
    from orchestrator.knowledge.storage.segments import RelationMention

    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, entities + 1) ** exponent
    drawn = rng.choice(entities, size=(chunks, per_chunk), p=weights / weights.sum())
    relations = []
    for row, members in enumerate(drawn.tolist()):
        keys = sorted({f"e{m}" for m in members})
        relations += [RelationMention(a, b, "", "", 1.0, f"d:c{row}") for i, a in enumerate(keys) for b in keys[i + 1 :]]
    return build_graph([DocumentGraph("d", (), relations, ())])


def _timed(call: Callable[[], object]) -> tuple[float, object]:
    began = time.perf_counter()
    result = call()
    return (time.perf_counter() - began) * 1000.0, result


def _top(scores: dict[int, float] | np.ndarray, k: int = K) -> list[int]:
    """The k best nodes, ties by node id (the same rule for both engines)."""
    if isinstance(scores, dict):
        items = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
    else:
        nodes = np.flatnonzero(scores > 0)
        items = sorted(zip(nodes.tolist(), scores[nodes].tolist()), key=lambda kv: (-kv[1], kv[0]))
    return [node for node, _ in items[:k]]


def graph_micro(chunk_counts: Sequence[int], seed_sets: int = 20, seeds_per_set: int = 10, max_nodes: int = 500,
                global_sets: int = 5, progress: Callable[[str], None] = print) -> dict:
    """Our CSR k-hop and personalized PageRank against networkx on the same graphs, with agreement."""
    import networkx as nx

    out = {"networkx": nx.__version__, "seeds_per_set": seeds_per_set, "seed_sets": seed_sets, "max_nodes": max_nodes,
           "damping": 0.85, "tol": 1e-6, "max_iter": 100, "graphs": []}
    for chunks in chunk_counts:
        entities = max(100, chunks // 5)
        began = time.perf_counter()
        graph = cooccurrence_graph(chunks, entities)
        built = time.perf_counter() - began
        began = time.perf_counter()
        G = nx.from_scipy_sparse_array(graph.adjacency)
        nx_built = time.perf_counter() - began
        row = {"chunks": chunks, "entity_pool": entities, "nodes": graph.node_count, "edges": len(graph.edges),
               "build_s": built, "networkx_build_s": nx_built, "load_average": load_average()}
        progress(f"micro graph: {chunks:,} chunks -> {graph.node_count:,} nodes, {len(graph.edges):,} edges "
                 f"(load average {row['load_average'][0]:.2f})")
        rng = np.random.default_rng(5)
        samples: dict[str, list[float]] = {}
        agreement: dict[str, list] = {}

        def record(name: str, ours_ms: float, theirs_ms: float) -> None:
            samples.setdefault(f"{name} ours", []).append(ours_ms)
            samples.setdefault(f"{name} networkx", []).append(theirs_ms)

        for s in range(seed_sets):
            # seeds: entities of the graph drawn uniformly (a question's entities are matched by similarity, not
            # by how common they are), weighted like similarities
            picked = rng.choice(graph.node_count, size=seeds_per_set, replace=False)
            seeds = {int(node): float(w) for node, w in zip(picked, rng.random(len(picked)) + 0.1)}
            for hops in (1, 2):
                ours_ms, (nodes, distances) = _timed(lambda: graph.neighbourhood(list(seeds), hops))
                theirs_ms, layers = _timed(lambda: _bfs(nx, G, list(seeds), hops))
                record(f"k-hop {hops}", ours_ms, theirs_ms)
                agreement.setdefault(f"k-hop {hops} same nodes and distances", []).append(
                    dict(zip(nodes.tolist(), distances.tolist())) == layers)
                agreement.setdefault(f"k-hop {hops} mean nodes reached", []).append(len(nodes))
            capped, _ = graph.neighbourhood(list(seeds), 2, max_nodes)
            ours_ms, ours = _timed(lambda: graph.personalized_pagerank(seeds, restrict_to=capped, backend="cpu"))
            theirs_ms, theirs = _timed(lambda: nx.pagerank(G.subgraph(capped.tolist()), alpha=0.85, personalization=seeds,
                                                           max_iter=100, tol=1e-6, weight="weight"))
            record("PageRank on the capped 2-hop neighbourhood", ours_ms, theirs_ms)
            _agree(agreement, "PageRank local", ours, theirs)
            if s < global_sets:
                ours_ms, ours = _timed(lambda: graph.personalized_pagerank(seeds, backend="cpu"))
                theirs_ms, theirs = _timed(lambda: nx.pagerank(G, alpha=0.85, personalization=seeds, max_iter=100, tol=1e-6,
                                                               weight="weight"))
                record("PageRank on the whole graph", ours_ms, theirs_ms)
                _agree(agreement, "PageRank global", ours, theirs)
        row["latency"] = {name: distribution(values) for name, values in samples.items()}
        row["speedup_p50"] = {name.removesuffix(" ours"): row["latency"][f"{name.removesuffix(' ours')} networkx"]["p50_ms"]
                              / row["latency"][name]["p50_ms"] for name in samples if name.endswith(" ours")}
        row["agreement"] = _agreement_summary(agreement)
        for name, ratio in row["speedup_p50"].items():
            progress(f"  {name}: ours p50 {row['latency'][name + ' ours']['p50_ms']:.2f} ms, networkx "
                     f"{row['latency'][name + ' networkx']['p50_ms']:.2f} ms ({ratio:.1f}x)")
        out["graphs"].append(row)
    return out


def _bfs(nx, G, sources: list[int], hops: int) -> dict[int, int]:
    """node -> hop distance within `hops` of the sources (networkx's BFS layers)."""
    out = {}
    for distance, layer in enumerate(nx.bfs_layers(G, sources)):
        if distance > hops:
            break
        out.update({int(node): distance for node in layer})
    return out


def _agree(agreement: dict[str, list], name: str, ours: np.ndarray, theirs: dict[int, float]) -> None:
    top_ours, top_theirs = _top(ours), _top({int(k): v for k, v in theirs.items()})
    agreement.setdefault(f"{name} top-10 overlap", []).append(len(set(top_ours) & set(top_theirs)) / K)
    agreement.setdefault(f"{name} top-10 same order", []).append(top_ours == top_theirs)
    diff = max(abs(float(ours[node]) - value) for node, value in theirs.items())
    agreement.setdefault(f"{name} max abs score difference", []).append(diff)


def _agreement_summary(agreement: dict[str, list]) -> dict:
    out = {}
    for name, values in agreement.items():
        if isinstance(values[0], bool):
            out[name] = f"{sum(values)}/{len(values)}"
        elif "difference" in name:
            out[name] = max(values)
        else:
            out[name] = float(np.mean(values))
    return out


# ---------------------------------------------------------------------------------------------- report


def markdown(payload: dict) -> str:
    m = payload["machine"]
    lines = [
        "# Micro benchmarks: FAISS index kinds, graph expansion and PageRank", "",
        f"Command: `{payload['command']}`  ",
        f"Machine: {m['cpu']}, {m['logical_cores']} logical cores, {m['memory_gib']} GiB, GPU: {m['gpu']}; load average "
        f"at start {', '.join(f'{v:.2f}' for v in m['load_average'])} (shared machine)  ",
        f"Commit {m['git_commit']}, Python {m['python']}, faiss {m['packages'].get('faiss-cpu', '?')}", "",
    ]
    f = payload.get("faiss")
    if f:
        d = f["defaults"]
        lines += [
            "## FAISS: recall@10 against exact search, and one-query latency", "",
            f"{f['dimension']}-d unit vectors as benchmarks/thinkserve_bench/scripts/synthetic_collection.py makes them (a chunk: the mean of 3 "
            f"Zipf-drawn entity vectors plus noise; entity pool = vectors / 5), {f['queries']} questions (a random "
            f"chunk's vector plus noise of norm 0.5) for recall against the exact top 10 (Flat), the first "
            f"{f['timed_queries']} timed one at a time after 5 warm-up searches, with FAISS's default "
            f"{f['faiss_threads']} OpenMP threads (what the product runs) and with 1; percentiles from raw samples. "
            f"GPUs seen by FAISS: {f['faiss_gpus']}. Product defaults: IVF nprobe {d['ivf_probe']}, HNSW M "
            f"{d['hnsw_neighbors']}, efSearch {d['hnsw_ef_search']} (marked *). Load average: at the start of each size.", "",
            "| vectors | index | built as | build s | breadth | recall@10 | "
            + " | ".join(f"p50 / p95 / p99 ms, {c} thread{'s' if c > 1 else ''}" for c in f["thread_counts"]) + " | load avg |",
            "|---:|---|---|---:|---:|---:|" + "---:|" * len(f["thread_counts"]) + "---:|",
        ]
        for row in f["sizes"]:
            for kind, entry in row["kinds"].items():
                note = f" ({entry['ivf_lists']} lists, trained on {entry['train_sample']:,})" if "ivf_lists" in entry else ""
                for b in entry["breadths"]:
                    default = (kind == "ivf" and b["breadth"] == d["ivf_probe"]) or (kind == "hnsw" and b["breadth"] == d["hnsw_ef_search"])
                    breadth = "-" if b["breadth"] is None else f"{b['breadth']}{'*' if default else ''}"
                    cells = " | ".join(f"{lat['p50_ms']:.3f} / {lat['p95_ms']:.3f} / {lat['p99_ms']:.3f}"
                                       for lat in (b["latency"][str(c)] for c in f["thread_counts"]))
                    lines.append(f"| {row['vectors']:,} | {kind}{note} | {entry['built_as']} | {entry['build_s']:.1f} | {breadth} | "
                                 f"{b['recall_at_10']:.3f} | {cells} | {row['load_average'][0]:.1f} |")
        lines += [""]
    g = payload.get("graph")
    if g:
        lines += [
            "## Graph: our CSR path against networkx on the same graph", "",
            f"Co-occurrence graphs (3 Zipf-drawn entities per chunk, entity pool = chunks / 5), {g['seed_sets']} seed sets of "
            f"{g['seeds_per_set']} entities drawn uniformly; PageRank damping {g['damping']}, tol {g['tol']}, at most "
            f"{g['max_iter']} iterations, ours on the CPU (scipy CSR) against networkx {g['networkx']} (`nx.pagerank`, "
            f"`nx.bfs_layers`; the networkx graph built once from our adjacency). The query path caps the 2-hop "
            f"neighbourhood at {g['max_nodes']} nodes (graph_max_nodes).", "",
            "| chunks | nodes | edges | operation | ours p50 ms | ours p95 ms | networkx p50 ms | networkx p95 ms | networkx / ours |",
            "|---:|---:|---:|---|---:|---:|---:|---:|---:|",
        ]
        for row in g["graphs"]:
            for name, ratio in row["speedup_p50"].items():
                a, b = row["latency"][f"{name} ours"], row["latency"][f"{name} networkx"]
                lines.append(f"| {row['chunks']:,} | {row['nodes']:,} | {row['edges']:,} | {name} | {a['p50_ms']:.2f} | {a['p95_ms']:.2f} | "
                             f"{b['p50_ms']:.2f} | {b['p95_ms']:.2f} | {ratio:.1f}x |")
        lines += ["", "Agreement (same graph, same seeds):", "", "| chunks | check | value |", "|---:|---|---|"]
        for row in g["graphs"]:
            for name, value in row["agreement"].items():
                shown = f"{value:.2e}" if "difference" in name else (f"{value:.3f}" if isinstance(value, float) else str(value))
                lines.append(f"| {row['chunks']:,} | {name} | {shown} |")
        lines += ["", "Build: " + "; ".join(f"{r['chunks']:,} chunks: ours {r['build_s']:.1f} s, networkx graph from our "
                                           f"adjacency {r['networkx_build_s']:.1f} s" for r in g["graphs"]), ""]
    return "\n".join(lines)
