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

    def merge(self, stages_ms: dict[str, float]) -> None:
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
