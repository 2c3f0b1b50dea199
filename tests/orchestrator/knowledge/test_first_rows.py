"""The key tables of a snapshot (FirstRows): the table of every segment, made in C-level passes, equals the plain
definition (first-seen order; each key's first preferred occurrence, else its first), and extending a table by
appended segments equals making it from all of them."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.knowledge.storage.incremental import FirstRows


def by_definition(key_lists, preferred):
    """The table as its docstring defines it, one key at a time."""
    table: dict = {}
    for number, keys in enumerate(key_lists):
        for row, key in enumerate(keys):
            favoured = row in preferred[number]
            if key not in table:
                table[key] = (number, row, favoured)
            elif not table[key][2] and favoured:
                table[key] = (number, row, True)
    return table


def as_dict(table: FirstRows) -> dict:
    return {key: (int(n), int(r), bool(f)) for key, n, r, f in zip(table.keys, table.numbers, table.rows, table._preferred)}


segments = st.lists(
    st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f", ("a", "b"), ("b", "c")]), unique=True, max_size=6),
    max_size=6,
).flatmap(lambda lists: st.tuples(
    st.just(lists),
    st.tuples(*[st.frozensets(st.integers(0, max(0, len(keys) - 1)), max_size=len(keys)) for keys in lists]),
))


@settings(max_examples=300, deadline=None)
@given(segments, st.integers(0, 6))
def test_the_table_of_every_segment_and_an_extended_one_equal_the_definition(case, split):
    key_lists, preferred = case
    expected = by_definition(key_lists, preferred)
    whole = FirstRows.of(key_lists, preferred)
    assert as_dict(whole) == expected and whole.keys == list(expected)  # first-seen order
    split = min(split, len(key_lists))
    base = FirstRows.of(key_lists[:split], preferred[:split])
    extended = FirstRows.of(key_lists[split:], preferred[split:], base)
    assert as_dict(extended) == expected and extended.keys == list(expected) and extended.segments == len(key_lists)
    moved_keys = [key for key in base.keys if as_dict(base)[key] != expected[key]]
    assert extended.moved == bool(moved_keys)


def test_vectors_are_gathered_from_each_keys_segment_and_row():
    class Segment:
        def __init__(self, vectors):
            self.entity_vectors = np.asarray(vectors, dtype=np.float32)

    documents = [Segment([[1, 0], [2, 0]]), Segment([[3, 0], [4, 0], [5, 0]])]
    table = FirstRows.of([["x", "y"], ["y", "z", "w"]], [frozenset(), frozenset({0})])  # y's vector: the second's
    assert table.keys == ["x", "y", "z", "w"]
    assert table.vectors(documents, "entity")[:, 0].tolist() == [1, 3, 4, 5]
    assert table.vectors(documents, "entity", start=2)[:, 0].tolist() == [4, 5]
    assert table.vectors(documents, "entity", start=4).size == 0
