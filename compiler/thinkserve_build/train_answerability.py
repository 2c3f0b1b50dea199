"""`thinkserve-build train-answerability`: fit the answerability model the service ships (orchestrator/models/
answerability-v1.json) from labelled examples, beside the router's training (train_router.py).

An example is a question asked of a collection, labelled answerable or not, with the features the server reported for
it in both retrieval modes (RetrieveResponse.answerability.features, so the training reads what serving computes).
`thinkserve-bench answerability` collects them from a deployment and writes them in its results JSON; this fits on
them. Logistic regression (scikit-learn) per mode on standardised features, cross-validated by document: folds of
whole collections, and a generated example (an answerable question asked of another document's collection) is
trained on only if neither its question's document nor its collection's is in the fold scored. The refusal
threshold is the one with the best F1 on the dataset's own questions whose false refusals stay within a limit;
the shipped file holds each mode's model fitted on every example, with its threshold.
"""

from __future__ import annotations

import datetime
import gzip
import json
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from orchestrator.models.answerability import FEATURES, LEXICAL_FEATURES, MODEL_FILE, AnswerabilityModel

MODES = {"full": FEATURES, "lexical": LEXICAL_FEATURES}
FOLDS = 6


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


def training_label(with_generated: bool) -> str:
    return f"model, trained on {'dataset + generated' if with_generated else 'dataset only'}"


def chosen_training(results: dict[str, Any]) -> bool:
    """Whether the generated negatives join the training: whichever tells the dataset's unanswerable questions apart
    better (cross-validated AUC, full mode)."""
    return max((False, True), key=lambda generated: results["full"][training_label(generated)]["auc_dataset"])


def shipped_file(examples: list[dict], results: dict[str, Any], command: str) -> dict[str, Any]:
    """The shipped file's content: each mode's model fitted on every example of the chosen training, with the
    threshold chosen on its cross-validated scores, versioned by date and commit."""
    with_generated = chosen_training(results)
    label = training_label(with_generated)
    models = {mode: replace(model, threshold=round(results[mode][label]["at_threshold_dataset"]["threshold"], 4))
              for mode, model in final_models(examples, with_generated).items()}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"version": f"v1-{datetime.date.today().isoformat()}-{commit}", "training": label.removeprefix("model, trained on "),
            "command": command, "models": {mode: model.to_json() for mode, model in models.items()}}


def read_examples(path: Path) -> list[dict]:
    """The examples of a `thinkserve-bench answerability` results file (committed gzipped: X.json finds X.json.gz)."""
    if not path.exists() and path.with_name(path.name + ".gz").exists():
        path = path.with_name(path.name + ".gz")
    opened = gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")
    with opened as stream:
        return json.load(stream)["examples"]


def train_answerability(examples: list[dict], output: Path = MODEL_FILE, max_false_refusals: float = 0.10,
                        command: str = "") -> dict[str, Any]:
    """Evaluate, fit and write the shipped file to `output`; returns what was written."""
    if not examples or not {"full", "lexical"} <= set(examples[0]):
        raise ValueError("no examples with both modes' features (a `thinkserve-bench answerability` results file holds them)")
    shipped = shipped_file(examples, evaluate(examples, max_false_refusals), command)
    output.write_text(json.dumps(shipped, indent=1) + "\n", encoding="utf-8")
    return shipped
