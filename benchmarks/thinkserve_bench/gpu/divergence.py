"""Where the greedy tokens of Triton and of in-process PyTorch first differ for one prompt, and by what margin the
in-process model chose there: the gap between its two largest logits at that step, and between the logit of its
token and of the one Triton produced. On the first H200 run the LLM's tokens differed and the VLM's did not, and the
runner kept only `same_tokens`.

A small margin where they part (a few hundredths of a logit in bf16) points at numerics: two near-equal logits
swapped by a different kernel, batch or reduction order; a large one at another cause (different inputs, a path
that is not the same model). Which it is, is for the recorded data to show; nothing here decides it."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np


def first_divergence(ours: Sequence[int], theirs: Sequence[int]) -> Optional[int]:
    """The index of the first generated token that differs; where one sequence is a prefix of the other, the
    index where the shorter ended; None when they are equal."""
    for index, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return index
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))


def logits_after(decoder, prompt: np.ndarray, tokens: Sequence[int],
                 embed: Optional[Callable[[np.ndarray], np.ndarray]] = None) -> np.ndarray:
    """The next-token logits after `prompt` and `tokens`, stepped as decoding.generate steps (the prompt in one
    step, then one token a step, each through `embed` for a decoder fed embeddings), on the caller's thread's cache:
    the same kernels and shapes as an in-process stream generated one per thread. A stream of the in-flight batcher
    ran batched: its replay is the same model alone, so near-ties may fall the other way (on the H200, 24 of 41)."""
    sequence = decoder.sequence()
    logits = sequence.step(prompt)
    for token in tokens:
        step = np.array([[token]], dtype=np.int64)
        logits = sequence.step(embed(step) if embed is not None else step)
    return np.asarray(logits, dtype=np.float32).reshape(-1)


def margins(logits: np.ndarray, ours: int, theirs: Optional[int]) -> dict:
    """At one step: the top two logits' gap, whether the replay chose `ours` again, and our logit minus theirs."""
    top = np.argsort(logits)[::-1][:2]
    result = {
        "top1_minus_top2": float(logits[top[0]] - logits[top[1]]),
        "replay_token": int(top[0]),
        "replay_matches": int(top[0]) == ours,
        "in_process_minus_triton": None,
    }
    if theirs is not None and 0 <= theirs < logits.shape[0]:
        result["in_process_minus_triton"] = float(logits[ours] - logits[theirs])
    return result


def stream_divergence(index: int, ours: Sequence[int], theirs: Sequence[int]) -> dict:
    """One stream's comparison (margins filled in later, by a replay): where they part and the tokens there."""
    at = first_divergence(ours, theirs)
    return {
        "stream": index, "first_divergent_token": at, "tokens": [len(ours), len(theirs)],
        "in_process_token": ours[at] if at is not None and at < len(ours) else None,
        "triton_token": theirs[at] if at is not None and at < len(theirs) else None,
    }


def summary(streams: Sequence[dict]) -> dict:
    """A level's streams in brief: how many differ, the earliest divergence, the smallest and largest margin."""
    parted = [s for s in streams if s["first_divergent_token"] is not None]
    gaps = [s["top1_minus_top2"] for s in parted if s.get("top1_minus_top2") is not None]
    return {
        "streams": len(streams), "diverged": len(parted),
        "earliest": min((s["first_divergent_token"] for s in parted), default=None),
        "margin_min": min(gaps, default=None), "margin_max": max(gaps, default=None), "margins": len(gaps),
    }
