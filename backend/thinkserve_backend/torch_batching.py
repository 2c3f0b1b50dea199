"""The torch target's half of dynamic batching: the requests of one `execute` as one padded tensor, and back."""

from __future__ import annotations

from typing import Sequence

import torch


def pad_and_concatenate(tensors: Sequence[torch.Tensor], pad_value: float | int = 0) -> torch.Tensor:
    """Right-pad each tensor to the largest size of every non-batch axis, then concatenate along axis 0 (one
    copy, into a tensor made for the batch); masks make the padding inert, as in batching.pad_and_concatenate."""
    if not tensors:
        raise ValueError("no tensors to batch")
    ndim = tensors[0].dim()
    if any(t.dim() != ndim for t in tensors):
        raise ValueError(f"cannot batch tensors of different ranks: {[tuple(t.shape) for t in tensors]}")
    shape = [sum(t.shape[0] for t in tensors)] + [max(t.shape[axis] for t in tensors) for axis in range(1, ndim)]
    batch = torch.full(shape, pad_value, dtype=tensors[0].dtype, device=tensors[0].device)
    row = 0
    for tensor in tensors:
        batch[(slice(row, row + tensor.shape[0]), *(slice(0, size) for size in tensor.shape[1:]))] = tensor
        row += tensor.shape[0]
    return batch
