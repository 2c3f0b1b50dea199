"""Turning the requests of one `execute` call into one batch and back: the dynamic batcher's other half."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def pad_and_concatenate(arrays: Sequence[np.ndarray], pad_value: float | int = 0) -> np.ndarray:
    """Right-pad each array to the largest size of every non-batch axis, then concatenate along axis 0.

    Requests arrive ragged (each tokenised to its own length); models that mask padding (attention_mask)
    give the same result for a padded row as for the unpadded one.
    """
    if not arrays:
        raise ValueError("no arrays to batch")
    ndim = arrays[0].ndim
    if any(a.ndim != ndim for a in arrays):
        raise ValueError(f"cannot batch arrays of different ranks: {[a.shape for a in arrays]}")
    target = [max(a.shape[axis] for a in arrays) for axis in range(1, ndim)]
    padded = []
    for array in arrays:
        widths = [(0, 0)] + [(0, size - have) for size, have in zip(target, array.shape[1:])]
        if any(after for _, after in widths):
            array = np.pad(array, widths, constant_values=pad_value)
        padded.append(array)
    return np.concatenate(padded, axis=0)


def equal_shape_groups(shapes: Sequence[tuple[int, ...]]) -> list[list[int]]:
    """The requests of one `execute` (by the shapes of their inputs past the batch axis) in groups of one shape,
    each group in request order, the groups in order of their first request: a network whose result padding
    would change (PP-OCR's recogniser reads padded columns; its detector sees padded borders) runs a group at a
    time. Triton batches such requests itself only when their shapes are equal, and then holds a request whose
    shape differs from the batch being formed for up to 500 ms (measured: issue 52); letting them share an
    `execute` and grouping here avoids that wait."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, shape in enumerate(shapes):
        groups.setdefault(tuple(shape), []).append(index)
    return list(groups.values())


def split_rows(array: np.ndarray, row_counts: Sequence[int]) -> list[np.ndarray]:
    """Split a batched output back into per-request arrays, in request order."""
    if sum(row_counts) != array.shape[0]:
        raise ValueError(f"batch of {array.shape[0]} rows cannot be split into {list(row_counts)}")
    bounds = np.cumsum(row_counts)[:-1]
    return np.split(array, bounds, axis=0)
