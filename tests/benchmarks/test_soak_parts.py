"""The soak's judgement: growth is a fitted slope per hour after the warm-up (a leak shows through noise, a
settling step does not), process figures come from /proc, and the report's verdicts follow from the samples."""

import os
import random
import tempfile

from thinkserve_bench import process_sampler
from thinkserve_bench.growth import slope_per_hour, verdict
from thinkserve_bench.modes.soak import GATED, growth_series, lag_by_hour, per_minute


def test_a_steady_leak_shows_through_noise_and_the_warm_up_is_left_out():
    rng = random.Random(1)
    times = [10.0 * i for i in range(720)]  # two hours, a sample every 10 s
    leak = [100_000 + 0.5 * t + rng.gauss(0, 2_000) for t in times]  # +1.8 MB/h on 100 MB: +1.8%/h
    fit = slope_per_hour(times, leak)
    assert abs(fit["slope_per_h"] - 1800) < 300 and abs(fit["pct_per_h"] - 1.8) < 0.3
    assert verdict(times, leak, 600, 1.0)["flat"] is False
    assert verdict(times, leak, 600, 5.0)["flat"] is True
    settling = [150_000 if t < 600 else 200_000 + rng.gauss(0, 2_000) for t in times]  # one step, in the warm-up
    assert verdict(times, settling, 600, 5.0)["flat"] is True
    assert verdict(times, settling, 0, 5.0)["flat"] is False  # the same step counted: it looks like growth
    assert verdict(times[:2], leak[:2], 0, 5.0)["flat"] is None  # too few samples: no verdict


def test_process_samples_count_this_process_descriptors_and_threads():
    before = process_sampler.sample(os.getpid())
    with tempfile.TemporaryFile() as _:
        during = process_sampler.sample(os.getpid())
    assert during.fds == before.fds + 1
    assert before.threads >= 1 and before.rss_kib > 1000
    assert process_sampler.sample(2**22 + 12345) is None  # gone
    assert os.getpid() in process_sampler.children(os.getppid())


def _sample(t, writer_rss, fds):
    return {"t": t, "writer": {"pid": 1, "name": "python", "rss_kib": writer_rss, "fds": fds, "threads": 20},
            "replica": {"pid": 2, "name": "python", "rss_kib": 90_000, "fds": 40, "threads": 20},
            "triton": None, "stubs": {"llm:7": {"pid": 7, "name": "stub", "rss_kib": 5_000, "fds": 9, "threads": 4}},
            "shm_bytes": 0, "data_bytes": 1000}


def test_the_gated_series_and_per_minute_figures_come_from_the_samples():
    samples = [_sample(10.0 * i, 100_000 + 10 * i, 30 + i // 100) for i in range(400)]
    series = growth_series(samples)
    assert set(GATED) <= set(series) and "stub_llm_rss_kib" in series and "triton_rss_kib" not in series
    fds = verdict(*series["writer_fds"], 600, 5.0)
    assert fds["flat"] is False and fds["pct_per_h"] > 5  # 30 -> 33 descriptors over the run: a leak
    queries = [{"t": 5.0, "ms": 100.0, "status": "ok", "code": "OK"}, {"t": 50.0, "ms": 300.0, "status": "ok", "code": "OK"},
               {"t": 61.0, "ms": None, "status": "rejected", "code": "RESOURCE_EXHAUSTED"}]
    operations = [{"t": 20.0, "kind": "add", "lag_s": 0.5}, {"t": 3700.0, "kind": "delete", "lag_s": 1.5}]
    minutes = per_minute(queries, operations, 125.0)
    assert [m["questions"] for m in minutes] == [2, 1, 0]
    assert minutes[0]["p50_ms"] == 200.0 and minutes[0]["max_lag_s"] == 0.5 and minutes[1]["codes"] == {"RESOURCE_EXHAUSTED": 1}
    assert [h["hour"] for h in lag_by_hour(operations)] == [0, 1]



def test_a_stopped_soak_stops_its_servers_on_sigterm_and_sigint(tmp_path):
    """SIGTERM (by default the end of the process, the writer, replica and Triton left running) and SIGINT stop the
    servers and end the run, even while a task of the load outlives its cancellation."""
    import signal
    import subprocess
    import sys
    import time

    child = (
        "import asyncio, pathlib, sys\n"
        "from thinkserve_bench.soak_command import stop_on_signals\n"
        "marker = pathlib.Path(sys.argv[1])\n"
        "stop_on_signals(lambda: marker.write_text('servers stopped'))\n"
        "async def load():\n"
        "    marker.with_suffix('.running').write_text('')\n"
        "    while True:\n"
        "        try:\n"
        "            await asyncio.sleep(3600)\n"
        "        except asyncio.CancelledError:\n"
        "            pass\n"
        "asyncio.run(load())\n"
    )
    for signum in (signal.SIGTERM, signal.SIGINT):
        marker = tmp_path / f"{signum.name}.done"
        process = subprocess.Popen([sys.executable, "-c", child, str(marker)], stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while not marker.with_suffix(".running").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        process.send_signal(signum)
        assert process.wait(30) == 128 + signum
        assert marker.read_text() == "servers stopped", signum.name
        assert f"stopped by {signum.name}".encode() in process.stderr.read()
