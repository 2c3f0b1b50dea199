"""The benchmark scripts: each module with a `main` runs from the checkout's root as `thinkserve-bench <name>` (also
`python -m thinkserve_bench.scripts.<name>`) and writes bench/results/<name>.{json,md}; the others are parts they
share (catalogue.py tells them apart)."""
