"""`thinkserve bench`: latency, load, cost-per-query, model-bound ceiling and ablation benchmarks against a live
deployment (one the command starts, or one at an address), with reports a capacity review can use.

The measurement core (stats, prices, cost, triton_stats) imports nothing heavy, so its arithmetic is unit-tested
on synthetic timings; the modes (modes/) talk to the real orchestrator over gRPC and to Triton for its
server-side statistics.
"""
