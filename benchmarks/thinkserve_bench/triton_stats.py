"""Triton's server-side statistics, snapshotted before and after a measured window and subtracted.

Triton keeps cumulative counters per model (`ModelStatistics`): requests, executions, queue time, compute time
(input + infer + output) and executions per batch size. Two snapshots give what one window (a query, a load
level) cost on the server. Compute time is kept two ways (orchestrator/triton/statistics.py): per execution
(the model's busy time, what model-seconds and cost are made of) and per request (what one request was
computed over; a batch of k requests counts k times), which differ once the dynamic batcher merges requests.
Ensembles are excluded from sums: their counters repeat their steps'. Each leaf model is attributed to the
public model (the orchestrator's contract name) whose ensemble runs it.

Decoupled (streaming) python models return from execute() once their generation thread starts, so Triton's
compute time misses the generation: for them the orchestrator's measured stream time must be used instead
(see query_costs.py); `Topology.decoupled` says which models these are.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from orchestrator.triton import statistics


@dataclass(frozen=True)
class ModelCounters:
    requests: int = 0  # successful inference requests
    executions: int = 0  # model executions (a batch is one execution)
    inferences: int = 0  # items executed (sum of batch sizes)
    queue_ns: int = 0  # summed over requests
    compute_ns: int = 0  # compute_input + compute_infer + compute_output, summed over executions: busy time
    request_compute_ns: int = 0  # the same summed over requests: a batched execution once per request in it
    batches: dict[int, int] = field(default_factory=dict)  # batch size -> executions

    def minus(self, earlier: "ModelCounters") -> "ModelCounters":
        sizes = {size: count - earlier.batches.get(size, 0) for size, count in self.batches.items()}
        return ModelCounters(
            self.requests - earlier.requests,
            self.executions - earlier.executions,
            self.inferences - earlier.inferences,
            self.queue_ns - earlier.queue_ns,
            self.compute_ns - earlier.compute_ns,
            self.request_compute_ns - earlier.request_compute_ns,
            {size: count for size, count in sorted(sizes.items()) if count > 0},
        )

    def plus(self, other: "ModelCounters") -> "ModelCounters":
        sizes = dict(self.batches)
        for size, count in other.batches.items():
            sizes[size] = sizes.get(size, 0) + count
        return ModelCounters(
            self.requests + other.requests,
            self.executions + other.executions,
            self.inferences + other.inferences,
            self.queue_ns + other.queue_ns,
            self.compute_ns + other.compute_ns,
            self.request_compute_ns + other.request_compute_ns,
            dict(sorted(sizes.items())),
        )

    @property
    def compute_ms(self) -> float:
        return self.compute_ns / 1e6

    @property
    def queue_ms(self) -> float:
        return self.queue_ns / 1e6

    @property
    def mean_batch(self) -> Optional[float]:
        return self.inferences / self.executions if self.executions else None

    def as_dict(self) -> dict:
        return {
            "requests": self.requests, "executions": self.executions, "inferences": self.inferences,
            "queue_ms": self.queue_ms, "compute_ms": self.compute_ms, "request_compute_ms": self.request_compute_ns / 1e6,
            "mean_batch": self.mean_batch,
            "batches": {str(size): count for size, count in self.batches.items()},
        }


def parse_statistics(response: dict) -> dict[str, ModelCounters]:
    """Counters per model name (versions summed) from TritonClient.model_statistics()'s dict."""
    out: dict[str, ModelCounters] = {}
    for model in response.get("model_stats", []):
        counters = ModelCounters(
            requests=int(model.get("inference_stats", {}).get("success", {}).get("count", 0)),
            executions=int(model.get("execution_count", 0)),
            inferences=int(model.get("inference_count", 0)),
            queue_ns=statistics.queue_ns(model),
            compute_ns=statistics.execution_compute_ns(model),
            request_compute_ns=statistics.request_compute_ns(model),
            batches=statistics.batch_executions(model),
        )
        name = model["name"]
        out[name] = out[name].plus(counters) if name in out else counters
    return out


@dataclass(frozen=True)
class Snapshot:
    taken_at: float  # monotonic seconds
    models: dict[str, ModelCounters]

    def since(self, earlier: "Snapshot") -> dict[str, ModelCounters]:
        """What each model did between two snapshots; models that did nothing are left out."""
        out = {}
        for name, now in self.models.items():
            delta = now.minus(earlier.models.get(name, ModelCounters()))
            if delta.requests or delta.executions:
                out[name] = delta
        return out


@dataclass(frozen=True)
class Topology:
    """Which models are ensembles (their steps), which are decoupled, and the public model each leaf serves."""

    ensembles: dict[str, tuple[str, ...]]  # ensemble -> its step models
    decoupled: frozenset[str]

    def owner(self, model: str) -> str:
        """The outermost ensemble that runs `model`, else the model itself."""
        for ensemble, steps in self.ensembles.items():
            if model in steps and not any(ensemble in other for other in self.ensembles.values()):
                return ensemble
        for ensemble, steps in self.ensembles.items():
            if model in steps:
                return self.owner(ensemble)
        return model

    def leaves(self, counters: dict[str, ModelCounters]) -> dict[str, ModelCounters]:
        return {name: c for name, c in counters.items() if name not in self.ensembles}

    def by_public_model(self, counters: dict[str, ModelCounters]) -> dict[str, ModelCounters]:
        """Leaf counters summed per public model (text_embedder = its tokenizer step + its encoder step)."""
        out: dict[str, ModelCounters] = {}
        for name, c in self.leaves(counters).items():
            owner = self.owner(name)
            out[owner] = out[owner].plus(c) if owner in out else c
        return out


async def read_topology(client) -> Topology:
    """From the deployed configs of every loaded model (a TritonClient: its statistics name them)."""
    names = sorted({model["name"] for model in (await client.model_statistics()).get("model_stats", [])})
    ensembles: dict[str, tuple[str, ...]] = {}
    decoupled: set[str] = set()
    for name in names:
        config = await client.model_config(name)
        if config.platform == "ensemble":
            ensembles[config.name] = tuple(step.model_name for step in config.ensemble_scheduling.step)
        if config.model_transaction_policy.decoupled:
            decoupled.add(config.name)
    return Topology(ensembles, frozenset(decoupled))


async def snapshot(client) -> Snapshot:
    return Snapshot(time.monotonic(), parse_statistics(await client.model_statistics()))
