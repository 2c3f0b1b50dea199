"""Per-stage wall-clock timings of one request (monotonic clock), reported with its answer and, when tracing is
on, emitted as one OpenTelemetry span per stage under the request's span as each stage ends."""

from __future__ import annotations

import contextlib
import time
from typing import Optional

from opentelemetry import trace
from opentelemetry.context import Context

_NO_TRACING = trace.NoOpTracer()


class StageTimer:
    def __init__(self, tracer: trace.Tracer = _NO_TRACING, parent: Optional[Context] = None):
        self.started = time.monotonic()
        self.stages: dict[str, float] = {}
        # When each stage ran (monotonic start, end), to tell its own work from its model calls; stages merged
        # from elsewhere (retrieval's, timed in a worker thread that calls no model) only have their duration.
        self.intervals: dict[str, list[tuple[float, float]]] = {}
        self.merged: dict[str, float] = {}
        self.merged_starts: dict[str, float] = {}  # when a merged stage first began (monotonic), if known
        self.tracer = tracer
        self.parent = parent  # the request's span

    @contextlib.contextmanager
    def stage(self, name: str):
        began = time.monotonic()
        try:
            yield
        finally:
            self.record(name, time.monotonic() - began)

    def record(self, name: str, seconds: float) -> None:
        """A stage that ended now and took `seconds`."""
        self.stages[name] = self.stages.get(name, 0.0) + seconds * 1000.0
        end = time.monotonic()
        self.intervals.setdefault(name, []).append((end - seconds, end))
        self._span(name, seconds)

    def merge(self, stages_ms: dict[str, float], starts: Optional[dict[str, float]] = None) -> None:
        """Stages timed elsewhere (`starts`: when they began, on the same monotonic clock)."""
        for name, start in (starts or {}).items():
            self.merged_starts[name] = min(start, self.merged_starts.get(name, start))
        for name, ms in stages_ms.items():
            self.stages[name] = self.stages.get(name, 0.0) + ms
            self.merged[name] = self.merged.get(name, 0.0) + ms
            self._span(name, ms / 1000.0)

    def _span(self, name: str, seconds: float) -> None:
        if isinstance(self.tracer, trace.NoOpTracer):
            return
        end = time.time_ns()
        span = self.tracer.start_span(f"stage.{name}", context=self.parent, start_time=end - int(seconds * 1e9))
        span.set_attribute("thinkserve.stage", name)
        span.set_attribute("thinkserve.milliseconds", seconds * 1000.0)
        span.end(end_time=end)

    def since_start_ms(self) -> float:
        return (time.monotonic() - self.started) * 1000.0

    def report(self) -> dict[str, float]:
        return {**self.stages, "total": self.since_start_ms()}

    def since_start(self, name: str) -> None:
        """A moment (the first answer text): a stage from the request's start to now, recorded once."""
        if name not in self.stages:
            self.stages[name] = self.since_start_ms()
            self.intervals[name] = [(self.started, time.monotonic())]

    def starts_ms(self) -> dict[str, float]:
        """When each stage first began, from the request's start ("total": 0); a merged stage whose start was
        not given has none."""
        starts = dict(self.merged_starts)
        for name, spans in self.intervals.items():
            starts[name] = min(min(start for start, _ in spans), starts.get(name, float("inf")))
        return {"total": 0.0} | {name: (start - self.started) * 1000.0 for name, start in starts.items()}
