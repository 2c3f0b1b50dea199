"""Per-stage wall-clock timings of one request (monotonic clock), reported with its answer."""

from __future__ import annotations

import contextlib
import time


class StageTimer:
    def __init__(self):
        self.started = time.monotonic()
        self.stages: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str):
        began = time.monotonic()
        try:
            yield
        finally:
            self.record(name, time.monotonic() - began)

    def record(self, name: str, seconds: float) -> None:
        self.stages[name] = self.stages.get(name, 0.0) + seconds * 1000.0

    def merge(self, stages_ms: dict[str, float]) -> None:
        for name, ms in stages_ms.items():
            self.stages[name] = self.stages.get(name, 0.0) + ms

    def since_start_ms(self) -> float:
        return (time.monotonic() - self.started) * 1000.0

    def report(self) -> dict[str, float]:
        return {**self.stages, "total": self.since_start_ms()}
