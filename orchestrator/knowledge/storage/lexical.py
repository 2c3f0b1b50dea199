"""The BM25 lexical index, kept as a log-structured merge of runs so that a commit costs about its own document.

A collection's BM25 index covers every text of its documents, in manifest order. Rebuilding it per commit cost
0.56 s at 100,000 chunks (benchmarks/results/incremental_commit.md), paid again after every ingest. Here an
index is a sequence of immutable *runs*, each the merged token counts of consecutive documents (`TermCounts`,
computed once per document and stored with its segment):

- adding a document appends a run of that document alone, then merges the last two runs while the older one
  holds no more texts than the newer (a binary counter: O(log n) runs, each text merged O(log n) times);
- deleting or replacing a document leaves its rows in their run as tombstones, masked out of scores and
  subtracted from the statistics; a run whose rows are more than half tombstones is rebuilt from its live
  documents;
- the collection statistics BM25 needs (text count, average length, each term's document frequency) are summed
  over the runs at query time for the question's few words, and the term weights are computed then, so a run
  never depends on the documents beside it and is shared by every snapshot that holds it.

Scores equal those of an index built from scratch over the same texts (tests/orchestrator/knowledge/test_incremental_lexical.py,
a property test over any sequence of adds, replacements and deletes). No library fitted this commit model:
`bm25s` precomputes weights against the corpus statistics and rebuilds to add a text; `tantivy` keeps its own
segment files and commit point beside ours, which the manifest switch could no longer make atomic.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from scipy import sparse

from ..parsing.text import STOP_WORDS, lexical_terms
from ..sparse_kernels import gathered_columns_product, row_entries

MERGE_RATIO = 1  # the last two runs merge while the older holds at most this many times the newer's texts
MAX_DEAD_FRACTION = 0.5  # a run with more tombstoned texts than this is rebuilt from its live documents


@dataclass(frozen=True, eq=False)
class TermCounts:
    """Texts tokenised once: their own vocabulary (term -> column, first-seen order), a [texts x vocabulary]
    count matrix and their lengths. A document's are computed once and kept with its segment, so a
    collection's BM25 index is assembled from them without tokenising the other documents again. Compared by
    identity: an index recognises the documents it already holds by their TermCounts objects."""

    vocabulary: dict[str, int]
    counts: sparse.csr_matrix  # float32
    lengths: np.ndarray  # float32, terms per text

    @classmethod
    def of(cls, texts: Sequence[str]) -> "TermCounts":
        vocabulary: dict[str, int] = {}
        pointers, columns, counts = [0], [], []
        lengths = np.zeros(len(texts), dtype=np.float32)
        for row, text in enumerate(texts):
            terms = lexical_terms(text)
            lengths[row] = len(terms)
            frequencies: dict[int, int] = {}
            for term in terms:
                column = vocabulary.setdefault(term, len(vocabulary))
                frequencies[column] = frequencies.get(column, 0) + 1
            columns.extend(frequencies.keys())
            counts.extend(frequencies.values())
            pointers.append(len(columns))
        matrix = sparse.csr_matrix(
            (np.asarray(counts, np.float32), np.asarray(columns, np.int64), np.asarray(pointers, np.int64)),
            shape=(len(texts), len(vocabulary)),
        )
        return cls(vocabulary, matrix, lengths)

    def grouped(self, groups: Sequence[np.ndarray]) -> "TermCounts":
        """The counts of texts made by joining the rows of each group (a page from its passages): the sums."""
        pointers = np.cumsum([0] + [len(g) for g in groups])
        rows = np.concatenate(groups) if len(groups) else np.zeros(0, np.int64)
        summing = sparse.csr_matrix(
            (np.ones(len(rows), np.float32), rows.astype(np.int64), pointers), shape=(len(groups), self.counts.shape[0])
        )
        lengths = np.asarray([self.lengths[g].sum() for g in groups], dtype=np.float32)
        return TermCounts(self.vocabulary, (summing @ self.counts).tocsr(), lengths)

    @property
    def rows(self) -> int:
        return int(self.counts.shape[0])

    @functools.cached_property
    def document_frequency(self) -> np.ndarray:
        """Texts holding each vocabulary column."""
        return np.bincount(self.counts.indices, minlength=len(self.vocabulary)).astype(np.int64)


class _Run:
    """Consecutive parts merged into one vocabulary and one column-major (CSC) count matrix. Immutable."""

    def __init__(self, parts: Sequence[TermCounts], merged: Sequence[TermCounts] = ()):
        """`merged`: the same texts as `parts`, already merged in fewer pieces (runs being merged): their
        vocabularies are joined instead of every part's."""
        self.parts = tuple(parts)
        self.starts = np.cumsum([0] + [part.rows for part in self.parts])
        vocabulary: dict[str, int] = {}
        blocks = []
        for source in merged or self.parts:
            columns = np.fromiter((vocabulary.setdefault(term, len(vocabulary)) for term in source.vocabulary), np.int64,
                                  len(source.vocabulary))
            blocks.append((source.counts.data, columns[source.counts.indices], source.counts.indptr, source.rows))
        width = max(1, len(vocabulary))
        matrices = [sparse.csr_matrix((data, columns, pointers), shape=(rows, width)) for data, columns, pointers, rows in blocks]
        rows = int(self.starts[-1])
        counts = sparse.vstack(matrices, format="csr", dtype=np.float32) if matrices else sparse.csr_matrix((rows, width), dtype=np.float32)
        self.counts = counts.tocsc()
        self.counts.sort_indices()
        self.vocabulary = vocabulary
        self.lengths = np.concatenate([part.lengths for part in self.parts]).astype(np.float32) if self.parts else np.zeros(0, np.float32)
        self.document_frequency = np.diff(self.counts.indptr).astype(np.int64)
        if self.counts.shape[0] != rows:
            raise ValueError(f"a run of {rows} texts merged {self.counts.shape[0]} rows")

    def as_term_counts(self) -> TermCounts:
        """The run's texts as one TermCounts (what a merge of it with another run reads)."""
        return TermCounts(self.vocabulary, self.counts.tocsr(), self.lengths)

    @property
    def rows(self) -> int:
        return int(self.starts[-1])


@dataclass(frozen=True)
class _LiveRun:
    """A run as one index sees it: the run and which of its parts are gone (tombstones)."""

    run: _Run
    dead: frozenset[int] = frozenset()  # numbers of the parts deleted since the run was built

    @functools.cached_property
    def live_parts(self) -> tuple[TermCounts, ...]:
        return tuple(part for number, part in enumerate(self.run.parts) if number not in self.dead)

    @functools.cached_property
    def mask(self) -> Optional[np.ndarray]:
        """The run's rows still live (None: all of them)."""
        if not self.dead:
            return None
        mask = np.ones(self.run.rows, dtype=bool)
        for number in self.dead:
            mask[self.run.starts[number] : self.run.starts[number + 1]] = False
        return mask

    @functools.cached_property
    def rows(self) -> int:
        return sum(part.rows for part in self.live_parts)

    @functools.cached_property
    def total_length(self) -> float:
        return float(sum(float(part.lengths.sum(dtype=np.float64)) for part in self.live_parts))

    def document_frequency(self, term: str) -> int:
        column = self.run.vocabulary.get(term)
        if column is None:
            return 0
        frequency = int(self.run.document_frequency[column])
        for number in self.dead:
            part = self.run.parts[number]
            own = part.vocabulary.get(term)
            if own is not None:
                frequency -= int(part.document_frequency[own])
        return frequency

    def scores(self, terms: Sequence[str], idf: np.ndarray, k1: float, norms: np.ndarray) -> np.ndarray:
        """BM25 of the run's live rows for the terms (with their collection-wide IDFs); `norms`: each row's
        k1 * (1 - b + b * length / average length)."""
        known = [(self.run.vocabulary[t], weight) for t, weight in zip(terms, idf) if t in self.run.vocabulary]
        if not known:
            return np.zeros(self.rows, dtype=np.float32)
        columns = np.asarray([column for column, _ in known], dtype=np.int64)
        counts = self.run.counts
        entries = row_entries(counts.indptr, columns)
        rows = counts.indices[entries]
        frequency = counts.data[entries]
        weights = frequency * np.float32(k1 + 1) / (frequency + norms[rows])
        out = gathered_columns_product(counts.indptr, columns, rows, weights,
                                       np.asarray([weight for _, weight in known], dtype=np.float32), self.run.rows)
        return out if self.mask is None else out[self.mask]

    def norms(self, k1: float, b: float, average: float) -> np.ndarray:
        return (k1 * (1 - b + b * self.run.lengths / max(average, 1e-9))).astype(np.float32)


class BM25Index:
    """Okapi BM25 over a list of texts, as runs of merged per-document token counts (see the module docstring)."""

    def __init__(self, texts: Sequence[str], k1: float = 1.2, b: float = 0.75):
        self.k1, self.b = k1, b
        self._runs: tuple[_LiveRun, ...] = (_LiveRun(_Run([TermCounts.of(texts)])),) if texts else ()
        self._summarise()

    @classmethod
    def of_parts(
        cls, parts: Sequence[TermCounts], k1: float = 1.2, b: float = 0.75, base: Optional["BM25Index"] = None,
    ) -> "BM25Index":
        """The index of the parts' texts in order, equal to one built from all the texts, with no text tokenised
        again. With `base` (the previous snapshot's index): its runs are kept, the parts it holds that are gone
        become tombstones and the parts after them form a new run, when `parts` is base's live parts in order
        minus some, then new ones (what adds, replacements and deletes make); else the parts are merged anew."""
        index = cls.__new__(cls)
        index.k1, index.b = k1, b
        runs = _carried(base, parts) if base is not None and (base.k1, base.b) == (k1, b) else None
        if runs is None:
            runs = [_LiveRun(_Run(parts))] if parts else []
        index._runs = tuple(_compacted(runs))
        index._summarise()
        return index

    def _summarise(self) -> None:
        self.size = sum(run.rows for run in self._runs)
        total = sum(run.total_length for run in self._runs)
        self.average_length = total / self.size if self.size else 1.0
        # each run's row norms at this index's average length (a run is shared by indexes of other averages):
        # made with the index, so that its first query does not (2-3 ms at 100,000 texts)
        self._norms = [run.norms(self.k1, self.b, self.average_length) for run in self._runs]

    @property
    def run_sizes(self) -> list[int]:
        """Live texts per run (how far merging has gone; for tests and reports)."""
        return [run.rows for run in self._runs]

    def document_frequency(self, term: str) -> int:
        """How many texts hold the (lower-cased) term."""
        return sum(run.document_frequency(term) for run in self._runs)

    def idf(self, term: str) -> float:
        return self._idf(self.document_frequency(term))

    def _idf(self, frequency: int) -> float:
        return math.log1p((self.size - frequency + 0.5) / (frequency + 0.5))

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        """(row, score) of the k best texts for the query, best first; texts sharing no term are left out."""
        return self.best(self.scores(query), k)

    def scores(self, query: str) -> np.ndarray:
        """The BM25 score of every text for the query (0 where it shares no term with it).

        The query's stop words are dropped ("how", "was", "which"): rare in documents, so of high IDF, they
        would otherwise rank texts for matching the question's grammar instead of its content."""
        return self._scores(*self._weighted_terms(query)[:2])

    def fractions(self, query: str) -> np.ndarray:
        """scores(query) / query_weight(query) (0 for a query of no weight), its words looked up once: how much
        of the query each text matches (above 1 for a text repeating its words)."""
        terms, idf, weight = self._weighted_terms(query)
        if weight <= 0:
            return np.zeros(self.size, dtype=np.float32)
        return self._scores(terms, idf) / weight

    def _weighted_terms(self, query: str) -> tuple[list[str], list[float], float]:
        """The query's terms some text holds, their IDFs, and the query's weight (query_weight)."""
        terms = self.query_terms(query)
        frequencies = [self.document_frequency(t) for t in terms]
        weight = sum(self._idf(f) for f in frequencies)
        held = [(t, self._idf(f)) for t, f in zip(terms, frequencies) if f]
        return [t for t, _ in held], [idf for _, idf in held], weight

    def _scores(self, terms: list[str], idf: list[float]) -> np.ndarray:
        if not terms or not self._runs:
            return np.zeros(self.size, dtype=np.float32)
        weights = np.asarray(idf, dtype=np.float32)
        parts = [run.scores(terms, weights, self.k1, norms) for run, norms in zip(self._runs, self._norms)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    @staticmethod
    def best(scores: np.ndarray, k: int) -> list[tuple[int, float]]:
        """(row, score) of the k highest positive scores, best first (ties: lower row first)."""
        if k <= 0:
            return []
        candidates = np.flatnonzero(scores > 0)
        if len(candidates) > k:
            candidates = candidates[np.argpartition(-scores[candidates], k - 1)[:k]]
        order = candidates[np.lexsort((candidates, -scores[candidates]))]
        return [(int(row), float(scores[row])) for row in order]

    def query_weight(self, query: str) -> float:
        """The score of a text holding each content word of the query once, at the average length: the sum of
        their IDFs (a word no text holds has the highest IDF there is). Dividing a score by it says how much
        of the query a text matches, whatever the query."""
        return self._weighted_terms(query)[2]

    @staticmethod
    def query_terms(query: str) -> list[str]:
        """The query's content words, once each, in a fixed order (stop words left out)."""
        return sorted({t for t in lexical_terms(query) if t not in STOP_WORDS})


def _carried(base: BM25Index, parts: Sequence[TermCounts]) -> Optional[list[_LiveRun]]:
    """base's runs with the parts no longer in `parts` tombstoned and the new parts as a last run; None when
    `parts` is not base's live parts in order (minus some) followed by new ones."""
    wanted = {id(part) for part in parts}
    runs: list[_LiveRun] = []
    position = 0
    for live in base._runs:
        dead = set(live.dead)
        for number, part in enumerate(live.run.parts):
            if number in dead:
                continue
            if id(part) not in wanted:
                dead.add(number)
            elif position < len(parts) and parts[position] is part:
                position += 1
            else:
                return None  # reordered
        if len(dead) < len(live.run.parts):
            runs.append(live if len(dead) == len(live.dead) else _LiveRun(live.run, frozenset(dead)))
    held = {id(part) for live in base._runs for part in live.run.parts}
    if any(id(part) in held for part in parts[position:]):
        return None  # a part base held comes back out of order
    if position < len(parts):
        runs.append(_LiveRun(_Run(parts[position:])))
    return runs


def _compacted(runs: list[_LiveRun]) -> list[_LiveRun]:
    """Runs mostly tombstones rebuilt from their live parts; then the last two merged while the older is at most
    MERGE_RATIO times the newer."""
    runs = [
        _LiveRun(_Run(live.live_parts)) if live.dead and live.rows < (1 - MAX_DEAD_FRACTION) * live.run.rows else live
        for live in runs
    ]
    while len(runs) >= 2 and runs[-2].rows <= MERGE_RATIO * runs[-1].rows:
        newer, older = runs.pop(), runs.pop()
        merged = () if older.dead or newer.dead else (older.run.as_term_counts(), newer.run.as_term_counts())
        runs.append(_LiveRun(_Run(older.live_parts + newer.live_parts, merged)))
    return runs
