"""What a snapshot derives from the previous one instead of rebuilding it: whether its documents are the previous
snapshot's with documents appended or removed, the vector indexes less a removed document's rows, and the entity
and relation tables' first rows, extended by the appended segments only.
"""

from __future__ import annotations

import itertools
import logging
from typing import Callable, Optional, Sequence

import numpy as np

from ..graph.graph import KnowledgeGraph

from ..graph.merge import removable
from .indexes import VectorIndex
from .segments import Segment

log = logging.getLogger("thinkserve.knowledge")


def is_prefix(prefix: Sequence[Segment], whole: Sequence[Segment]) -> bool:
    return len(prefix) <= len(whole) and all(a is b for a, b in zip(prefix, whole))


def graph_can_shed(source: tuple[Sequence[Segment], KnowledgeGraph], segments: Sequence[Segment]) -> bool:
    """Whether the graph made for `source`'s segments can have the documents `segments` no longer hold taken out in
    place (graph.removable); else `segments`' graph is built from every document (and, in a large collection,
    after its snapshot is published)."""
    earlier, graph = source
    removal = removed_segments(earlier, segments)
    if removal is None:
        return True
    try:
        return removable(graph, [earlier[number].graph_input() for number in removal[0]])
    except (OSError, ValueError) as error:  # a removed document's records no longer readable
        log.warning("the graph is built from every document: %s", error)
        return False


def derivable(earlier: Sequence[Segment], segments: Sequence[Segment]) -> bool:
    """Whether `segments` are `earlier` with documents appended, or removed (then any appended)."""
    return is_prefix(earlier, segments) or removed_segments(earlier, segments) is not None


def removed_segments(previous: Sequence[Segment], segments: Sequence[Segment]) -> Optional[tuple[list[int], Sequence[Segment]]]:
    """(the positions in `previous` of the segments `segments` no longer holds, the segments added after the others)
    when `segments` is `previous` less at least one segment, in order, then any new ones; else None."""
    current = {id(segment) for segment in segments}
    removed = [number for number, segment in enumerate(previous) if id(segment) not in current]
    kept = [segment for segment in previous if id(segment) in current]
    if not removed or not is_prefix(kept, segments):
        return None
    return removed, segments[len(kept) :]


def without_segments(index: VectorIndex, sizes: Sequence[int], removed: Sequence[int]) -> VectorIndex:
    """`index` (rows: each segment's `sizes` in order) less the rows of the segments at positions `removed`."""
    starts = np.cumsum([0, *sizes])
    for number in sorted(removed, reverse=True):  # the last first: the earlier rows keep their numbers
        index = index.without(int(starts[number]), int(starts[number + 1]))
    return index


class FirstRows:
    """Unique keys across segments in first-seen order, each with the (segment, row) of its first occurrence, or
    with `preferred` (rows per segment) of its first preferred occurrence where it has one. Extending it by
    appended segments reads only theirs; the table of every segment (an opening, a delete, a replacement) is made
    in C-level passes (dict.fromkeys, numpy), not a Python step per key: at 100,000 chunks that step was most of a
    delete's time."""

    def __init__(self, position: dict, numbers: np.ndarray, rows: np.ndarray, preferred: np.ndarray, segments: int,
                 moved: bool):
        self._position = position  # key -> its row in `keys`
        self.numbers = numbers  # each key's segment (int64)
        self.rows = rows  # each key's row in that segment's tables (int64)
        self._preferred = preferred  # whether each key's row is a preferred one
        self.segments = segments  # how many segments it has read
        self.moved = moved  # a key the base held has a new row (it found its first preferred occurrence here)

    @property
    def keys(self) -> list:
        return list(self._position)

    def __len__(self) -> int:
        return len(self.numbers)

    def vectors(self, segments: Sequence[Segment], kind: str, start: int = 0) -> np.ndarray:
        """The `kind` ("entity", "relation") vectors of its keys from `start` on, gathered a segment at a time."""
        numbers, rows = self.numbers[start:], self.rows[start:]
        if not len(numbers):
            return stack(())
        attribute = f"{kind}_vectors"
        order = np.argsort(numbers, kind="stable")
        groups = np.split(order, np.flatnonzero(np.diff(numbers[order])) + 1)
        tables = [np.asarray(getattr(segments[int(numbers[group[0]])], attribute)) for group in groups]
        out = np.empty((len(numbers), tables[0].shape[1]), dtype=np.float32)
        for group, table in zip(groups, tables):
            out[group] = table[rows[group]]
        return out

    @classmethod
    def of(cls, key_lists: Sequence, preferred: Optional[Sequence[frozenset[int]]] = None,
           base: Optional["FirstRows"] = None) -> "FirstRows":
        """The table of `key_lists` (one per segment, each without repeats) read after the base's segments."""
        if base is None:
            return cls._every(key_lists, preferred)
        position = dict(base._position)
        numbers, rows, flags = base.numbers.tolist(), base.rows.tolist(), base._preferred.tolist()
        held, moved = len(rows), False
        for offset, keys in enumerate(key_lists):
            number = base.segments + offset
            chosen = preferred[offset] if preferred is not None else frozenset()
            for row, key in enumerate(keys):
                at = position.get(key)
                if at is None:
                    position[key] = len(rows)
                    numbers.append(number)
                    rows.append(row)
                    flags.append(row in chosen)
                elif not flags[at] and row in chosen:
                    numbers[at], rows[at], flags[at] = number, row, True
                    moved = moved or at < held
        return cls(position, np.asarray(numbers, dtype=np.int64), np.asarray(rows, dtype=np.int64),
                   np.asarray(flags, dtype=bool), base.segments + len(key_lists), moved)

    @classmethod
    def _every(cls, key_lists: Sequence, preferred: Optional[Sequence[frozenset[int]]]) -> "FirstRows":
        sizes = [len(keys) for keys in key_lists]
        total = sum(sizes)
        unique = dict.fromkeys(itertools.chain.from_iterable(key_lists))  # first-seen order
        position = dict(zip(unique, range(len(unique))))
        codes = np.fromiter(map(position.__getitem__, itertools.chain.from_iterable(key_lists)), dtype=np.int64, count=total)
        numbers = np.repeat(np.arange(len(key_lists), dtype=np.int64), sizes)
        starts = np.cumsum([0] + sizes)
        rows = np.arange(total, dtype=np.int64) - starts[numbers]
        flags = np.zeros(total, dtype=bool)
        for number, chosen in enumerate(preferred or ()):
            if chosen:
                flags[starts[number] + np.fromiter(chosen, dtype=np.int64, count=len(chosen))] = True
        _, first = np.unique(codes, return_index=True)  # codes number the keys in first-seen order: 0, 1, 2, ...
        favoured = np.flatnonzero(flags)
        if len(favoured):
            keys, at = np.unique(codes[favoured], return_index=True)
            first[keys] = favoured[at]
        return cls(position, numbers[first], rows[first], flags[first], len(key_lists), False)


def gather_rows(
    segments: Sequence[Segment], table: Callable[[Segment], Optional[np.ndarray]], starts: np.ndarray, rows: Sequence[int],
    dimension: int,
) -> np.ndarray:
    """Rows of a per-segment table (`starts`: each segment's first global row), in the order asked; a segment
    without the table gives zeros. Row by row: a query asks for a few dozen, spread over as many documents."""
    out = np.zeros((len(rows), dimension), dtype=np.float32)
    numbers = np.searchsorted(starts, rows, side="right") - 1
    for i, (row, number) in enumerate(zip(rows, numbers.tolist())):
        vectors = table(segments[number])
        if vectors is not None and len(vectors):
            out[i] = vectors[row - starts[number]]
    return out


def stack(arrays) -> np.ndarray:
    arrays = [np.asarray(a, dtype=np.float32) for a in arrays if len(a)]
    return np.concatenate(arrays) if arrays else np.zeros((0, 0), dtype=np.float32)


def page_families(segments: Sequence[Segment]) -> set[str]:
    return {family for segment in segments for family in segment.page_vectors}
