"""The benchmark scripts: each module is runnable from the checkout's root (`python -m thinkserve_bench.scripts.<name>`)
and writes bench/results/<name>.{json,md}."""
