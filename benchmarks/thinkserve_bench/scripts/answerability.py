"""The answerability model's refusals on labelled questions, cross-validated by document, with the best-cosine rule
beside it; the examples it collects are what the model is trained on.

    thinkserve-bench answerability --data-dir DIR [--dataset ../shared/benchmarks/mmlongbench-dev]
    thinkserve-build train-answerability --examples benchmarks/results/mmlongbench-dev/answerability.json.gz

A deployment of the tiny profile (its refusal rule set to "similarity", so no model is needed to collect the
features) answers Retrieve for every question of the dataset, in full and in lexical mode, against a collection
per document (the data folder's, ingested first where missing: `document_qa --data-dir` leaves the same ones).
The features are those the server reports (RetrieveResponse.answerability.features): what serving reads.

Labelled examples: the dataset's questions (its unanswerable ones negative), and generated negatives, each
answerable question asked of another document's collection (its answer removed from what is searched). The
fitting and its cross-validation are the model compiler's (thinkserve_build/train_answerability.py), which the
shipped file comes from: this benchmark reports the cross-validated refusal figures per mode and threshold, and
what `thinkserve-build train-answerability` would ship from these examples.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

from thinkserve_bench.machine import machine_facts
from thinkserve_bench.result_files import RESULTS, read_json, write_and_show
from orchestrator.client import AsyncThinkServeClient
from orchestrator.config import Settings
from orchestrator.server.deployment import running
from thinkserve_build.train_answerability import FOLDS, MODES, evaluate, shipped_file

from .document_qa import DEFAULT_DATASET, collection_name, ingest_all
from .qa_dataset import Question, load_questions

NAME = "answerability"


async def collect(settings: Settings, dataset: Path, questions: list[Question], names: list[str], progress) -> list[dict]:
    """Every example's features in both modes, from the server's Retrieve responses."""
    collections_of = {name: collection_name(number, name) for number, name in enumerate(names)}
    partner = {name: names[(number + len(names) // 2) % len(names)] for number, name in enumerate(names)}
    examples = [{"question": q.id, "text": q.text, "document": q.document, "collection_document": q.document,
                 "answerable": q.answerable, "source": "dataset"} for q in questions]
    examples += [{"question": q.id, "text": q.text, "document": q.document, "collection_document": partner[q.document],
                  "answerable": False, "source": "generated"} for q in questions if q.answerable]
    async with running(settings, progress) as deployment:
        async with AsyncThinkServeClient(deployment.address, timeout_s=600) as client:
            await ingest_all(client, [dataset / "documents" / name for name in names], collections_of, 2, progress)
            for number, example in enumerate(examples, 1):
                collection = collections_of[example["collection_document"]]
                for mode in MODES:
                    response = await client.retrieve(collection, example["text"], **({"lexical": True} if mode == "lexical" else {}))
                    example[mode] = dict(response.answerability.features)
                    example[f"{mode}_route"] = response.route.label
                if number % 100 == 0:
                    progress(f"{number}/{len(examples)} examples")
    return examples


def _f(value: Optional[float]) -> str:
    return f"{value:.3f}" if value is not None else "n/a"


def report(payload: dict) -> str:
    r = payload["results"]
    counts = payload["counts"]
    lines = [
        "# Answerability: refusing unanswerable questions, cross-validated by document",
        "",
        f"Command: `{payload['command']}`  ",
        f"Machine: {payload['machine']['cpu']}, {payload['machine']['logical_cores']} logical cores; commit "
        f"{payload['machine']['git_commit']}  ",
        f"Examples: {counts['dataset']} dataset questions ({counts['dataset_unanswerable']} unanswerable) in "
        f"{counts['documents']} documents, and {counts['generated']} generated negatives (each answerable question asked "
        "of another document's collection). Features as the server reports them (Retrieve), tiny profile.",
        "",
        f"{FOLDS}-fold cross-validation by document: a model never scores a collection whose document it was fitted on. "
        f"The threshold is the best-F1 one on the dataset's questions with false refusals at most "
        f"{payload['max_false_refusals']:.0%} (chosen on these cross-validated scores: one parameter). AUC: how well a low "
        "score picks out the unanswerable questions (0.5 is chance).",
        "",
    ]
    for mode, entry in r.items():
        lines += [f"## {mode} retrieval", "",
                  "| rule | AUC, dataset | AUC, generated vs answerable | threshold | refused | precision | recall | F1 | false refusals | F1, all examples |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for label, figures in entry.items():
            if label == "rule":
                continue
            t, a = figures["at_threshold_dataset"], figures["at_threshold_all"]
            lines.append(f"| {label} | {_f(figures['auc_dataset'])} | {_f(figures['auc_generated_vs_answerable'])} | "
                         f"{t['threshold']:.3f} | {t['refused']} | {_f(t['precision'])} | {_f(t['recall'])} | {_f(t['f1'])} | "
                         f"{_f(t['false_refusals'])} | {_f(a['f1'])} |")
        lines.append("")
    shipped = payload.get("would_ship") or payload.get("shipped")  # older results wrote the shipped file themselves
    if shipped:
        lines += ["## What `thinkserve-build train-answerability` ships from these examples", "",
                  f"Version `{shipped['version']}`: fitted on every example "
                  f"({shipped['training']}), each mode's model with its threshold (refused below it; "
                  "`retrieval.min_answerability` overrides both). Coefficients per standardised feature (positive: "
                  "more answerable):", ""]
        for mode, model in shipped["models"].items():
            pairs = sorted(zip(model["features"], model["coefficients"]), key=lambda p: -abs(p[1]))
            lines.append(f"- {mode}, threshold {model['threshold']:.3f}: " + ", ".join(f"{name} {value:+.2f}" for name, value in pairs))
        lines.append("")
    return "\n".join(lines)


def declare_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", type=Path, default=DEFAULT_DATASET)
    parser.add_argument("--data-dir", type=Path, help="the collections (document_qa's), ingested here where missing")
    parser.add_argument("--max-false-refusals", type=float, default=0.10)
    parser.add_argument("--examples", type=Path, help="fit on a previous run's examples (its results JSON, or .json.gz); measure nothing")
    parser.add_argument("--output", type=Path, default=None, help="results folder (default: benchmarks/results/<dataset>)")


def run_benchmark(args: argparse.Namespace, command: str) -> int:
    questions = load_questions(args.dataset)
    names = sorted({q.document for q in questions})
    progress = lambda message: print(f"* {message}", file=sys.stderr, flush=True)  # noqa: E731
    if args.examples:
        examples = read_json(args.examples)["examples"]
    else:
        with tempfile.TemporaryDirectory(prefix="thinkserve-answerability-") as scratch:
            settings = Settings.load(None, {"retrieval.answerability": "similarity"}).scratch(args.data_dir or Path(scratch) / "data")
            examples = asyncio.run(collect(settings, args.dataset, questions, names, progress))
    results = evaluate(examples, args.max_false_refusals)
    dataset_examples = [e for e in examples if e["source"] == "dataset"]
    payload: dict[str, Any] = {
        "command": command, "machine": machine_facts(), "max_false_refusals": args.max_false_refusals,
        "counts": {"dataset": len(dataset_examples), "dataset_unanswerable": sum(not e["answerable"] for e in dataset_examples),
                   "generated": len(examples) - len(dataset_examples), "documents": len(names)},
        "results": results, "examples": examples,
        "would_ship": shipped_file(examples, results, command),
    }
    write_and_show(NAME, payload, report(payload), args.output or RESULTS / args.dataset.resolve().name)
    return 0
