"""Fit the answerability model (orchestrator/pipeline/answerability.py) on labelled questions, cross-validated by
document, with the best-cosine rule beside it.

    python -m thinkserve_bench.scripts.answerability --data-dir DIR [--dataset ../shared/benchmarks/mmlongbench-dev] [--write-model]

A deployment of the tiny profile (its refusal rule set to "similarity", so no model is needed to collect the
features) answers Retrieve for every question of the dataset, in full and in lexical mode, against a collection
per document (the data folder's, ingested first where missing: `document_qa --data-dir` leaves the same ones).
The features are those the server reports (RetrieveResponse.answerability.features): what serving reads.

Labelled examples: the dataset's questions (its unanswerable ones negative), and generated negatives, each
answerable question asked of another document's collection (its answer removed from what is searched). Logistic
regression (scikit-learn) is fitted per mode on standardised features; its refusal figures are cross-validated
by document: folds of whole collections, and a generated example is trained on only if neither its question's
document nor its collection's is in the fold scored. The refusal threshold is the one with the best F1 on the
dataset's own questions whose false refusals stay within --max-false-refusals; `--write-model` fits on every
example and writes the shipped file, each mode's model with its threshold.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from thinkserve_bench.machine import machine_facts
from thinkserve_bench.result_files import RESULTS, invocation, program, read_json, write_and_show
from orchestrator.client import AsyncThinkServeClient
from orchestrator.config import Settings
from orchestrator.server.deployment import running
from orchestrator.pipeline.answerability import FEATURES, LEXICAL_FEATURES, MODEL_FILE, AnswerabilityModel

from .document_qa import DEFAULT_DATASET, collection_name, ingest_all
from .qa_dataset import Question, load_questions

NAME = "answerability"
MODES = {"full": FEATURES, "lexical": LEXICAL_FEATURES}
FOLDS = 6


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


def fit(x: np.ndarray, y: np.ndarray, features: tuple[str, ...]) -> AnswerabilityModel:
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale = np.where(scale > 1e-9, scale, 1.0)
    model = LogisticRegression(C=1.0, class_weight="balanced", max_iter=2000).fit((x - mean) / scale, y)
    return AnswerabilityModel(features, mean, scale, model.coef_[0].astype(np.float64), float(model.intercept_[0]))


def matrix(examples: list[dict], mode: str) -> np.ndarray:
    return np.asarray([[example[mode][name] for name in MODES[mode]] for example in examples], dtype=np.float64)


def cross_validated(examples: list[dict], mode: str, with_generated: bool) -> np.ndarray:
    """P(answerable) of every example from a model that never saw its collection's document (nor, for a generated
    example, its question's)."""
    documents = sorted({e["collection_document"] for e in examples} | {e["document"] for e in examples})
    fold_of = {document: number % FOLDS for number, document in enumerate(documents)}
    x, y = matrix(examples, mode), np.asarray([e["answerable"] for e in examples])
    probabilities = np.full(len(examples), np.nan)
    for fold in range(FOLDS):
        scored = np.asarray([fold_of[e["collection_document"]] == fold for e in examples])
        trained = np.asarray([
            fold_of[e["collection_document"]] != fold and fold_of[e["document"]] != fold
            and (with_generated or e["source"] == "dataset") for e in examples
        ])
        model = fit(x[trained], y[trained], MODES[mode])
        probabilities[scored] = [model.probability(dict(zip(MODES[mode], row))) for row in x[scored]]
    return probabilities


def refusal_figures(answerable: np.ndarray, score: np.ndarray, threshold: float) -> dict[str, Any]:
    """Refusing where score < threshold, the unanswerable questions the positives."""
    refused = score < threshold
    unanswerable = ~answerable
    true = int((refused & unanswerable).sum())
    precision = true / refused.sum() if refused.sum() else None
    recall = true / unanswerable.sum() if unanswerable.sum() else None
    f1 = 2 * precision * recall / (precision + recall) if precision and recall else 0.0
    return {"threshold": float(threshold), "refused": int(refused.sum()), "precision": precision, "recall": recall, "f1": f1,
            "false_refusals": float((refused & answerable).sum() / answerable.sum()) if answerable.sum() else None}


def best_threshold(answerable: np.ndarray, score: np.ndarray, max_false_refusals: float) -> dict[str, Any]:
    """The threshold with the best refusal F1 whose false refusals stay within the limit."""
    candidates = np.unique(np.concatenate([score, [score.min() - 1e-6]]))
    best = refusal_figures(answerable, score, float(candidates[0]))
    for threshold in candidates:
        figures = refusal_figures(answerable, score, float(threshold) + 1e-9)
        if figures["false_refusals"] is not None and figures["false_refusals"] <= max_false_refusals and figures["f1"] > best["f1"]:
            best = figures
    return best


def evaluate(examples: list[dict], max_false_refusals: float) -> dict[str, Any]:
    """Cross-validated refusal figures per mode and training set, on the dataset's questions and on all examples;
    the best-cosine rule (and in lexical mode the best-lexical rule) beside them."""
    dataset = np.asarray([e["source"] == "dataset" for e in examples])
    answerable = np.asarray([e["answerable"] for e in examples])
    results: dict[str, Any] = {}
    for mode in MODES:
        rule = "best_semantic" if mode == "full" else "best_lexical"
        rule_score = np.asarray([e[mode][rule] for e in examples])
        entry: dict[str, Any] = {"rule": rule}
        for label, score in [(f"{rule} rule", rule_score)] + [
            (f"model, trained on {'dataset + generated' if generated else 'dataset only'}", cross_validated(examples, mode, generated))
            for generated in (False, True)
        ]:
            chosen = best_threshold(answerable[dataset], score[dataset], max_false_refusals)
            entry[label] = {
                "auc_dataset": float(roc_auc_score(~answerable[dataset], -score[dataset])),
                "auc_all": float(roc_auc_score(~answerable, -score)),
                "auc_generated_vs_answerable": float(roc_auc_score(
                    ~answerable[(~dataset) | answerable], -score[(~dataset) | answerable])),
                "at_threshold_dataset": chosen,
                "at_threshold_all": refusal_figures(answerable, score, chosen["threshold"]),
                "scores": score.tolist(),
            }
        results[mode] = entry
    return results


def final_models(examples: list[dict], with_generated: bool) -> dict[str, AnswerabilityModel]:
    chosen = [e for e in examples if with_generated or e["source"] == "dataset"]
    y = np.asarray([e["answerable"] for e in chosen])
    return {mode: fit(matrix(chosen, mode), y, MODES[mode]) for mode in MODES}


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
    shipped = payload.get("shipped")
    if shipped:
        lines += ["## Shipped", "",
                  f"`{shipped['file']}`, version `{shipped['version']}`: fitted on every example "
                  f"({shipped['training']}), each mode's model with its threshold (refused below it; "
                  "`retrieval.min_answerability` overrides both). Coefficients per standardised feature (positive: "
                  "more answerable):", ""]
        for mode, model in shipped["models"].items():
            pairs = sorted(zip(model["features"], model["coefficients"]), key=lambda p: -abs(p[1]))
            lines.append(f"- {mode}, threshold {model['threshold']:.3f}: " + ", ".join(f"{name} {value:+.2f}" for name, value in pairs))
        lines.append("")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog=program(NAME), description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", type=Path, default=DEFAULT_DATASET)
    parser.add_argument("--data-dir", type=Path, help="the collections (document_qa's), ingested here where missing")
    parser.add_argument("--max-false-refusals", type=float, default=0.10)
    parser.add_argument("--write-model", action="store_true", help=f"write the shipped model file ({MODEL_FILE.name})")
    parser.add_argument("--examples", type=Path, help="fit on a previous run's examples (its results JSON, or .json.gz); measure nothing")
    parser.add_argument("--output", type=Path, default=None, help="results folder (default: bench/results/<dataset>)")
    args = parser.parse_args(argv)
    command = invocation(NAME, argv if argv is not None else sys.argv[1:])
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
    with_generated = max((False, True), key=lambda generated: results["full"][
        f"model, trained on {'dataset + generated' if generated else 'dataset only'}"]["auc_dataset"])
    label = f"model, trained on {'dataset + generated' if with_generated else 'dataset only'}"
    dataset_examples = [e for e in examples if e["source"] == "dataset"]
    payload: dict[str, Any] = {
        "command": command, "machine": machine_facts(), "max_false_refusals": args.max_false_refusals,
        "counts": {"dataset": len(dataset_examples), "dataset_unanswerable": sum(not e["answerable"] for e in dataset_examples),
                   "generated": len(examples) - len(dataset_examples), "documents": len(names)},
        "results": results, "examples": examples,
    }
    if args.write_model:
        models = {mode: replace(model, threshold=round(results[mode][label]["at_threshold_dataset"]["threshold"], 4))
                  for mode, model in final_models(examples, with_generated).items()}
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        version = f"v1-{datetime.date.today().isoformat()}-{commit}"
        shipped = {"version": version, "training": label.removeprefix("model, trained on "),
                   "command": command, "models": {mode: model.to_json() for mode, model in models.items()}}
        MODEL_FILE.write_text(json.dumps(shipped, indent=1) + "\n", encoding="utf-8")
        payload["shipped"] = {**shipped, "file": str(MODEL_FILE.relative_to(Path.cwd()) if MODEL_FILE.is_relative_to(Path.cwd()) else MODEL_FILE.name)}
    write_and_show(NAME, payload, report(payload), args.output or RESULTS / args.dataset.resolve().name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
