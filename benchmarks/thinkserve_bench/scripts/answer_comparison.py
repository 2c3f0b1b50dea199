"""Answerers and routers compared on the same questions in the same run (document_qa's --answerers, --routers).

Each question is asked once more per answerer (`Query` with the request option `answerer`) and retrieved once more
per router mode (`Retrieve` with `router`), against the same collections and deployment, one call at a time, so
every answerer's figure has its same-run baseline: which questions each one holds the expected value for, and
where they differ. An answer's containment is scored as document_qa scores the default answer; the short answer
is the value alone (the extractive answer's from its sentence, the LLM's its own text), so a long answer cannot
pass by holding many numbers.

Routes have no labels in MMLongBench-Doc; what it does mark is whether a question's evidence lies on one page or
several. A router is scored against that: a single-page question is "simple", a cross-page one is not.
"""

from __future__ import annotations

import collections
import re
from typing import Any, Optional, Sequence

import numpy as np

from thinkserve_bench.stats import percentile

from .qa_dataset import Question, contains_answer, refusal_scores

_CITATION_MARK = re.compile(r"\[\d{1,3}\]")
ANSWERERS = ("extractive", "llm", "hybrid")
ROUTER_MODES = ("features", "model")


def answer_record(final, query_ms: float, tokens: Sequence = ()) -> dict[str, Any]:
    """What one Query's final event says about its answer; `tokens`: the streamed answer's TokenInfo (a generated
    answer's own confidence: mean log-probability and normalised entropy, which answerability may read)."""
    if final is None:
        return {"answer": "", "answer_source": "", "finish_reason": "", "citations": [], "query_ms": query_ms}
    timings = {timing.stage: timing.milliseconds for timing in final.timings}
    uncertainty = final.uncertainty if final.HasField("uncertainty") else None
    return {
        "answer": final.text,
        "answer_source": final.answer_source,
        "finish_reason": final.finish_reason,
        "short_answer": final.short_answer.text if final.HasField("short_answer") else "",
        "citations": [citation.page for citation in final.citations],
        "quotes": [(citation.evidence_rank, citation.quote) for citation in final.citations if citation.quote],
        "query_ms": query_ms,
        "llm_ms": timings.get("llm_generation"),
        "llm_ttft_ms": timings.get("llm_ttft"),
        "uncertainty_ms": timings.get("uncertainty"),
        "prompt_tokens": final.usage.prompt_tokens,
        "completion_tokens": final.usage.completion_tokens,
        "degraded": final.degraded_reason,
        "entropies": list(uncertainty.entropies) if uncertainty is not None else [],
        "token_log_probs": [round(float(token.log_prob), 4) for token in tokens],
        "token_entropies": [round(float(token.normalized_entropy), 4) for token in tokens],
    }


async def ask_answerers(client, collection: str, question: str, answerers: Sequence[str], clock) -> dict[str, dict]:
    """The question's Query once per answerer (the request option), one after the other."""
    records = {}
    for answerer in answerers:
        started = clock()
        final, tokens = None, []
        async for event in client.query(collection, question, answerer=answerer):
            kind = event.WhichOneof("event")
            if kind == "delta":
                tokens.extend(event.delta.tokens)
            elif kind == "final":
                final = event.final
        records[answerer] = answer_record(final, (clock() - started) * 1000, tokens)
    return records


async def ask_routers(client, collection: str, question: str, modes: Sequence[str], clock) -> dict[str, dict]:
    """The route each router mode gives the question (Retrieve with the request option `router`)."""
    records = {}
    for mode in modes:
        started = clock()
        response = await client.retrieve(collection, question, router=mode)
        records[mode] = {"label": response.route.label, "probabilities": list(response.route.probabilities),
                         "retrieve_ms": (clock() - started) * 1000}
    return records


def _mean(values: Sequence[bool]) -> Optional[float]:
    return float(np.mean(values)) if len(values) else None


def _plain(text: str) -> str:
    return _CITATION_MARK.sub(" ", text)


def score_answerers(questions: list[Question], records: dict[int, dict[str, dict]],
                    answerability: Optional[dict[int, Optional[float]]] = None) -> dict[str, Any]:
    """Per answerer: containment (short-answer and all answerable questions; the answer and its short answer),
    first citation on an evidence page, refusals (precision, recall, F1, false refusals), latency; per pair of
    answerers the questions one holds the expected value for and the other does not; and, for an answerer that
    generates, what its tokens' certainty says of answerability (certainty_signal) beside `answerability` (the
    served answerability probability per question)."""
    if not records:
        return {}
    names = list(next(iter(records.values())))
    short = [q for q in questions if q.short_answer]
    answerable = [q for q in questions if q.answerable and q.evidence_pages]
    unanswerable = [not q.answerable for q in questions]
    out: dict[str, Any] = {"answerers": {}, "pairs": {}}
    holds: dict[str, dict[int, bool]] = {}
    for name in names:
        runs = {q.id: records[q.id][name] for q in questions}
        holds[name] = {q.id: contains_answer(_plain(runs[q.id]["answer"]), q.answer) for q in short}
        refused = [runs[q.id]["finish_reason"] == "refusal" or runs[q.id]["answer_source"] == "refusal" for q in questions]
        cited = [q for q in answerable if runs[q.id]["citations"]]
        first = [runs[q.id]["citations"][0] in q.evidence_pages for q in cited]
        generated = [runs[q.id]["llm_ms"] for q in questions if runs[q.id].get("llm_ms") is not None]
        out["answerers"][name] = {
            "sources": dict(collections.Counter(runs[q.id]["answer_source"] for q in questions)),
            "contains_answer": _mean(list(holds[name].values())),
            "contains_answer_all_answerable": _mean([contains_answer(_plain(runs[q.id]["answer"]), q.answer) for q in answerable]),
            "short_answer_contains": _mean([contains_answer(runs[q.id].get("short_answer", ""), q.answer) for q in short]),
            "answer_words_p50": percentile([len(_plain(runs[q.id]["answer"]).split()) for q in short], 50) if short else None,
            "first_citation_on_evidence_of_cited": _mean(first),
            "cited": len(cited),
            "refusal": refusal_scores(refused, unanswerable),
            "false_refusals": _mean([r for r, u in zip(refused, unanswerable) if not u]),
            "query_ms": {"p50": percentile([runs[q.id]["query_ms"] for q in questions], 50),
                         "p95": percentile([runs[q.id]["query_ms"] for q in questions], 95)},
            "llm_ms": {"p50": percentile(generated, 50), "p95": percentile(generated, 95), "answers": len(generated)}
            if generated else None,
        }
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            out["pairs"][f"{a} / {b}"] = {
                "only_" + a: sum(holds[a][q] and not holds[b][q] for q in holds[a]),
                "only_" + b: sum(holds[b][q] and not holds[a][q] for q in holds[a]),
                "both": sum(holds[a][q] and holds[b][q] for q in holds[a]),
            }
    out["short_answers"], out["answerable"], out["unanswerable"] = len(short), len(answerable), sum(unanswerable)
    out["certainty_signal"] = {
        name: signal for name in names
        if (signal := certainty_signal(questions, {q.id: records[q.id][name] for q in questions}, answerability or {}))
    }
    return out


CERTAINTY_FEATURES = ("mean_log_prob", "least_log_prob", "mean_entropy")


def certainty_signal(questions: list[Question], answers: dict[int, dict], answerability: dict[int, Optional[float]],
                     folds: int = 5) -> Optional[dict[str, Any]]:
    """Whether a generated answer's own certainty (its tokens' mean and least log-probability, their mean
    normalised entropy) tells the unanswerable questions apart, alone and beside the served answerability
    probability (issue 56: the LLM's answerability as a feature). Over the questions the model answered: each
    feature's ROC AUC (0.5: no signal; the direction in which unanswerable questions lie is named), and logistic
    regressions cross-validated by document (folds of whole documents), their pooled held-out AUC and the best
    refusal F1 over thresholds on those scores (optimistic: the threshold is chosen on the scores it is read on).
    None when nothing was generated or no unanswerable question was answered."""
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    rows, labels, documents = [], [], []
    for q in questions:
        log_probs = np.asarray(answers[q.id].get("token_log_probs") or [], dtype=float)
        probability = answerability.get(q.id)
        if not len(log_probs) or probability is None:
            continue
        entropies = np.asarray(answers[q.id].get("token_entropies") or [], dtype=float)
        mean_entropy = float(np.nanmean(entropies)) if len(entropies) and not np.isnan(entropies).all() else np.nan
        rows.append({"answerability": float(probability), "mean_log_prob": float(log_probs.mean()),
                     "least_log_prob": float(log_probs.min()), "mean_entropy": mean_entropy})
        labels.append(not q.answerable)
        documents.append(q.document)
    y = np.array(labels, dtype=bool)
    if len(rows) < 20 or y.all() or not y.any():
        return None
    features: dict[str, Any] = {}
    for name in ("answerability", *CERTAINTY_FEATURES):
        x = np.array([row[name] for row in rows])
        known = ~np.isnan(x)
        if known.sum() < 20 or y[known].all() or not y[known].any():
            continue
        auc = float(roc_auc_score(y[known], x[known]))
        features[name] = {"auc": max(auc, 1 - auc), "unanswerable": "higher" if auc >= 0.5 else "lower"}
    names = sorted(set(documents))
    fold_of = {document: i % folds for i, document in enumerate(names)}
    models: dict[str, Any] = {}
    for label, columns in (("answerability", ["answerability"]), ("certainty", list(CERTAINTY_FEATURES)),
                           ("answerability + certainty", ["answerability", *CERTAINTY_FEATURES])):
        x = np.array([[row[c] for c in columns] for row in rows])
        scores = np.full(len(rows), np.nan)
        for fold in range(folds):
            held = np.array([fold_of[d] == fold for d in documents])
            if held.all() or not held.any() or y[~held].all() or not y[~held].any():
                continue
            model = make_pipeline(SimpleImputer(), StandardScaler(), LogisticRegression(class_weight="balanced", max_iter=1000))
            scores[held] = model.fit(x[~held], y[~held]).predict_proba(x[held])[:, 1]
        scored = ~np.isnan(scores)
        best = max(((refusal_scores(list(scores[scored] >= t), list(y[scored]))["f1"] or 0.0, float(t))
                    for t in np.unique(scores[scored])), default=(0.0, 1.0))
        refused = scores[scored] >= best[1]
        models[label] = {"cv_auc": float(roc_auc_score(y[scored], scores[scored])), "best_f1": best[0],
                         "false_refusals": float(refused[~y[scored]].mean())}
    return {"questions": len(rows), "unanswerable": int(y.sum()), "documents": len(names), "folds": folds,
            "features": features, "models": models}


def score_routers(questions: list[Question], records: dict[int, dict[str, dict]]) -> dict[str, Any]:
    """Per router mode: the routes it gives, its accuracy on MMLongBench's single-page / cross-page split of the
    answerable questions (single-page: simple; cross-page: moderate or complex), and its agreement with the others."""
    if not records:
        return {}
    modes = list(next(iter(records.values())))
    answerable = [q for q in questions if q.answerable and q.evidence_pages]
    out: dict[str, Any] = {"modes": {}, "agreement": {}}
    for mode in modes:
        labels = {q.id: records[q.id][mode]["label"] for q in questions}
        single = [q for q in answerable if len(set(q.evidence_pages)) == 1]
        cross = [q for q in answerable if len(set(q.evidence_pages)) > 1]
        right = [labels[q.id] == "simple" for q in single] + [labels[q.id] != "simple" for q in cross]
        out["modes"][mode] = {
            "routes": dict(collections.Counter(labels.values())),
            "split_accuracy": _mean(right),
            "single_page_simple": _mean([labels[q.id] == "simple" for q in single]),
            "cross_page_not_simple": _mean([labels[q.id] != "simple" for q in cross]),
            "single_page": len(single), "cross_page": len(cross),
            "retrieve_ms_p50": percentile([records[q.id][mode]["retrieve_ms"] for q in questions], 50),
        }
    for i, a in enumerate(modes):
        for b in modes[i + 1:]:
            out["agreement"][f"{a} / {b}"] = _mean([records[q.id][a]["label"] == records[q.id][b]["label"] for q in questions])
    return out


def _f(value: Optional[float], digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def report_lines(answerers: dict[str, Any], routers: dict[str, Any]) -> list[str]:
    """The report's section on answerers and routers (empty when neither was compared)."""
    lines: list[str] = []
    if answerers:
        lines += [
            "", "## Answerers compared (Query once per answerer, same collections, same run)", "",
            f"{answerers['short_answers']} short-answer questions, {answerers['answerable']} answerable with evidence "
            f"pages, {answerers['unanswerable']} unanswerable.", "",
            "| answerer | answer holds the value (short-answer q.) | all answerable | short answer holds it | answer words p50 "
            "| first citation on evidence | refusal P / R / F1 | false refusals | Query p50 / p95 ms | LLM generation p50 / p95 ms |",
            "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|",
        ]
        for name, row in answerers["answerers"].items():
            refusal, llm = row["refusal"], row["llm_ms"]
            lines.append(
                f"| {name} | {_f(row['contains_answer'])} | {_f(row['contains_answer_all_answerable'])} | "
                f"{_f(row['short_answer_contains'])} | {_f(row['answer_words_p50'], 0)} | "
                f"{_f(row['first_citation_on_evidence_of_cited'])} ({row['cited']} cited) | {_f(refusal['precision'])} / "
                f"{_f(refusal['recall'])} / {_f(refusal['f1'])} ({refusal['declined']}) | {_f(row['false_refusals'])} | "
                f"{row['query_ms']['p50']:.0f} / {row['query_ms']['p95']:.0f} | "
                + (f"{llm['p50']:.0f} / {llm['p95']:.0f} ({llm['answers']})" if llm else "-") + " |"
            )
        lines.append("")
        for pair, counts in answerers["pairs"].items():
            lines.append(f"- {pair}: " + ", ".join(f"{key.replace('_', ' ')} {value}" for key, value in counts.items())
                         + " (short-answer questions holding the value)")
        lines += ["- Sources: " + "; ".join(f"{name}: " + ", ".join(f"{s} {n}" for s, n in sorted(row["sources"].items()))
                                            for name, row in answerers["answerers"].items())]
        for name, signal in (answerers.get("certainty_signal") or {}).items():
            lines += [
                "", f"### What the {name} answer's own certainty says of answerability", "",
                f"Over the {signal['questions']} questions it answered ({signal['unanswerable']} unanswerable, "
                f"{signal['documents']} documents): each signal's ROC AUC for the unanswerable ones (0.5: none), and "
                f"logistic regressions cross-validated by document ({signal['folds']} folds), their held-out AUC and "
                "best refusal F1 over thresholds on the held-out scores (optimistic: chosen where it is read).", "",
                "| signal | AUC | unanswerable questions lie |", "|---|---:|---|",
                *[f"| {feature} | {row['auc']:.3f} | {row['unanswerable']} |" for feature, row in signal["features"].items()],
                "", "| model | CV AUC | best refusal F1 | false refusals there |", "|---|---:|---:|---:|",
                *[f"| {label} | {row['cv_auc']:.3f} | {row['best_f1']:.3f} | {row['false_refusals']:.3f} |"
                  for label, row in signal["models"].items()],
            ]
    if routers:
        lines += [
            "", "## Routers compared (Retrieve once per router mode)", "",
            "No route labels exist for these questions; MMLongBench-Doc marks whether a question's evidence is on one page or "
            "several. Scored: a single-page question routed simple, a cross-page one not simple.", "",
            "| router | routes | single/cross-page accuracy | single-page simple | cross-page not simple | Retrieve p50 ms |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for mode, row in routers["modes"].items():
            routes = ", ".join(f"{label} {n}" for label, n in sorted(row["routes"].items()))
            lines.append(f"| {mode} | {routes} | {_f(row['split_accuracy'])} | {_f(row['single_page_simple'])} "
                         f"({row['single_page']}) | {_f(row['cross_page_not_simple'])} ({row['cross_page']}) | "
                         f"{row['retrieve_ms_p50']:.0f} |")
        lines += [""] + [f"- Agreement {pair}: {_f(value)}" for pair, value in routers["agreement"].items()]
    return lines
