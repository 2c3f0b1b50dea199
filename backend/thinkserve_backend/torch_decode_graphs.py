"""CUDA graphs of the batched decoder's decode step: one forward pass replayed without the host's work per operator.

Why: on an H200 (benchmarks/results/gpu/h200-2026-11-29) a decode step of the 1.5B LLM took 26-37 ms whether 1 or 32
rows ran, with the GPU busy 17-38% of the time: eager transformers code issues about 1,300 operators a step, and
launching them, not the GPU, set the pace. A captured graph replays every kernel of the step in one launch.

A graph has fixed shapes, so a step is rounded up to a bucket: its rows to the next power of two (at most the
decoder's slots) and the length it attends over to the next power of two from `min_length` (at most the cache's
capacity). Padding rows are free rows of the cache (running rows are always 0..n-1): they decode a token at position
0, which only that row's next prefill overwrites, and their logits are dropped. Attending over a longer length than
needed changes nothing but the summation's order: the mask hides every position past a row's own.

`BucketedSteps` runs the same bucketed step eagerly: on the CPU (where no graph exists) the tests check through it
that rounding shapes up leaves every token as it was. `DecodeGraphs` captures one graph per bucket at load, on the
model's device; `BatchDecoder.use_cuda_graphs` checks the replayed logits against whole sequences before serving
with them and keeps the eager step when capture or the check fails (a transformers whose forward synchronises with
the host cannot be captured).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

Step = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]  # (ids [n], positions [n], length) -> logits [n, vocab]


def power_buckets(largest: int, smallest: int = 1) -> tuple[int, ...]:
    """Powers of two from `smallest` below `largest`, then `largest` itself: every size up to it has a bucket."""
    buckets, size = [], max(1, smallest)
    while size < largest:
        buckets.append(size)
        size *= 2
    return (*buckets, largest)


def bucket_of(size: int, buckets: Sequence[int]) -> int:
    for bucket in buckets:
        if size <= bucket:
            return bucket
    raise ValueError(f"{size} exceeds the largest bucket, {buckets[-1]}")


class BucketedSteps:
    """The decode step at bucketed shapes, run eagerly: the rows and the attended length rounded up, padding rows at
    position 0, the logits of the real rows returned."""

    def __init__(self, step: Step, slots: int, capacity: int, device: torch.device, min_length: int = 256):
        self.step = step
        self.row_buckets = power_buckets(slots)
        self.length_buckets = power_buckets(capacity, min(min_length, capacity))
        self.device = device
        self.ids = torch.zeros(slots, dtype=torch.long, device=device)
        self.positions = torch.zeros(slots, dtype=torch.long, device=device)

    def shapes(self, rows: int, length: int) -> tuple[int, int]:
        return bucket_of(rows, self.row_buckets), bucket_of(length, self.length_buckets)

    def load(self, token_ids: Sequence[int], positions: Sequence[int]) -> tuple[int, int]:
        """This step's ids and positions into the static buffers (padding rows: token 0 at position 0)."""
        rows, length = self.shapes(len(token_ids), max(positions) + 1)
        staged = torch.zeros((2, rows), dtype=torch.long)
        staged[0, : len(token_ids)] = torch.as_tensor(token_ids, dtype=torch.long)
        staged[1, : len(positions)] = torch.as_tensor(positions, dtype=torch.long)
        self.ids[:rows].copy_(staged[0])
        self.positions[:rows].copy_(staged[1])
        return rows, length

    def __call__(self, token_ids: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        rows, length = self.load(token_ids, positions)
        return self.step(self.ids[:rows], self.positions[:rows], length)[: len(token_ids)]


class DecodeGraphs(BucketedSteps):
    """One CUDA graph per (rows, length) bucket, captured at load and sharing one memory pool (they never run at
    once); a step copies its ids and positions into the graphs' static inputs and replays one."""

    def __init__(self, step: Step, slots: int, capacity: int, device: torch.device, min_length: int = 256):
        super().__init__(step, slots, capacity, device, min_length)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    def capture(self, warmups: int = 2) -> None:
        """Every bucket's graph, after `warmups` eager runs of its shapes on the capturing stream (kernels chosen and
        workspaces allocated before capture, as torch.cuda.graph requires). The steps write keys and values of token
        0 at position 0 into rows that hold no sequence yet (this runs at load): the caller clears the cache after."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        pool = None
        with torch.cuda.stream(stream):
            for rows in self.row_buckets:
                for length in self.length_buckets:
                    ids, positions = self.ids[:rows], self.positions[:rows]
                    for _ in range(warmups):
                        self.step(ids, positions, length)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=stream):
                        logits = self.step(ids, positions, length)
                    pool = graph.pool()
                    self.graphs[(rows, length)] = (graph, logits)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)

    def __call__(self, token_ids: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        graph, logits = self.graphs[self.load(token_ids, positions)]
        graph.replay()
        return logits[: len(token_ids)]

    def __len__(self) -> int:
        return len(self.graphs)
