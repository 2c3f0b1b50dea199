"""The model-bound ceiling: the same model calls the questions cause end to end, sent to Triton directly.

Each question is first asked once through the orchestrator (not timed) to learn its model calls: per model and
stage the calls, items and tokens of the final event's cost report, and the evidence texts it retrieved. The
replay then sends calls of the same shape through the same client library the orchestrator uses
(TritonModels): the embedder on texts cut from the evidence to the same token count, the cross-encoder on as
many (question, passage) pairs, the router on the question, the VLM filter on as many page-sized images, the
LLM and VLM on prompts calibrated to the same prompt tokens with the same number of generated tokens.

The replay keeps the pipeline's concurrency structure per question (orchestrator/pipeline/query.py): route
first; then the text branch (embed -> rerank) and the page-image branch (page-text encoders of every family
at once -> VLM filter) side by side, as `_retrieve` runs `_pages` as a task; then the perception calls all at
once (perception.py gathers them); then the answer (uncertainty probes one after another, then the LLM or
VLM, or the extractive answer's embedding). A replay that sent them one by one would understate what the
models can do at low concurrency. Closed-loop levels double until throughput stops growing (never stopping
below the end-to-end sweep's best level) and give the models' own capacity for this request mix; end-to-end
capacity divided by it is the share the orchestrator leaves on the table.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import os
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import grpc

from orchestrator.errors import ThinkServeError
from orchestrator.models import contracts
from orchestrator.triton.models import GenerationOptions, TritonModels
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


# stage -> (phase, branch, step, the stage's calls run concurrently): the pipeline's order of model work.
# Phases run one after another; the branches of a phase side by side; a branch's steps one after another.
STAGES: dict[str, tuple[int, int, int, bool]] = {
    "route": (0, 0, 0, False),
    "embed": (1, 0, 0, False),  # _retrieve: question embedding, (CPU retrieval), rerank ...
    "rerank": (1, 0, 1, False),
    "page_images": (1, 1, 0, True),  # ... while _pages runs: every family's text tower at once (search_pages)
    "vlm_filter": (1, 1, 1, False),
    "perception": (2, 0, 0, True),  # perceive: one VLM call per visual item, gathered
    "uncertainty": (3, 0, 0, False),  # probe, decouple, probe: each waits for the last
    "llm": (3, 0, 1, False),
    "vlm_answer": (3, 0, 1, False),
    "answer": (3, 0, 2, False),  # the extractive answer (or the fallback after a failed LLM)
}
UNKNOWN_STAGE = (9, 0, 0, False)  # a stage this table does not know: after everything, one call at a time


@dataclass
class Plan:
    question: str
    calls: list[Call]
    texts: list[str]  # evidence texts to cut inputs from
    prompts: dict[int, str] = field(default_factory=dict)  # call index -> calibrated generator prompt
    achieved_tokens: dict[int, int] = field(default_factory=dict)

    def schedule(self) -> list[list[list[tuple[bool, list[int]]]]]:
        """Phases -> branches -> steps; a step is (concurrent, indexes of `calls`)."""
        grouped: dict[int, dict[int, dict[int, tuple[bool, list[int]]]]] = {}
        for n, call in enumerate(self.calls):
            phase, branch, step, concurrent = STAGES.get(call.stage, UNKNOWN_STAGE)
            grouped.setdefault(phase, {}).setdefault(branch, {}).setdefault(step, (concurrent, []))[1].append(n)
        return [[[grouped[p][b][s] for s in sorted(grouped[p][b])] for b in sorted(grouped[p])] for p in sorted(grouped)]

    def describe(self) -> str:
        """The schedule in words: `->` in sequence, `||` side by side, `&` at once."""
        def step(concurrent: bool, calls: list[int]) -> str:
            names = [f"{self.calls[n].stage}:{self.calls[n].model}" + (f"x{self.calls[n].calls}" if self.calls[n].calls > 1 else "")
                     for n in calls]
            return (" & " if concurrent else " , ").join(names)

        phases = []
        for branches in self.schedule():
            parts = [" -> ".join(step(*s) for s in steps) for steps in branches]
            phases.append(" || ".join(f"[{p}]" for p in parts) if len(parts) > 1 else parts[0])
        return " -> ".join(phases)


def page_image(seed: int) -> bytes:
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


async def capture(session: BenchSession, questions: Sequence[WorkloadQuestion], options: dict[str, Any]) -> tuple[list[Plan], list[str]]:
    """Each question's model calls, learned from one pass through the orchestrator; a question whose pass
    failed is left out of the replay (its error is returned) rather than ending the run."""
    plans, errors = [], []
    for question in questions:
        texts, usage = [], []
        try:
            async for event in session.client.query(question.collection or session.collection, question.question,
                                                    **question.query_options(options)):
                kind = event.WhichOneof("event")
                if kind == "evidence":
                    texts = [item.text for item in event.evidence.items if item.text]
                elif kind == "final":
                    usage = [Call(u.model, u.stage, u.items, u.tokens_in, u.tokens_out, max(1, u.calls)) for u in event.final.cost.models]
        except grpc.aio.AioRpcError as error:
            errors.append(f"{question.id or question.question[:40]}: {error.code().name}: {error.details()}")
            continue
        plans.append(Plan(question.question, usage, texts))
    if not plans:
        raise ThinkServeError("the ceiling could not learn any question's model calls: " + "; ".join(errors[:3]))
    return plans, errors


async def calibrate(models: TritonModels, plans: list[Plan]) -> None:
    """Generator prompts with the prompt-token counts the pipeline sent (two tries: guess, then rescale)."""
    for plan in plans:
        words = _words(plan.texts + [plan.question])
        for n, call in enumerate(plan.calls):
            if call.model not in (contracts.LLM.name, contracts.VLM.name) or not call.tokens_in:
                continue
            target = call.tokens_in // call.calls
            count = max(1, int(target * 0.7))
            images = [page_image(i) for i in range(max(0, call.items // call.calls - 1))] if call.model == contracts.VLM.name else []
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


@dataclass
class ReplayTally:
    """What the replay actually generated (decoupled models' time is not in Triton's compute statistics)."""

    completion_tokens: dict[str, int] = field(default_factory=dict)

    def add(self, model: str, tokens: int) -> None:
        self.completion_tokens[model] = self.completion_tokens.get(model, 0) + tokens


def answer_sentences(question: str, texts: Sequence[str], descriptions: Sequence[str], limit: int) -> list[str]:
    """What the extractive answer embeds: the sentences of the evidence and of this replay's VLM descriptions,
    cut and shortlisted by the pipeline's own functions (sentences sharing content words with the question
    first, then evidence order). A random-weight VLM's long unpunctuated description shares no word with the
    question, so it is embedded only when too few evidence sentences are left, as end to end."""
    from orchestrator.knowledge.parsing.sentences import NO_SPAN, cut_sentences
    from orchestrator.pipeline.extractive import sentences_of, shortlist

    sentences = sentences_of([(rank, cut_sentences([(text, NO_SPAN)]), ()) for rank, text in enumerate([*texts, *descriptions])], set())
    return [s.text for s in shortlist(question, sentences, limit)]


async def replay(models: TritonModels, plan: Plan, images: list[bytes], tally: Optional[ReplayTally] = None) -> None:
    """One question's model calls through Triton directly, with the pipeline's concurrency (Plan.schedule)."""
    words = _words(plan.texts + [plan.question])
    described: list[str] = []  # this replay's perception outputs: the answer stage embeds their sentences

    async def step(concurrent: bool, indexes: list[int]) -> None:
        work = [(n, k) for n in indexes for k in range(plan.calls[n].calls)]
        if concurrent:
            await asyncio.gather(*(_one_call(models, plan, n, words, images, tally, described) for n, _ in work))
        else:
            for n, _ in work:
                await _one_call(models, plan, n, words, images, tally, described)

    async def branch(steps: list[tuple[bool, list[int]]]) -> None:
        for concurrent, indexes in steps:
            await step(concurrent, indexes)

    for branches in plan.schedule():
        if len(branches) == 1:
            await branch(branches[0])
        else:
            await asyncio.gather(*(branch(b) for b in branches))


async def _one_call(models: TritonModels, plan: Plan, n: int, words: list[str], images: list[bytes],
                    tally: Optional[ReplayTally], described: Optional[list[str]] = None) -> None:
    """One call of row `n`'s shape (items per call, tokens per item)."""
    call = plan.calls[n]
    per_call = max(1, call.items // call.calls)
    tokens_each = max(1, call.tokens_in // max(1, call.items))
    sentences = answer_sentences(plan.question, plan.texts, described or [], per_call) if call.stage == "answer" else []
    if call.model == contracts.TEXT_EMBEDDER.name and sentences:
        # the extractive answer embeds the evidence's sentences and the descriptions': their lengths set the padding
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
        generated, parts = 0, []
        async with models.generate(prompt, options, pictures) as chunks:
            async for chunk in chunks:
                generated = chunk.completion_tokens or generated
                parts.append(chunk.text)
        if tally is not None:
            tally.add(call.model, generated)
        if call.stage == "perception" and described is not None:
            described.append("".join(parts).strip())


async def ceiling_level(session: BenchSession, models: TritonModels, plans: list[Plan], concurrency: int, images: list[bytes]) -> dict:
    settings = session.settings.load
    cycle = itertools.cycle(range(len(plans)))
    ended: list[tuple[float, float]] = []  # (end, latency)
    errors: list[str] = []
    tally = ReplayTally()
    stop_at = time.monotonic() + settings.warmup_seconds + settings.level_seconds

    async def worker() -> None:
        while time.monotonic() < stop_at:
            began = time.monotonic()
            try:
                await replay(models, plans[next(cycle)], images, tally)
                ended.append((time.monotonic(), (time.monotonic() - began) * 1000.0))
            except Exception as error:  # noqa: BLE001 - counted and reported, the level goes on
                errors.append(f"{type(error).__name__}: {error}")

    workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
    await asyncio.sleep(settings.warmup_seconds)
    before, t0, cpu0 = await session.snapshot(), time.monotonic(), time.process_time()
    await asyncio.sleep(max(0.0, stop_at - time.monotonic()))
    t1, cpu1, after = time.monotonic(), time.process_time(), await session.snapshot()
    await asyncio.gather(*workers)
    inside = [latency for end, latency in ended if t0 <= end <= t1]
    server = session.topology.leaves(after.since(before)) if before is not None and after is not None else None
    return {"concurrency": concurrency, "wall_s": t1 - t0, "completed": len(inside), "errors": len(errors),
            "error_messages": sorted(set(errors))[:5], "throughput_qps": rate(len(inside), t1 - t0),
            "latency": distribution(inside), "server": counters_dict(server) if server is not None else None,
            # the replay's client (this process: the calls' encoding, gRPC, decoding) in CPU cores: the work the
            # orchestrator's process does end to end, which competes with the models for the same cores
            "client_cpu_cores": (cpu1 - cpu0) / (t1 - t0),
            # every replay started in the level ran to its end (the workers are awaited): tokens per replayed question
            "completion_tokens_per_question": {m: t / len(ended) for m, t in tally.completion_tokens.items()} if ended else {}}


async def run_ceiling(session: BenchSession, questions: Sequence[WorkloadQuestion], options: Optional[dict[str, Any]] = None,
                      concurrency: Optional[Sequence[int]] = None, reach: int = 1, pair_with: Optional[int] = None) -> dict:
    """`concurrency`: exactly these levels; else 1, 2, 4, ... up to the ceiling's cap, stopping once a doubling
    gains less than saturation_gain, but never before `reach` (the end-to-end sweep's best level).
    `pair_with`: the end-to-end best concurrency; after the sweep, end-to-end and ceiling windows at their best
    levels alternate (see paired_windows), so that both see the same machine."""
    if session.triton is None:
        raise ValueError("the ceiling run drives Triton directly: give --triton-url (automatic when the command starts the deployment)")
    options = dict(options or {})
    load = session.settings.load
    session.progress(f"ceiling: learning the model calls of {len(questions)} questions")
    plans, capture_errors = await capture(session, questions, options)
    models = TritonModels(session.triton)
    await calibrate(models, plans)
    images = [page_image(i) for i in range(8)]
    fidelity = {}
    for plan in plans:
        for n, tokens in plan.achieved_tokens.items():
            call = plan.calls[n]
            fidelity.setdefault(call.model, []).append(tokens / max(1, call.tokens_in // call.calls))
    levels = list(concurrency) if concurrency else [2**i for i in range(16) if 2**i <= load.ceiling_concurrency_max]
    results, previous, stop = [], None, "the sweep reached its last level"
    for c in levels:
        session.progress(f"ceiling: concurrency {c} ({load.warmup_seconds:g} s warm-up + {load.level_seconds:g} s)")
        level = await ceiling_level(session, models, plans, c, images)
        results.append(level)
        session.progress(f"  {level['throughput_qps']:.2f} q/s, p50 {level['latency']['p50_ms'] or 0:.0f} ms")
        reason = None if concurrency else sweep_stops(previous, level, reach, load.saturation_gain)
        if reason:
            stop = reason
            break
        previous = level
    best = max(results, key=lambda lv: lv["throughput_qps"])
    calls_per_query = {}
    for plan in plans:
        for call in plan.calls:
            row = calls_per_query.setdefault(call.model, {"calls": 0, "items": 0, "tokens_in": 0, "tokens_out": 0})
            for key in row:
                row[key] += getattr(call, key) / len(plans)
    paired = None
    if pair_with is not None:
        paired = await paired_windows(session, questions, options, pair_with, best["concurrency"], models, plans, images)
    return {
        "mode": "ceiling", "questions": len(questions), "replayed_questions": len(plans),
        "capture_errors": capture_errors, "options": options, "levels": results, "saturation": stop,
        "best_qps": best["throughput_qps"], "best_concurrency": best["concurrency"], "paired": paired,
        "calls_per_query": calls_per_query,
        "schedules": sorted({plan.describe() for plan in plans}),
        "prompt_token_fidelity": {m: {"mean_ratio": sum(v) / len(v), "calls": len(v)} for m, v in fidelity.items()},
    }


def _capture_errors(ceiling: dict) -> list[str]:
    errors = ceiling.get("capture_errors") or []
    return [f"Left out of the replay (their pass through the orchestrator failed): {'; '.join(errors[:5])}."] if errors else []


async def paired_windows(session: BenchSession, questions: Sequence[WorkloadQuestion], options: dict[str, Any],
                         end_to_end_c: int, ceiling_c: int, models: TritonModels, plans: list[Plan], images: list[bytes]) -> dict:
    """End to end and the ceiling at their best levels in the order E C C E, pooled per side: on a shared
    machine whose load changes between the two sweeps, only windows this close in time compare fairly."""
    from .load import closed_level

    order = [("end_to_end", end_to_end_c), ("ceiling", ceiling_c), ("ceiling", ceiling_c), ("end_to_end", end_to_end_c)]
    windows: dict[str, list[dict]] = {"end_to_end": [], "ceiling": []}
    for n, (side, c) in enumerate(order):
        session.progress(f"paired check: {side.replace('_', ' ')} at concurrency {c} (window {n + 1}/4)")
        if side == "end_to_end":
            level = await closed_level(session, questions, c, options, offset=n * 11)
            windows[side].append({"concurrency": c, "wall_s": level["wall_s"], "completed": level["completed"],
                                  "throughput_qps": level["throughput_qps"], "p50_ms": level["latency"]["client"]["p50_ms"]})
        else:
            level = await ceiling_level(session, models, plans, c, images)
            windows[side].append({"concurrency": c, "wall_s": level["wall_s"], "completed": level["completed"],
                                  "throughput_qps": level["throughput_qps"], "p50_ms": level["latency"]["p50_ms"],
                                  "client_cpu_cores": level["client_cpu_cores"]})
        windows[side][-1]["load_average"] = os.getloadavg()[0]
        session.progress(f"  {windows[side][-1]['throughput_qps']:.2f} q/s")
    pooled = {side: sum(w["completed"] for w in ws) / sum(w["wall_s"] for w in ws) for side, ws in windows.items()}
    return {"order": "E C C E", "windows": windows, "end_to_end_qps": pooled["end_to_end"], "ceiling_qps": pooled["ceiling"],
            "fraction": ratio(pooled["end_to_end"], pooled["ceiling"])}


def sweep_stops(previous: Optional[dict], level: dict, reach: int, gain: float) -> Optional[str]:
    """Why the ceiling's sweep stops after `level`, or None: a doubling gained less than `gain`, once past the
    end-to-end best level `reach` (a ceiling must be measured at least where end to end peaked)."""
    if previous is None or level["concurrency"] <= reach:
        return None
    if level["throughput_qps"] < previous["throughput_qps"] * (1 + gain):
        return f"throughput grew less than {gain:.0%} from concurrency {previous['concurrency']} to {level['concurrency']}"
    return None


def compute_per_query(levels: list[dict]) -> dict[str, float]:
    """Triton compute seconds per completed query, per leaf model, over a series of levels (its fidelity check)."""
    totals: dict[str, float] = {}
    completed = sum(level["completed"] for level in levels)
    for level in levels:
        for model, row in (level.get("server") or {}).items():
            totals[model] = totals.get(model, 0.0) + row["compute_ms"] / 1000.0
    return {model: seconds / completed for model, seconds in sorted(totals.items())} if completed else {}


def completion_tokens_per_query(load: dict) -> dict[str, float]:
    """Generated tokens per end-to-end query, per generating model, from the closed-loop records' usage."""
    totals: dict[str, float] = {}
    queries = 0
    for level in load["closed_loop"]:
        for usage in level.get("usage_per_query", {}).get("completion_tokens", {}).items():
            totals[usage[0]] = totals.get(usage[0], 0.0) + usage[1] * level["completed"]
        queries += level["completed"]
    return {m: t / queries for m, t in totals.items()} if queries else {}


def compare(load: dict, ceiling: dict) -> dict:
    """End-to-end capacity as a share of the model-bound ceiling, both measured in this run, and how close the
    replay came to the end-to-end queries: Triton compute per query per model, and generated tokens per query
    for the streaming models (whose generation Triton's compute statistics do not see)."""
    end_to_end, replayed = compute_per_query(load["closed_loop"]), compute_per_query(ceiling["levels"])
    tokens_replay: dict[str, float] = {}
    replays = sum(lv["completed"] for lv in ceiling["levels"])
    for level in ceiling["levels"]:
        for model, tokens in level.get("completion_tokens_per_question", {}).items():
            tokens_replay[model] = tokens_replay.get(model, 0.0) + tokens * level["completed"] / max(1, replays)
    end_to_end_qps = load["best_closed_loop"]["throughput_qps"]
    fraction = ratio(end_to_end_qps, ceiling["best_qps"])
    paired = ceiling.get("paired") or {}
    # the headline: the paired windows where there are any (the same machine conditions), else the two sweeps
    headline = paired.get("fraction", fraction)
    return {**ceiling, "end_to_end_best_qps": end_to_end_qps, "end_to_end_best_concurrency": load["best_closed_loop"]["concurrency"],
            "fraction_of_sweeps": fraction, "fraction": headline,
            "ceiling_below_end_to_end": headline is not None and headline > 1.0,
            "compute_s_per_query": {"end_to_end": end_to_end, "replay": replayed,
                                    "replay_over_end_to_end": ratio(sum(replayed.values()), sum(end_to_end.values()))},
            "completion_tokens_per_query": {"end_to_end": completion_tokens_per_query(load), "replay": tokens_replay}}


def markdown(payload: dict) -> str:
    from ..mode_reports import header

    r = payload["result"]
    lines = header("Model-bound ceiling", payload)
    lines += [
        f"The model calls of {r.get('replayed_questions', r['questions'])} of {r['questions']} questions (learned from "
        "one pass through the orchestrator), replayed against Triton directly with inputs of the same shape, closed loop.",
        *_capture_errors(r), "",
        "| concurrency | throughput q/s | p50 ms | p95 ms | completed | errors | replay client CPU (cores) |", "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for lv in r["levels"]:
        lines.append(f"| {lv['concurrency']} | {lv['throughput_qps']:.2f} | {lv['latency']['p50_ms'] or 0:.0f} | "
                     f"{lv['latency']['p95_ms'] or 0:.0f} | {lv['completed']} | {lv['errors']} | {lv.get('client_cpu_cores', 0):.2f} |")
    lines += ["", f"Best: **{r['best_qps']:.2f} q/s** at concurrency {r['best_concurrency']}. Sweep stopped: {r['saturation']}.", "",
              "Replay schedules (`->` in sequence, `||` side by side, `&` at once), as the pipeline runs them:", "",
              *[f"- `{s}`" for s in r["schedules"]], "",
              "Model calls per question (mean): " + "; ".join(
                  f"{m} {v['calls']:.1f} calls, {v['items']:.1f} items, {v['tokens_in']:.0f} tokens in, {v['tokens_out']:.0f} out"
                  for m, v in r["calls_per_query"].items()),
              "", "Prompt tokens achieved / sent end to end (generators): " + (", ".join(
                  f"{m} {v['mean_ratio']:.2f}" for m, v in r["prompt_token_fidelity"].items()) or "no generator calls"), ""]
    return "\n".join(lines)
