"""Queries sent one after another through the orchestrator's gRPC API, each timed by the client: the own-time
benchmark's view from outside the server (benchmarks/thinkserve_bench/scripts/own_time.py starts this in a process of its own).

    python -m thinkserve_bench.scripts.grpc_query_timing ADDRESS COLLECTION ROUTE WARM_UP < questions.json > timings.json

The questions come as a JSON list of texts on standard input; the first WARM_UP are asked and not reported. Out,
as JSON: per query the client's wall time from sending the request to the last event, and the final event's
cost (the time a model call was in flight, and what the server counted as its own).
"""

from __future__ import annotations

import json
import sys
import time

from orchestrator.client import ThinkServeClient


def ask(client: ThinkServeClient, collection: str, question: str, route: str) -> dict:
    started = time.perf_counter()
    final = None
    for event in client.query(collection, question, route=route):
        if event.HasField("final"):
            final = event.final
    wall_ms = (time.perf_counter() - started) * 1000
    if final is None:
        raise RuntimeError(f"the query {question!r} ended without its final event")
    return {"wall_ms": wall_ms, "model_ms": final.cost.model_ms, "orchestrator_ms": final.cost.orchestrator_ms}


def main() -> None:
    address, collection, route, warm_up = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    questions = json.load(sys.stdin)
    with ThinkServeClient(address, timeout_s=60.0) as client:
        timings = [ask(client, collection, question, route) for question in questions]
    json.dump(timings[warm_up:], sys.stdout)


if __name__ == "__main__":
    main()
