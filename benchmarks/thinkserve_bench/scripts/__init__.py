"""The benchmark scripts: each module that declares its options (`declare_options`) and runs from them
(`run_benchmark`) is a benchmark, run from the checkout's root as `thinkserve-bench <name>`, that writes
benchmarks/results/<name>.{json,md}; the others are parts they share (catalogue.py tells them apart)."""

import sys


def _refuse_the_old_door() -> None:
    """`python -m thinkserve_bench.scripts.NAME` (the older reports' command) would import the script and do nothing:
    say which command runs it instead. Runs while Python locates the module (sys.argv[0] is then "-m")."""
    argv = getattr(sys, "orig_argv", [])
    if sys.argv[:1] != ["-m"] or "-m" not in argv[:-1]:
        return
    module = argv[argv.index("-m") + 1]
    if not module.startswith(f"{__name__}."):
        return
    from ..catalogue import script_names

    name = module.rsplit(".", 1)[1]
    if name in script_names():
        args = " ".join(argv[argv.index("-m") + 2:])
        sys.exit(f"benchmarks run through one front door: thinkserve-bench {name} {args}".rstrip()
                 + f" (without a pip install: PYTHONPATH=benchmarks python -m thinkserve_bench {name} ...)")


_refuse_the_old_door()
