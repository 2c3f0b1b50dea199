"""V-RAG's LMM relevance filter, read off the VLM's next-token distribution: P(yes) against P(no).

One prefill per (question, image) pair and no decoding, so a page filter over 60 pages is one batched
forward pass instead of 60 generations, and the score is a probability rather than a sampled word.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

RELEVANCE_QUESTION = "Can this image provide answers to this question? Respond only with yes or no."
# The prompt itself is the model config's `relevance_prompt`: the build renders it with the VLM's own chat
# template, with {image} where the image placeholder goes and {question} where the question does.
YES_SPELLINGS = ("yes", "Yes", " yes", " Yes", "YES")
NO_SPELLINGS = ("no", "No", " no", " No", "NO")


def relevance_prompt(template: str, question: str, image_token: str) -> str:
    return template.replace("{image}", image_token).replace("{question}", question)


def first_token_ids(encode: Callable[[str], Sequence[int]], spellings: Sequence[str]) -> list[int]:
    """The first token of each spelling (a word may be split into several tokens), deduplicated."""
    ids: list[int] = []
    for spelling in spellings:
        tokens = list(encode(spelling))
        if tokens and tokens[0] not in ids:
            ids.append(tokens[0])
    return ids


def yes_probability(logits: np.ndarray, yes_ids: Sequence[int], no_ids: Sequence[int]) -> np.ndarray:
    """P(yes) / (P(yes) + P(no)) per row of next-token logits [b, vocab], computed in log space."""
    logits = np.asarray(logits, dtype=np.float64)
    yes = _logsumexp(logits[:, list(yes_ids)])
    no = _logsumexp(logits[:, list(no_ids)])
    return (1.0 / (1.0 + np.exp(no - yes))).astype(np.float32)


def _logsumexp(values: np.ndarray) -> np.ndarray:
    top = values.max(axis=1, keepdims=True)
    return (top + np.log(np.exp(values - top).sum(axis=1, keepdims=True)))[:, 0]


def group_by_length(lengths: Sequence[int]) -> dict[int, list[int]]:
    """Row indices per sequence length: rows of one length prefill together without padding."""
    groups: dict[int, list[int]] = {}
    for row, length in enumerate(lengths):
        groups.setdefault(length, []).append(row)
    return groups
