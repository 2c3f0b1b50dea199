"""`python -m orchestrator ...` is `thinkserve ...`, for a checkout that is not pip-installed (a GPU box that
only has torch: `python -m orchestrator bench standins`)."""

import sys

from .cli import main

sys.exit(main())
