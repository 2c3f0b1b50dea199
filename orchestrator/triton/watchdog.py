"""Ends a tritonserver and its stubs when the process that launched it is gone, however it ended (SIGKILL too).

Triton runs in a session of its own (so a terminal's Ctrl-C reaches the orchestrator, which stops it in order),
which also means nothing ends it when the orchestrator dies without stopping it: a supervisor restarting a
crashed orchestrator would leak one Triton, its stubs and their shared memory per crash. The launcher starts
this watchdog beside the server, in a session of its own as well, with the read end of a pipe as its stdin;
only the launcher holds the write end. The kernel closes that end when the launcher's process ends, whatever
the cause, and the watchdog then stops the server's process group: SIGTERM, SIGKILL after the grace period,
then it removes the group's shared-memory regions. An orderly stop closes the pipe after the server is gone,
and the watchdog finds nothing to do. It also leaves as soon as the process group is empty (a server that
exited on its own), so it never signals a group id the system has since given to other processes.

Run as a script, with nothing imported from the project (it must start fast and survive a broken checkout):
    python watchdog.py PROCESS_GROUP SHM_PREFIX GRACE_SECONDS   (stdin: the pipe)
"""

from __future__ import annotations

import glob
import os
import select
import signal
import sys
import time

POLL_S = 1.0  # how often the process group is checked for being empty while the launcher lives


def group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def launcher_gone(pipe: int, group: int) -> bool:
    """Wait until the launcher's end of the pipe closes (True) or the group is empty (False)."""
    while group_alive(group):
        readable, _, _ = select.select([pipe], [], [], POLL_S)
        if readable and not os.read(pipe, 4096):
            return True
    return False


def stop_group(group: int, grace_s: float) -> None:
    """SIGTERM to every process of the group, SIGKILL to what is left after `grace_s`."""
    try:
        os.killpg(group, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and group_alive(group):
        time.sleep(0.1)
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main(argv: list[str]) -> int:
    group, shm_prefix, grace_s = int(argv[1]), argv[2], float(argv[3])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a stop is the launcher's to make, or its death's
    if launcher_gone(sys.stdin.fileno(), group):
        stop_group(group, grace_s)
        for region in glob.glob(f"/dev/shm/{glob.escape(shm_prefix)}*"):
            try:
                os.unlink(region)
            except OSError:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
