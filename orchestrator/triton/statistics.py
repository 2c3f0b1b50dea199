"""Reading Triton's per-model statistics (one `ModelStatistics` message, as the client's dict) in our units.

Triton keeps two kinds of compute counters, and they differ once the dynamic batcher merges requests:
`inference_stats` are added once per *request*, each with the whole execution's duration, so an execution that
served k requests is counted k times there; `batch_stats` are added once per *execution* (per batch size). The
time a model kept its instance busy is therefore the sum over `batch_stats`; the per-request figures are what
one request waited for and was computed over. Models that report no batch statistics (ensembles) fall back to
the per-request sums.
"""

from __future__ import annotations

COMPUTE_PHASES = ("compute_input", "compute_infer", "compute_output")


def duration_ns(stats: dict, name: str) -> int:
    """The cumulative nanoseconds of one StatisticDuration field (Triton's JSON gives them as strings)."""
    return int(stats.get(name, {}).get("ns", 0))


def request_compute_ns(entry: dict) -> int:
    """Input + infer + output time summed over requests: a batched execution counts once per request in it."""
    inference = entry.get("inference_stats", {})
    return sum(duration_ns(inference, phase) for phase in COMPUTE_PHASES)


def execution_compute_ns(entry: dict) -> int:
    """Input + infer + output time summed over executions: the model's busy time, each batch counted once."""
    batches = entry.get("batch_stats", [])
    if not batches:
        return request_compute_ns(entry)
    return sum(duration_ns(batch, phase) for batch in batches for phase in COMPUTE_PHASES)


def queue_ns(entry: dict) -> int:
    """Time requests waited in the scheduler's queue, summed over requests."""
    return duration_ns(entry.get("inference_stats", {}), "queue")


def batch_executions(entry: dict) -> dict[int, int]:
    """Executions per batch size."""
    out: dict[int, int] = {}
    for batch in entry.get("batch_stats", []):
        size = int(batch.get("batch_size", 0))
        out[size] = out.get(size, 0) + int(batch.get("compute_infer", {}).get("count", 0))
    return out
