"""The server process: deployment.py starts Triton, the knowledge base, the pipeline and the API in order and stops
them in reverse (`thinkserve serve`, the demo, the tests and the benchmarks). It imports the layers, never the client
side (orchestrator.client) nor the command line (orchestrator.cli)."""
