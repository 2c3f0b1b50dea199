"""Choosing the next token and measuring the model's confidence in it.

Log-probabilities and entropies are taken from the model's own distribution (temperature 1, no top-p):
they describe the model's uncertainty, whatever sampling settings the caller chose. A sampled token is drawn by
inverse CDF from one uniform of the request's generator (what numpy's `choice` does), so a runtime that samples
where its logits lie (torch_decoding.DeviceLogits) draws the same token from the same seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Top-p first looks at this many most likely tokens; only if they hold less than top_p of the mass does it
# sort the whole vocabulary. Exact either way, and avoids an O(V log V) sort per step for large vocabularies.
_TOP_P_CANDIDATES = 1024


@dataclass(frozen=True)
class TokenChoice:
    token_id: int
    log_prob: float
    normalized_entropy: float


@dataclass(frozen=True)
class RowSampling:
    """How one sequence of a batch chooses its next token: greedy at temperature <= 0, else nucleus sampling from
    the request's own uniform draw (the batch's rows keep their own seeded generators)."""

    temperature: float = 0.0
    top_p: float = 1.0
    uniform: float = 0.0


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - np.max(logits)
    return shifted - np.log(np.exp(shifted).sum())


def token_measures(logits: np.ndarray, token: int) -> tuple[float, float]:
    """A token's log-probability and its step's entropy / ln(vocab), from that step's logits (temperature 1)."""
    log_probs = log_softmax(logits)
    entropy = float(-(np.exp(log_probs) * log_probs).sum() / np.log(len(logits)))
    return float(log_probs[token]), min(max(entropy, 0.0), 1.0)


def choose_token(logits, temperature: float, top_p: float, rng: np.random.Generator) -> TokenChoice:
    """Greedy when temperature <= 0, else nucleus sampling; returns the token with its log-prob and entropy.
    `logits` is one step's [vocab] array, or an object that chooses where its logits lie (its `choose_token`)."""
    if not isinstance(logits, np.ndarray):
        return logits.choose_token(temperature, top_p, rng)
    if temperature <= 0:
        token = int(np.argmax(logits))
    else:
        token = _sample(log_softmax(logits / temperature), top_p, rng)
    return TokenChoice(token, *token_measures(logits, token))


def _sample(scaled_log_probs: np.ndarray, top_p: float, rng: np.random.Generator) -> int:
    probs = np.exp(scaled_log_probs)
    if top_p >= 1.0:
        return inverse_cdf(probs, rng.random())
    candidates = min(_TOP_P_CANDIDATES, len(probs))
    top = np.argpartition(-probs, candidates - 1)[:candidates]
    if probs[top].sum() < top_p:
        top = np.arange(len(probs))
    order = top[np.argsort(-probs[top], kind="stable")]
    cumulative = np.cumsum(probs[order])
    keep = order[: int(np.searchsorted(cumulative, top_p)) + 1]
    return int(keep[inverse_cdf(probs[keep], rng.random())])


def inverse_cdf(weights: np.ndarray, uniform: float) -> int:
    """The index a uniform draw in [0, 1) falls on in the normalised cumulative weights (numpy's `choice`)."""
    cdf = np.cumsum(weights)
    return int(np.searchsorted(cdf / cdf[-1], uniform, side="right"))
