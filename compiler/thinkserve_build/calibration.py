"""The judger's threshold (HKRAG's uncertainty threshold h), calibrated on the served LLM at build time.

A probe answer is uncertain when its mean token entropy, in nats, is above the threshold. Nats mean the same
for any vocabulary: a mean of H nats is the spread of a choice among e^H equally likely tokens. The paper's
entropy divided by ln(vocabulary size) does not: with Qwen's 151,936 tokens (ln = 11.93), a normalised 0.8 is
9.5 nats per token, a choice among ~14,000 tokens at every step, which a trained model never reaches, so the
decoupler never ran.

How spread a confident answer is differs from model to model (size, training, vocabulary), so the threshold is
the model's own: the build has the LLM answer CALIBRATION (questions whose answer is in the one evidence entry
given: the judger's situation after a good retrieval) through the loop Triton runs, greedily, for
PROBE_TOKENS tokens (the orchestrator's default `uncertainty.probe_tokens`), and takes the `percentile`-th of
the probes' mean entropies. A probe more uncertain than that share of answerable probes is flagged.

Where the served LLM streams no entropies (the gpu target's engines), the judger weighs a probe sampled at
temperature 1 by its mean surprisal (orchestrator/pipeline/uncertainty.py); its threshold is the same percentile of
the same questions' sampled probes, seeded as the orchestrator seeds them.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from orchestrator.prompts import SYSTEM
from orchestrator.models.protocol import mean_entropy_nats, mean_surprisal_nats

PROBE_TOKENS = 16
PROBE_SEED = 0  # the orchestrator's default uncertainty.probe_seed
# (source, evidence, question): short passages of the kinds users ingest, each answering its question.
CALIBRATION = (
    ("annual report, page 4", "Revenue rose 12% to $4.2 billion in fiscal 2023, driven by services.", "What was revenue in fiscal 2023?"),
    ("lease agreement, page 2", "The tenant shall pay a security deposit of two months' rent before the start date.", "How large is the security deposit?"),
    ("user manual, page 17", "Hold the power button for ten seconds to reset the device to factory settings.", "How do I reset the device?"),
    ("research paper, page 6", "The model reaches 87.4% accuracy on the test set, 3.1 points above the baseline.", "What accuracy does the model reach?"),
    ("news article, page 1", "The bridge reopened on 14 March after eight months of repairs costing 30 million euros.", "When did the bridge reopen?"),
    ("quarterly filing, page 9", "Cash and cash equivalents were $812 million as of September 30, 2024.", "How much cash did the company hold at the end of September 2024?"),
    ("textbook, page 112", "Photosynthesis converts light energy into chemical energy stored in glucose.", "What does photosynthesis convert light energy into?"),
    ("policy, page 3", "Employees may carry over at most five unused vacation days into the next year.", "How many vacation days can be carried over?"),
    ("survey report, page 11", "Of the 1,503 adults surveyed, 62% said the economy was their top concern.", "What share of adults named the economy as their top concern?"),
    ("product sheet, page 1", "The battery lasts up to 14 days on a single charge in typical use.", "How long does the battery last?"),
    ("contract, page 8", "Either party may terminate this agreement with ninety days' written notice.", "How much notice is needed to terminate the agreement?"),
    ("slides, page 5", "Mobile traffic grew from 31% of visits in 2014 to 52% in 2015.", "What share of visits was mobile in 2015?"),
    ("safety guide, page 21", "Do not operate the machine without the blade guard in place.", "What must be in place before operating the machine?"),
    ("annual report, page 30", "The board proposes a dividend of 1.20 per share, up from 1.05 last year.", "What dividend does the board propose?"),
    ("clinical study, page 7", "Patients in the treatment group recovered in a median of 6 days versus 9 days.", "How fast did treated patients recover?"),
    ("handbook, page 2", "The library is open from 8 a.m. to 10 p.m. on weekdays and closed on Sundays.", "When is the library open on weekdays?"),
)


def probe_prompts(chat: Callable[[str, str], str]) -> list[str]:
    """The calibration questions as the orchestrator asks a probe: its rules, one numbered evidence entry, in the
    model's chat format (`chat(system, user)`)."""
    return [chat(SYSTEM, f"Evidence:\n[1] ({source})\n{evidence}\n\nQuestion: {question}") for source, evidence, question in CALIBRATION]


def judger_threshold(
    probe: Callable[[str], Sequence[float]], chat: Callable[[str, str], str], vocabulary: int, percentile: float
) -> float:
    """The `percentile`-th mean entropy (nats) of the probes; `probe(prompt)` returns each generated token's
    normalised entropy."""
    prompts = probe_prompts(chat)
    return float(np.percentile([mean_entropy_nats(probe(prompt), vocabulary) for prompt in prompts], percentile))


def surprisal_threshold(
    sampled_probe: Callable[[str], Sequence[float]], chat: Callable[[str, str], str], vocabulary: int, percentile: float
) -> float:
    """The `percentile`-th mean surprisal (nats) of the probes sampled at temperature 1; `sampled_probe(prompt)`
    returns each generated token's log-probability."""
    prompts = probe_prompts(chat)
    return float(np.percentile([mean_surprisal_nats(sampled_probe(prompt), vocabulary) for prompt in prompts], percentile))
