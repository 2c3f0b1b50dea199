"""Benchmarks: each module is runnable (`python -m benchmarks.<name>`) and writes results/<name>.{json,md}."""
