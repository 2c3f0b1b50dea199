"""How a command line runs one command: its logging, and errors as one line naming the cause (never a traceback
wall; -v shows it), Ctrl-C as status 130. Shared by `thinkserve` (orchestrator/cli/) and the benchmarks' command
`thinkserve-bench` (benchmarks/thinkserve_bench/command.py), which imports it: neither imports the other."""

from __future__ import annotations

import logging
import sys
from typing import Callable

import grpc

from ..errors import ThinkServeError


def run_command(prog: str, args, run: Callable[[object], int]) -> int:
    """run(args) with logging at WARNING (DEBUG with args.verbose); a ThinkServeError, gRPC or OS error becomes
    `PROG: error: CAUSE` and status 2, an interrupt status 130."""
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return run(args)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except (ThinkServeError, grpc.RpcError, OSError) as error:
        if args.verbose:
            raise
        print(f"{prog}: error: {describe(error)}", file=sys.stderr)
        return 2


def describe(error: BaseException) -> str:
    if isinstance(error, grpc.RpcError):
        return f"{error.code().name}: {error.details()}"
    return str(error)
