"""The served networks' stage-timing diagnostic (thinkserve_backend.stage_times): what torch_runner logs with the
`stage_timing` parameter on, and what the GPU runner reads back from Triton's log. Served through the real
tritonserver: tests/integration/test_gpu_runner_cpu.py (the CPU dry run's encoder rows carry the stages)."""

from __future__ import annotations

import pytest

from thinkserve_backend.stage_times import STAGES, StageTimes, parse


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_means_per_batch_size_are_logged_once_the_interval_passed_and_read_back():
    clock = Clock()
    times = StageTimes("page_image_clip_encode", interval_s=2.0, clock=clock)
    times.add(32, [0.0, 0.001, 0.003, 0.010, 0.030])  # inputs 1 ms, to device 2, forward 7, outputs 20
    times.add(32, [0.0, 0.003, 0.005, 0.012, 0.022])  # 3, 2, 7, 10
    times.add(45, [0.0, 0.001, 0.002, 0.003, 0.004])
    assert times.due() == []  # not yet
    clock.now += 2.5
    lines = times.due()
    assert lines == [
        "stage times page_image_clip_encode rows=32 executions=2 inputs_ms=2.000 to_device_ms=2.000 forward_ms=7.000 outputs_ms=15.000",
        "stage times page_image_clip_encode rows=45 executions=1 inputs_ms=1.000 to_device_ms=1.000 forward_ms=1.000 outputs_ms=1.000",
    ]
    assert times.due() == []  # the sums started again
    log = "\n".join(f'I1129 22:45:47.3 828 torch_runner.py:66] "{line}"' for line in lines)
    log += '\nI1129 "stage times page_image_siglip_encode rows=32 executions=4 inputs_ms=9.000 to_device_ms=9.000 forward_ms=9.000 outputs_ms=9.000"'
    log += '\nI1129 "stage times page_image_clip_encode rows=32 executions=2 inputs_ms=4.000 to_device_ms=2.000 forward_ms=3.000 outputs_ms=5.000"'
    merged = parse(log, "page_image_clip_encode")
    assert set(merged) == {32, 45}
    assert merged[32]["executions"] == 4
    assert merged[32]["inputs_ms"] == pytest.approx(3.0) and merged[32]["forward_ms"] == pytest.approx(5.0)
    assert merged[32]["outputs_ms"] == pytest.approx(10.0)
    assert set(merged[45]) == {"executions", *(f"{stage}_ms" for stage in STAGES)}


def test_an_interval_of_zero_logs_every_execute():
    times = StageTimes("reranker_score", interval_s=0.0, clock=Clock())
    assert times.due() == []  # nothing ran
    times.add(8, [0.0, 0.0, 0.0, 0.002, 0.002])
    assert times.due() == ["stage times reranker_score rows=8 executions=1 inputs_ms=0.000 to_device_ms=0.000 forward_ms=2.000 outputs_ms=0.000"]
