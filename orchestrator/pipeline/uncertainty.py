"""Uncertainty-guided answering (HKRAG): pruner, judger, decoupler; the summarizer is the final answer stream.

Pruner: the smallest top-n of the ranked text evidence whose relevance sums to `sufficiency` (capacity: the
route's evidence_k); the pages the page filter kept stay (evidence.answering_order says why). Judger: a short
probe answer from that evidence; its mean token entropy in nats (from the LLM's own distributions) above the
threshold marks the pair uncertain. The threshold is the LLM's own, calibrated by the build
(thinkserve_build.calibration says why nats and how), or `threshold_nats` when set. Decoupler: while uncertain
and under `max_iterations`, mine fine-print details anchored on the salient evidence, then probe again with them.
The probes are never shown to the reader and never fed back as input (as in the paper); the summarizer answers
from the kept evidence and the mined details.

Only the probes ask for entropies (GenerationOptions.entropies): the gpu target's engines ship the vocabulary's
logits for the probes' tokens alone, and every answer streams without them. `uncertainty.measure = "surprisal"`
needs no logits at all: the probe is sampled at temperature 1 with a fixed seed and the measure is the mean -log p
of its tokens (each chosen token's log-probability, 4 bytes a token). Its expectation at each step is that step's
entropy (E[-log p(x)] = H(p) for x drawn from p), so it estimates HKRAG's measure along a sampled path instead of
reading it along the greedy one; its threshold is calibrated the same way on the same questions. How often the
two decide alike is measured on recorded generations (`thinkserve-bench judger_measures`): not often enough
to be the default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from ..config import UncertaintySettings
from ..errors import ModelExecutionError, TritonUnavailableError
from ..prompts import Count, answer_prompt, decoupler_prompt
from ..models import contracts
from ..models.chat_template import chat_template_of
from ..models.protocol import GenerationOptions, GeneratorFacts, mean_entropy_nats, mean_surprisal_nats
from .accounting import StageModels
from .events import EvidenceItem, UncertaintyReport
from .evidence import answering_order


def prune(relevances: Sequence[float], capacity: int, sufficiency: float) -> tuple[int, float]:
    """(n, mass): the smallest n whose top-n relevances sum to `sufficiency`, else all up to `capacity`."""
    mass = 0.0
    limit = min(len(relevances), max(1, capacity))
    for n, relevance in enumerate(relevances[:limit], 1):
        mass += max(0.0, float(relevance))
        if mass >= sufficiency:
            return n, mass
    return limit, mass


ENTROPY, SURPRISAL = "entropy", "surprisal"


def judger_threshold(settings: UncertaintySettings, facts: GeneratorFacts, measure: str = ENTROPY) -> float:
    """The setting when given, else what the LLM declares for the measure (its build calibrated it)."""
    if settings.threshold_nats is not None:
        return settings.threshold_nats
    declared, parameter = (
        (facts.judger_entropy_nats, contracts.JUDGER_THRESHOLD_PARAMETER)
        if measure == ENTROPY
        else (facts.judger_surprisal_nats, contracts.JUDGER_SURPRISAL_PARAMETER)
    )
    if declared is None:
        raise TritonUnavailableError(
            f"the LLM does not declare the judger's {measure} threshold (config parameter {parameter!r}): "
            "rebuild the model repository, or set uncertainty.threshold_nats"
        )
    return declared



@dataclass(frozen=True)
class Deliberation:
    evidence: list[EvidenceItem]  # what the summarizer answers from
    notes: str  # the decoupler's fine print
    report: UncertaintyReport


async def deliberate(
    models: StageModels,
    question: str,
    evidence: Sequence[EvidenceItem],
    settings: UncertaintySettings,
    capacity: int,
    options: GenerationOptions,
    budget_tokens: int,
    count: Count,
    instruction: str,
    timeout_s: float,
    request_id: str = "",
) -> Deliberation:
    facts = await models.generator_facts(contracts.LLM.name)
    if facts.vocabulary < 2:
        raise TritonUnavailableError(
            f"the LLM does not declare its vocabulary size (config parameter {contracts.VOCABULARY_PARAMETER!r}), "
            "without which its entropies cannot be read in nats: rebuild the model repository"
        )
    measure = settings.measure
    threshold = judger_threshold(settings, facts, measure)
    chat = chat_template_of(facts, contracts.LLM.name)
    text = [item for item in evidence if item.record.kind != "page"]
    kept, mass = prune([item.score for item in text], capacity, settings.sufficiency)
    salient = answering_order(text[:kept] + [item for item in evidence if item.record.kind == "page"])
    probe_options = replace(options, max_tokens=settings.probe_tokens, entropies=measure == ENTROPY)
    if measure == SURPRISAL:  # the model's own distribution, sampled: its log-probabilities are the model's
        probe_options = replace(probe_options, temperature=1.0, top_p=1.0, seed=settings.probe_seed)

    async def probe(notes: str) -> float:
        prompt, _ = answer_prompt(chat, question, salient, budget_tokens - settings.probe_tokens, count, instruction, notes=notes)
        completion = await models.complete(prompt, probe_options, timeout_s=timeout_s, request_id=request_id)
        if measure == SURPRISAL:
            value, lacking = mean_surprisal_nats(completion.log_probs, facts.vocabulary), "log-probabilities"
        else:
            value, lacking = mean_entropy_nats(completion.normalized_entropy, facts.vocabulary), "entropies"
        if math.isnan(value):  # NaN > threshold is False: it would pass every answer as certain, silently
            raise ModelExecutionError(
                f"the LLM streamed tokens without {lacking}, so the judger cannot weigh the probe by {measure}: "
                + ("is its TensorRT-LLM engine built without --gather_generation_logits? (uncertainty.measure = "
                   "'surprisal' needs none)" if measure == ENTROPY else "the engine returned no output_log_probs")
            )
        return value

    entropies = [await probe("")]
    notes, iterations = "", 0
    while entropies[-1] > threshold and iterations < settings.max_iterations:
        iterations += 1
        prompt = decoupler_prompt(chat, question, salient, notes, budget_tokens - settings.detail_tokens, count)
        details = await models.complete(prompt, replace(options, max_tokens=settings.detail_tokens), timeout_s=timeout_s, request_id=request_id)
        if details.text and details.text not in notes:
            notes = f"{notes}\n{details.text}".strip()
        entropies.append(await probe(notes))
    report = UncertaintyReport(
        evidence_used=len(salient),
        relevance_mass=mass,
        entropies=tuple(entropies),
        threshold=threshold,
        iterations=iterations,
        uncertain=entropies[-1] > threshold,
        details=notes,
        measure=measure,
    )
    return Deliberation(salient, notes, report)
