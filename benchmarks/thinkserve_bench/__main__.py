"""`python -m thinkserve_bench ...` is `thinkserve-bench ...`, for a checkout that is not pip-installed (a GPU machine
that only has torch: `PYTHONPATH=benchmarks python -m thinkserve_bench standins`)."""

import sys

from .command import entry

sys.exit(entry())
