"""Where a served network's time goes inside Triton's `execute`: a diagnostic the `stage_timing` parameter turns on.

On an H200 (benchmarks/results/gpu/h200-2026-11-29) the page-image towers spent 20-22 ms a batch-32 request in
Triton's compute-infer against a 5-9 ms call of the same module in process, and nothing said which part of the
python backend's `execute` took it. With `stage_timing`, torch_runner times its stages (inputs out of the request,
onto the device, the forward pass to completion, the responses made) and logs their means every `interval_s`, per
batch size. The GPU runner turns it on for the encoders it measures and reads the lines back from Triton's log
(thinkserve_bench.gpu.encoder_measurements). Off, nothing is timed.

A line: `stage times NAME rows=R executions=N inputs_ms=.. to_device_ms=.. forward_ms=.. outputs_ms=..`.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

STAGES = ("inputs", "to_device", "forward", "outputs")
LINE = re.compile(r"stage times (?P<model>\S+) rows=(?P<rows>\d+) executions=(?P<executions>\d+)(?P<stages>(?: \w+_ms=[\d.]+)+)")


@dataclass
class _Sums:
    executions: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))


class StageTimes:
    """Per batch size (rows in one execute), the stages' summed seconds since the last report."""

    def __init__(self, model_name: str, interval_s: float = 2.0, clock=time.monotonic):
        self.model_name, self.interval_s, self.clock = model_name, interval_s, clock
        self._sums: dict[int, _Sums] = {}
        self._reported = clock()

    def add(self, rows: int, marks: list[float]) -> None:
        """One execute: `marks` are the clock readings at its start and at the end of each stage (len(STAGES) + 1)."""
        sums = self._sums.setdefault(rows, _Sums())
        sums.executions += 1
        for stage, began, ended in zip(STAGES, marks, marks[1:]):
            sums.seconds[stage] += ended - began

    def due(self) -> list[str]:
        """The lines to log once `interval_s` has passed since the last report (then the sums start again)."""
        if self.clock() - self._reported < self.interval_s or not self._sums:
            return []
        lines = [
            f"stage times {self.model_name} rows={rows} executions={sums.executions} "
            + " ".join(f"{stage}_ms={1000 * sums.seconds[stage] / sums.executions:.3f}" for stage in STAGES)
            for rows, sums in sorted(self._sums.items())
        ]
        self._sums.clear()
        self._reported = self.clock()
        return lines


def parse(text: str, model_name: str) -> dict[int, dict[str, float]]:
    """Lines of `model_name` in a log's text, merged per batch size: executions and each stage's mean ms."""
    merged: dict[int, dict[str, float]] = {}
    for match in LINE.finditer(text):
        if match["model"] != model_name:
            continue
        rows, executions = int(match["rows"]), int(match["executions"])
        row = merged.setdefault(rows, {"executions": 0, **{f"{s}_ms": 0.0 for s in STAGES}})
        total = row["executions"] + executions
        for key, value in re.findall(r"(\w+_ms)=([\d.]+)", match["stages"]):
            row[key] = (row[key] * row["executions"] + float(value) * executions) / total
        row["executions"] = total
    return merged
