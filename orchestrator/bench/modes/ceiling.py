"""The model-bound ceiling: the same model calls the questions cause end to end, sent to Triton directly.

Each question is first asked once through the orchestrator (not timed) to learn its model calls: per model and
stage the calls, items and tokens of the final event's cost report, and the evidence texts it retrieved. The
replay then sends, per question and in the same order, calls of the same shape through the same client
library the orchestrator uses (TritonModels): the embedder on texts cut from the evidence to the same token
count, the cross-encoder on as many (question, passage) pairs, the router on the question, the VLM filter on
as many page-sized images, the LLM and VLM on prompts calibrated to the same prompt tokens with the same
number of generated tokens. Closed-loop levels as in the load sweep give the models' own capacity for this
request mix; end-to-end capacity divided by it is the share the orchestrator leaves on the table.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import re
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from ...triton import contracts
from ...triton.models import GenerationOptions, TritonModels
from ..record import page_recall  # noqa: F401  (re-exported for symmetry with the other modes)
from ..session import BenchSession
from ..stats import distribution, rate, ratio
from ..summary import counters_dict
from ..workload import WorkloadQuestion

WORDS_PER_TOKEN = 0.75  # first guess for encoder texts (WordPiece); generator prompts are calibrated instead


@dataclass
class Call:
    model: str
    stage: str
    items: int
    tokens_in: int
    tokens_out: int
    calls: int


@dataclass
class Plan:
    question: str
    calls: list[Call]
    texts: list[str]  # evidence texts to cut inputs from
    prompts: dict[int, str] = field(default_factory=dict)  # call index -> calibrated generator prompt
    achieved_tokens: dict[int, int] = field(default_factory=dict)


def _image(seed: int) -> bytes:
    """A page-render-sized PNG (A4 at 40 dpi) with a few lines of text: what the VLM filter is sent."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (331, 468), "white")
    draw = ImageDraw.Draw(image)
    for line in range(12):
        draw.text((20, 20 + 34 * line), f"page {seed} line {line} figures and text", fill="black")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _words(texts: Sequence[str]) -> list[str]:
    words = [w for t in texts for w in t.split()]
    return words or ["document", "text"]


def _text(words: list[str], count: int, offset: int) -> str:
    count = max(1, count)
    return " ".join(words[(offset + i) % len(words)] for i in range(count))


async def capture(session: BenchSession, questions: Sequence[WorkloadQuestion], options: dict[str, Any]) -> list[Plan]:
    plans = []
    for question in questions:
        texts, usage = [], []
        async for event in session.client.query(question.collection or session.collection, question.question,
                                                **question.query_options(options)):
            kind = event.WhichOneof("event")
            if kind == "evidence":
                texts = [item.text for item in event.evidence.items if item.text]
            elif kind == "final":
                usage = [Call(u.model, u.stage, u.items, u.tokens_in, u.tokens_out, max(1, u.calls)) for u in event.final.cost.models]
        plans.append(Plan(question.question, usage, texts))
    return plans


async def calibrate(models: TritonModels, plans: list[Plan]) -> None:
    """Generator prompts with the prompt-token counts the pipeline sent (two tries: guess, then rescale)."""
    for plan in plans:
        words = _words(plan.texts + [plan.question])
        for n, call in enumerate(plan.calls):
            if call.model not in (contracts.LLM.name, contracts.VLM.name) or not call.tokens_in:
                continue
            target = call.tokens_in // call.calls
            count = max(1, int(target * 0.7))
            images = [_image(i) for i in range(max(0, call.items // call.calls - 1))] if call.model == contracts.VLM.name else []
            for _ in range(2):
                prompt = _text(words, count, n)
                achieved = await _prompt_tokens(models, prompt, images)
                if achieved == 0:
                    break
                count = max(1, int(count * target / achieved))
            plan.prompts[n], plan.achieved_tokens[n] = prompt, achieved


async def _prompt_tokens(models: TritonModels, prompt: str, images: list[bytes]) -> int:
    async with models.generate(prompt, GenerationOptions(max_tokens=1), images) as chunks:
        tokens = 0
        async for chunk in chunks:
            tokens = chunk.prompt_tokens or tokens
    return tokens


async def replay(models: TritonModels, plan: Plan, images: list[bytes]) -> None:
    """One question's model calls, in order, through Triton directly."""
    words = _words(plan.texts + [plan.question])
    for n, call in enumerate(plan.calls):
        per_call = max(1, call.items // call.calls)
        tokens_each = max(1, call.tokens_in // max(1, call.items))
        for _ in range(call.calls):
            if call.model == contracts.TEXT_EMBEDDER.name and call.stage == "answer" and plan.texts:
                # the extractive answer embeds the evidence's own sentences: their uneven lengths set the padding
                sentences = [s for t in plan.texts for s in re.split(r"(?<=[.!?])\s+", t) if s.strip()]
                await models.embed([sentences[i % len(sentences)] for i in range(per_call)])
            elif call.model == contracts.TEXT_EMBEDDER.name:
                await models.embed([_text(words, int(tokens_each * WORDS_PER_TOKEN), i * 13) for i in range(per_call)])
            elif call.model == contracts.RERANKER.name:
                await models.rerank(plan.question, [plan.texts[i % len(plan.texts)] if plan.texts else plan.question
                                                    for i in range(per_call)])
            elif call.model == contracts.ROUTER.name:
                await models.route([plan.question] * per_call)
            elif call.model.startswith("page_text_"):
                await models.embed_page_text(call.model.removeprefix("page_text_"), [plan.question] * per_call)
            elif call.model == contracts.VLM_RELEVANCE.name:
                await models.page_relevance(plan.question, [images[i % len(images)] for i in range(per_call)])
            elif call.model in (contracts.LLM.name, contracts.VLM.name):
                pictures = [images[i % len(images)] for i in range(per_call - 1)] if call.model == contracts.VLM.name else []
                prompt = plan.prompts.get(n) or _text(words, max(1, call.tokens_in // call.calls), n)
                options = GenerationOptions(max_tokens=max(1, call.tokens_out // call.calls))
                async with models.generate(prompt, options, pictures) as chunks:
                    async for _ in chunks:
                        pass


async def ceiling_level(session: BenchSession, models: TritonModels, plans: list[Plan], concurrency: int, images: list[bytes]) -> dict:
    settings = session.settings.load
    cycle = itertools.cycle(range(len(plans)))
    ended: list[tuple[float, float]] = []  # (end, latency)
    errors: list[str] = []
    stop_at = time.monotonic() + settings.warmup_seconds + settings.level_seconds

    async def worker() -> None:
        while time.monotonic() < stop_at:
            began = time.monotonic()
            try:
                await replay(models, plans[next(cycle)], images)
                ended.append((time.monotonic(), (time.monotonic() - began) * 1000.0))
            except Exception as error:  # noqa: BLE001 - counted and reported, the level goes on
                errors.append(f"{type(error).__name__}: {error}")

    workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
    await asyncio.sleep(settings.warmup_seconds)
    before, t0 = await session.snapshot(), time.monotonic()
    await asyncio.sleep(max(0.0, stop_at - time.monotonic()))
    t1, after = time.monotonic(), await session.snapshot()
    await asyncio.gather(*workers)
    inside = [latency for end, latency in ended if t0 <= end <= t1]
    server = session.topology.leaves(after.since(before)) if before is not None and after is not None else None
    return {"concurrency": concurrency, "wall_s": t1 - t0, "completed": len(inside), "errors": len(errors),
            "error_messages": sorted(set(errors))[:5], "throughput_qps": rate(len(inside), t1 - t0),
            "latency": distribution(inside), "server": counters_dict(server) if server is not None else None}


async def run_ceiling(session: BenchSession, questions: Sequence[WorkloadQuestion], options: Optional[dict[str, Any]] = None,
                      concurrency: Optional[Sequence[int]] = None) -> dict:
    if session.triton is None:
        raise ValueError("the ceiling run drives Triton directly: give --triton-url (automatic when the command starts the deployment)")
    options = dict(options or {})
    session.progress(f"ceiling: learning the model calls of {len(questions)} questions")
    plans = await capture(session, questions, options)
    models = TritonModels(session.triton)
    await calibrate(models, plans)
    images = [_image(i) for i in range(8)]
    fidelity = {}
    for plan in plans:
        for n, tokens in plan.achieved_tokens.items():
            call = plan.calls[n]
            fidelity.setdefault(call.model, []).append(tokens / max(1, call.tokens_in // call.calls))
    levels = list(concurrency) if concurrency else [2**i for i in range(16) if 2**i <= session.settings.load.concurrency_max]
    results, previous = [], None
    for c in levels:
        session.progress(f"ceiling: concurrency {c}")
        level = await ceiling_level(session, models, plans, c, images)
        results.append(level)
        if not concurrency and previous and level["throughput_qps"] < previous["throughput_qps"] * (1 + session.settings.load.saturation_gain):
            break
        previous = level
    best = max(results, key=lambda lv: lv["throughput_qps"])
    calls_per_query = {}
    for plan in plans:
        for call in plan.calls:
            row = calls_per_query.setdefault(call.model, {"calls": 0, "items": 0, "tokens_in": 0, "tokens_out": 0})
            for key in row:
                row[key] += getattr(call, key) / len(plans)
    return {
        "mode": "ceiling", "questions": len(questions), "options": options, "levels": results,
        "best_qps": best["throughput_qps"], "best_concurrency": best["concurrency"],
        "calls_per_query": calls_per_query,
        "prompt_token_fidelity": {m: {"mean_ratio": sum(v) / len(v), "calls": len(v)} for m, v in fidelity.items()},
    }


def compute_per_query(levels: list[dict]) -> dict[str, float]:
    """Triton compute seconds per completed query, per leaf model, over a series of levels (its fidelity check)."""
    totals: dict[str, float] = {}
    completed = sum(level["completed"] for level in levels)
    for level in levels:
        for model, row in (level.get("server") or {}).items():
            totals[model] = totals.get(model, 0.0) + row["compute_ms"] / 1000.0
    return {model: seconds / completed for model, seconds in sorted(totals.items())} if completed else {}


def compare(load: dict, ceiling: dict) -> dict:
    """End-to-end capacity as a share of the model-bound ceiling, both measured in this run, and how close the
    replay's Triton compute per query came to the end-to-end queries' (the replay's fidelity)."""
    end_to_end, replayed = compute_per_query(load["closed_loop"]), compute_per_query(ceiling["levels"])
    return {**ceiling, "end_to_end_best_qps": load["best_closed_loop"]["throughput_qps"],
            "fraction": ratio(load["best_closed_loop"]["throughput_qps"], ceiling["best_qps"]),
            "compute_s_per_query": {"end_to_end": end_to_end, "replay": replayed,
                                    "replay_over_end_to_end": ratio(sum(replayed.values()), sum(end_to_end.values()))}}


def markdown(payload: dict) -> str:
    from ..report import header

    r = payload["result"]
    lines = header("Model-bound ceiling", payload)
    lines += [
        f"The model calls of {r['questions']} questions (learned from one pass through the orchestrator), replayed "
        "against Triton directly with inputs of the same shape, closed loop.", "",
        "| concurrency | throughput q/s | p50 ms | p95 ms | completed | errors |", "|---:|---:|---:|---:|---:|---:|",
    ]
    for lv in r["levels"]:
        lines.append(f"| {lv['concurrency']} | {lv['throughput_qps']:.2f} | {lv['latency']['p50_ms'] or 0:.0f} | "
                     f"{lv['latency']['p95_ms'] or 0:.0f} | {lv['completed']} | {lv['errors']} |")
    lines += ["", f"Best: **{r['best_qps']:.2f} q/s** at concurrency {r['best_concurrency']}.", "",
              "Model calls per question (mean): " + "; ".join(
                  f"{m} {v['calls']:.1f} calls, {v['items']:.1f} items, {v['tokens_in']:.0f} tokens in, {v['tokens_out']:.0f} out"
                  for m, v in r["calls_per_query"].items()),
              "", "Prompt tokens achieved / sent end to end (generators): " + (", ".join(
                  f"{m} {v['mean_ratio']:.2f}" for m, v in r["prompt_token_fidelity"].items()) or "no generator calls"), ""]
    return "\n".join(lines)
