"""What the server and the GPU did during each unit of measurement, recorded beside the unit's figures: Triton's
per-model statistics over the unit (requests, queue time, compute input / infer / output, busy time, batch sizes),
the difference of two snapshots of its statistics endpoint, and the GPU's utilisation and memory, sampled by
nvidia-smi in the background. The first H200 run recorded neither, so where its time went was inferred.

Decoupled (streaming) python models, the generators, return from execute() once their generation thread starts:
Triton's compute time misses their generation (thinkserve_bench.triton_stats), their queue time does not."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.request
from typing import Callable, Optional

from orchestrator.triton import statistics

COUNTERS = ("requests", "executions", "inferences", "queue_ns", "compute_input_ns", "compute_infer_ns",
            "compute_output_ns", "busy_ns")


def model_counters(entry: dict) -> dict[str, int]:
    """One model's cumulative counters from Triton's statistics (HTTP JSON or the gRPC client's dict): per request
    (queue and each compute phase, as `inference_stats` adds them) and the busy time over executions."""
    inference = entry.get("inference_stats", {})
    return {
        "requests": int(inference.get("success", {}).get("count", 0)),
        "executions": int(entry.get("execution_count", 0)),
        "inferences": int(entry.get("inference_count", 0)),
        "queue_ns": statistics.queue_ns(entry),
        **{f"{phase}_ns": statistics.duration_ns(inference, phase) for phase in statistics.COMPUTE_PHASES},
        "busy_ns": statistics.execution_compute_ns(entry),
    }


def counters_by_model(response: dict) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for entry in response.get("model_stats", []):
        counters = model_counters(entry)
        previous = out.get(entry["name"])
        out[entry["name"]] = {k: counters[k] + previous[k] for k in COUNTERS} if previous else counters
    return out


def difference(now: dict[str, dict[str, int]], before: dict[str, dict[str, int]]) -> dict[str, dict]:
    """Each model's work between two snapshots, in ms and per request; models that did nothing are left out."""
    out = {}
    for name, counters in sorted(now.items()):
        delta = {k: counters[k] - before.get(name, {}).get(k, 0) for k in COUNTERS}
        if not (delta["requests"] or delta["executions"]):
            continue
        requests = max(1, delta["requests"])
        out[name] = {
            "requests": delta["requests"], "executions": delta["executions"],
            "mean_batch": delta["inferences"] / delta["executions"] if delta["executions"] else None,
            "busy_ms": delta["busy_ns"] / 1e6,
            **{f"{phase}_ms_per_request": delta[f"{phase}_ns"] / 1e6 / requests
               for phase in ("queue", "compute_input", "compute_infer", "compute_output")},
        }
    return out


class ServerStatistics:
    """Triton's statistics endpoint (HTTP, synchronous: the runner's record callbacks are plain functions)."""

    def __init__(self, http_url: str, timeout_s: float = 10.0):
        self.url = http_url.rstrip("/") + "/v2/models/stats"
        self.timeout_s = timeout_s

    def snapshot(self) -> dict[str, dict[str, int]]:
        with urllib.request.urlopen(self.url, timeout=self.timeout_s) as response:
            return counters_by_model(json.loads(response.read()))


class GpuSampler:
    """nvidia-smi's utilisation and memory of one GPU every `interval_ms`, read line by line in a thread and kept
    with their monotonic time. Without nvidia-smi (the CPU dry run) it records why there is nothing."""

    def __init__(self, interval_ms: int = 200, command: Optional[str] = None, gpu: int = 0):
        self.interval_ms = interval_ms
        self.command = command or shutil.which("nvidia-smi")
        self.gpu = gpu
        self.samples: list[tuple[float, float, float]] = []  # (monotonic s, utilisation %, memory used MiB)
        self.reason = "" if self.command else "no nvidia-smi on this machine"
        self._process: Optional[subprocess.Popen] = None
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "GpuSampler":
        if not self.command:
            return self
        try:
            self._process = subprocess.Popen(
                [self.command, "-i", str(self.gpu), "--query-gpu=utilization.gpu,memory.used",
                 "--format=csv,noheader,nounits", f"--loop-ms={self.interval_ms}"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError as error:
            self.reason = f"nvidia-smi did not start: {error}"
            return self
        self._thread = threading.Thread(target=self._read, name="gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        for line in self._process.stdout:
            fields = [field.strip() for field in line.split(",")]
            try:
                self.samples.append((time.monotonic(), float(fields[0]), float(fields[1])))
            except (ValueError, IndexError):  # [N/A], a header, a warning
                continue

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def window(self, began: float, ended: float) -> dict:
        """The samples taken between two monotonic times: utilisation mean and max, memory max."""
        inside = [(u, m) for t, u, m in self.samples if began <= t <= ended]
        if not inside:
            return {"available": False, "samples": 0,
                    "reason": self.reason or ("the sampler exited" if self._process and self._process.poll() is not None
                                              else "no sample in the window")}
        utilisation = [u for u, _ in inside]
        return {"available": True, "samples": len(inside), "utilization_mean_pct": sum(utilisation) / len(utilisation),
                "utilization_max_pct": max(utilisation), "memory_used_max_mib": max(m for _, m in inside)}


class UnitObserver:
    """Marks the start of a unit of measurement and, at its end, what the server and the GPU did during it."""

    def __init__(self, server: Optional[ServerStatistics], gpu: GpuSampler, clock: Callable[[], float] = time.monotonic):
        self.server, self.gpu, self.clock = server, gpu, clock
        self._began = clock()
        self._before: dict = {}
        self._error = ""

    def begin(self) -> None:
        self._began = self.clock()
        self._before, self._error = self._snapshot()

    def end(self) -> dict:
        """The unit since begin() (or the previous end()), and a new unit begun."""
        ended = self.clock()
        now, error = self._snapshot()
        observed = {"window_s": ended - self._began, "gpu": self.gpu.window(self._began, ended)}
        if error or self._error:
            observed["triton"] = {"error": error or self._error}
        else:
            observed["triton"] = difference(now, self._before)
        self._began, self._before, self._error = ended, now, error
        return observed

    def _snapshot(self) -> tuple[dict, str]:
        if self.server is None:
            return {}, "no statistics endpoint"
        try:
            return self.server.snapshot(), ""
        except OSError as error:  # the server is gone or stuck: the unit's figures stand without it
            return {}, f"{type(error).__name__}: {error}"
