"""Replaced snapshots freed on a thread of their own, a slice at a time, so that no query waits for it.

CPython frees an object graph in one go, holding the interpreter, in whichever thread drops the last reference.
A snapshot whose graph was built from every document (what a delete or a replacement publishes) replaces one
whose graph nothing else shares: freeing that graph's merged records and tables took 0.45 s at 100,000 chunks in
the thread that published the new snapshot, and every query waited (several seconds at a million chunks). Here
the replaced snapshot's lists and dicts are emptied a slice at a time, yielding the interpreter between slices.
Only what nothing else holds is emptied (sys.getrefcount): a newer graph that extends an older one shares some of
its containers, and a running query may still hold the snapshot (it is then retried later, or left to its last
holder). A collection hands it only snapshots whose graph the new one does not extend (deletes, replacements):
after an append the replaced snapshot shares most of its graph and is freed where it is dropped, quickly; emptying
it here cost the next queries more (benchmarks/results/incremental_commit.md, measured both ways).
"""

from __future__ import annotations

import itertools
import logging
import queue
import sys
import threading
import time
from typing import Optional

log = logging.getLogger("thinkserve.knowledge")
SLICE = 2_000  # list items or dict entries freed between two yields of the interpreter (about a millisecond)
RETRY_S = 0.05  # how soon a snapshot still held is looked at again
GIVE_UP_S = 120.0  # a snapshot still held after this is left to its last holder
DEPTH = 2  # the snapshot's attributes, theirs (the graph's tables and merged records), and theirs
SAMPLE = 16  # items looked at to tell whether a container holds its items alone


class Reaper:
    def __init__(self):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self.freed = 0  # snapshots emptied here (for tests and logs)

    def release(self, snapshot: object) -> None:
        """Take over a reference to a snapshot queries no longer start with; the caller drops its own."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="snapshot-reaper", daemon=True)
                self._thread.start()
        self._queue.put((snapshot, time.monotonic() + GIVE_UP_S))

    def _run(self) -> None:
        held: list = []  # (snapshot, give up at) still referenced elsewhere
        while True:
            try:
                held.append(self._queue.get(timeout=RETRY_S if held else None))
            except queue.Empty:
                pass
            waiting = []
            while held:
                snapshot, give_up = held.pop()
                # held by `snapshot` and by getrefcount's argument only: no query, no builder, no collection
                if sys.getrefcount(snapshot) == 2:
                    try:
                        dismantle(snapshot, DEPTH)
                        self.freed += 1
                    except Exception:  # freeing must never stop the thread; the rest goes as usual
                        log.exception("emptying a replaced snapshot failed")
                elif time.monotonic() < give_up:
                    waiting.append((snapshot, give_up))
                del snapshot
            held = waiting


def dismantle(owner: object, depth: int) -> None:
    """Take apart `owner`, which nothing else holds: each attribute nothing else holds is removed from it and, if
    it is a list or dict that holds its items alone, emptied a slice at a time, or, if it is an object, taken
    apart the same way (`depth` levels down). Passes repeat while they free something, since an attribute can be
    held only by another (a graph by the view that wraps it); what is left is dropped for its other holders."""
    attributes = getattr(owner, "__dict__", None)
    if not isinstance(attributes, dict):
        return
    freed = True
    while attributes and freed:
        freed = False
        for name in list(attributes):
            value = attributes[name]
            # held by `attributes`, by `value` and by getrefcount's argument: by nothing else
            if sys.getrefcount(value) == 3:
                del attributes[name]
                _take_apart(value, depth)
                freed = True
            del value
    attributes.clear()


def _take_apart(value: object, depth: int) -> None:
    if type(value) is list:
        if _owns_its_items(value):
            _empty_list(value)
    elif type(value) is dict:
        if _owns_its_items(value.values()):
            _empty_dict(value)
    elif depth > 0:
        dismantle(value, depth - 1)


def _owns_its_items(items) -> bool:
    """Whether most of a container's first items are held by it alone: then freeing it frees them, which is
    what takes long. A container of shared items (an older graph's table of what a newer one shares, keys and
    small numbers) is freed in one go, quickly, and is not worth slicing."""
    sample = list(itertools.islice(items, SAMPLE))
    owned = 0
    for item in sample:
        # held by the container, by `sample`, by `item` and by getrefcount's argument: by nothing else
        owned += sys.getrefcount(item) == 4
    return owned * 2 > len(sample)


def _empty_list(items: list) -> None:
    while items:
        del items[-SLICE:]
        time.sleep(0)


def _empty_dict(entries: dict) -> None:
    while entries:
        for _ in range(min(SLICE, len(entries))):
            entries.popitem()
        time.sleep(0)


REAPER = Reaper()  # one per process: collections hand it the snapshots they stop publishing
