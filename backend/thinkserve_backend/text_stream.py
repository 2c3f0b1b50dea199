"""Token ids in, safe text deltas out: incremental detokenisation with stop strings.

A token may end in the middle of a UTF-8 character or of a word that only decodes correctly with its
neighbours, and a stop string may arrive split over several tokens. Text is therefore released only when it
can no longer change and can no longer turn out to be the start of a stop string.
"""

from __future__ import annotations

from typing import Callable, Sequence

Decode = Callable[[Sequence[int]], str]


class TextStream:
    def __init__(self, decode: Decode, stop: Sequence[str] = ()):
        self._decode = decode
        self._stop = tuple(s for s in stop if s)
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._pending = ""  # decoded text held back because it may begin a stop string
        self.stopped = False  # a stop string was found; nothing more will be released

    def push(self, token_id: int) -> str:
        """Add one generated token; return the text that became final (may be empty)."""
        if self.stopped:
            return ""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        if len(full_text) <= len(prefix_text) or full_text.endswith("\ufffd"):
            return ""  # incomplete character or a token that only shows with the next one
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return self._release(full_text[len(prefix_text) :])

    def finish(self) -> str:
        """Generation ended (eos, length, cancel): release everything still held."""
        if self.stopped:
            return ""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        tail = self._decode(self._ids[self._prefix_offset :])[len(prefix_text) :]
        text = self._pending + tail.replace("\ufffd", "")
        self._pending = ""
        for stop in self._stop:
            index = text.find(stop)
            if index >= 0:
                text, self.stopped = text[:index], True
        return text

    def _release(self, delta: str) -> str:
        text = self._pending + delta
        hits = [i for i in (text.find(stop) for stop in self._stop) if i >= 0]
        if hits:
            self.stopped = True
            self._pending = ""
            return text[: min(hits)]
        hold = _longest_stop_prefix_suffix(text, self._stop)
        self._pending = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold]


def _longest_stop_prefix_suffix(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        for length in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:length]):
                best = length
                break
    return best
