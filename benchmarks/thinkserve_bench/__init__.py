"""ThinkServe's benchmarks, beside the service (it imports the orchestrator; the orchestrator never imports it).

- The harness of `thinkserve-bench` (command.py): latency, load, cost-per-query, model-bound ceiling and ablation
  benchmarks against a live deployment (one the command starts, or one at an address), with reports a capacity
  review can use. The measurement core (stats, timed_calls, machine, prices, query_costs, triton_stats) imports nothing
  heavy, so its arithmetic is unit-tested on synthetic timings; the modes (modes/) talk to the real orchestrator
  over gRPC and to Triton for its server-side statistics.
- catalogue.py: every benchmark behind the one command, `thinkserve-bench NAME` (modes and scripts).
- corpora/: documents written on the fly with known content, for the benchmarks and the tests.
- scripts/: the benchmark scripts (`thinkserve-bench <name>`, from the checkout's root), which write benchmarks/results/.
- gpu/: the GPU device runner (`PYTHONPATH=benchmarks python3 -m thinkserve_bench.gpu.run_on_device` on the GPU machine).
"""
