"""`python -m orchestrator ...` is `thinkserve ...`, for a checkout that is not pip-installed (the benchmarks'
command likewise: `PYTHONPATH=benchmarks python -m thinkserve_bench ...`)."""

import sys

from .cli import main

sys.exit(main())
