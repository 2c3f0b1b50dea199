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


def batch_on_device(tensors: Sequence[torch.Tensor], pad_value: float | int, device: torch.device) -> torch.Tensor:
    """The requests' tensors as one batch on `device`: each request's tensor moved there as it lies (one copy each,
    from the memory Triton handed it in), then joined there: one request's as it is, equal shapes concatenated,
    ragged ones padded (pad_and_concatenate).

    Why: joining on the host first (a batch filled with the pad value, each request copied in, then the transfer)
    made two more passes over the bytes before the one the device needs: for 32 page images (4.8 MB of uint8) on
    the 2-core machine 0.15 ms for one request and 0.43 ms for two, against none and 0.14 ms this way. On the H200
    (benchmarks/results/gpu/h200-2026-11-30) the whole step onto the GPU took 1.8-2.7 ms for one such request and
    9.8-13.7 ms for two, so the transfer itself dominates there; what this saves there is not measured."""
    moved = [tensor.to(device, non_blocking=True) for tensor in tensors]
    if len(moved) == 1:
        return moved[0]
    if all(tensor.shape[1:] == moved[0].shape[1:] for tensor in moved):
        return torch.cat(moved)
    return pad_and_concatenate(moved, pad_value)
