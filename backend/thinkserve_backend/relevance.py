"""Classifying by a generator's next-token distribution: V-RAG's page relevance filter (the VLM's P(yes) against
P(no)) and the LLM router (P(simple), P(moderate), P(complex)).

One prefill per prompt and no decoding, so a page filter over 60 pages is one batched forward pass instead of
60 generations, and the score is a probability rather than a sampled word.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

RELEVANCE_QUESTION = "Can this image provide answers to this question? Respond only with yes or no."
# The prompt itself is the model config's `relevance_prompt`: the build renders it with the VLM's own chat
# template, with {image} where the image placeholder goes and {question} where the question does.


def spellings(label: str) -> tuple[str, ...]:
    """How a one-word answer may start: bare or after a space, lower case or capitalised."""
    return tuple(dict.fromkeys((label, label.capitalize(), " " + label, " " + label.capitalize(), label.upper())))


YES_SPELLINGS = spellings("yes")
NO_SPELLINGS = spellings("no")


def relevance_prompt(template: str, question: str, image_token: str) -> str:
    return template.replace("{image}", image_token).replace("{question}", question)


def first_token_ids(encode: Callable[[str], Sequence[int]], words: Sequence[str]) -> list[int]:
    """The first token of each spelling (a word may be split into several tokens), deduplicated."""
    ids: list[int] = []
    for spelling in words:
        tokens = list(encode(spelling))
        if tokens and tokens[0] not in ids:
            ids.append(tokens[0])
    return ids


def label_probabilities(logits: np.ndarray, label_ids: Sequence[Sequence[int]]) -> np.ndarray:
    """Each label's share of the next-token probability the labels hold together [b, labels], from logits
    [b, vocab]; a label's probability is that of any of its spellings' first tokens. Computed in log space."""
    logits = np.asarray(logits, dtype=np.float64)
    scores = np.stack([_logsumexp(logits[:, list(ids)]) for ids in label_ids], axis=1)
    scores -= scores.max(axis=1, keepdims=True)
    weights = np.exp(scores)
    return (weights / weights.sum(axis=1, keepdims=True)).astype(np.float32)


def yes_probability(logits: np.ndarray, yes_ids: Sequence[int], no_ids: Sequence[int]) -> np.ndarray:
    """P(yes) / (P(yes) + P(no)) per row of next-token logits [b, vocab]."""
    return label_probabilities(logits, [yes_ids, no_ids])[:, 0]



def _logsumexp(values: np.ndarray) -> np.ndarray:
    top = values.max(axis=1, keepdims=True)
    return (top + np.log(np.exp(values - top).sum(axis=1, keepdims=True)))[:, 0]


def group_by_length(lengths: Sequence[int]) -> dict[int, list[int]]:
    """Row indices per sequence length: rows of one length prefill together without padding."""
    groups: dict[int, list[int]] = {}
    for row, length in enumerate(lengths):
        groups.setdefault(length, []).append(row)
    return groups
