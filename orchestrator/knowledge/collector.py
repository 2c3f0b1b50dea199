"""A collection's long-lived structures and Python's cyclic garbage collector.

A 100,000-chunk collection holds about 1.75 million objects the collector tracks (records, spans, entity and
relation mentions, lists). A collection of a generation walks every object in it, and the interpreter is held
meanwhile: a full collection took 1.4-1.5 s on the 2-vCPU development VM, and no query of the process ran
during it. Built with the collector paused (graph builds), they all sat in the youngest generation, so the first
three collections after (youngest, middle, full) each walked all of them: stalls of 1.2-1.6 s that the first
queries after a start paid (benchmarks/results/own_time.md).

These structures live as long as their snapshot and make no reference cycles, so once a snapshot is built they
are moved to the permanent generation (gc.freeze), which collections never walk. Reference counting still frees
them when their snapshot goes. The price: garbage cycles pending at that moment (a few from other work in the
process) are never collected; tests/orchestrator/knowledge/test_collector.py bounds what a snapshot's life leaves.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def building_long_lived() -> Iterator[None]:
    """Pause the collector while long-lived, acyclic structures are built (its repeated walks of them took half
    of a graph build at a million relations), then keep what was built out of its walks."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        keep_out_of_collections()
        if enabled:
            gc.enable()


def keep_out_of_collections() -> None:
    """Move every object the collector tracks now to the permanent generation: what a built snapshot holds is not
    walked again by any collection (it is freed by reference counting once nothing holds it)."""
    gc.freeze()
