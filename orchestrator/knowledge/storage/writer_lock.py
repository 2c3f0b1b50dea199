"""One writing process per data folder: an exclusive lock on `<data_dir>/writer.lock`, held while it writes.

Two writers on one folder would each clean up folders their manifests do not name, which can be the other's
segment in the middle of a commit, and each would switch manifests over the other's. The lock is a `flock` on
an open file, so the kernel releases it when its process ends, however it ends (SIGKILL included): a crashed
writer never leaves a stale lock behind. The file names its holder (pid, host, since when), so a second writer
can say who holds it. Read replicas (KnowledgeBase(read_only=True)) take no lock: any number may follow.

Within one process the lock is shared: every writable KnowledgeBase of a folder holds one reference to it (a
process is one writer; tests and tools open a folder more than once). `flock` works on local filesystems; on a
network filesystem whose locks are not coherent across machines, run one writer by deployment, not by lock.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

from ...errors import DataFolderLockedError

LOCK_FILE = "writer.lock"

_held: dict[Path, "_Lock"] = {}  # resolved lock path -> the open lock of this process
_guard = threading.Lock()


class _Lock:
    def __init__(self, path: Path, descriptor: int):
        self.path = path
        self.descriptor = descriptor
        self.references = 0


class WriterLock:
    """This process's hold on a data folder's writer lock; release() gives it up (once every holder has)."""

    def __init__(self, data_dir: Path):
        data_dir.mkdir(parents=True, exist_ok=True)
        self.path = (data_dir / LOCK_FILE).resolve()
        with _guard:
            held = _held.get(self.path)
            if held is None:
                held = _held[self.path] = _Lock(self.path, _acquire(self.path))
            held.references += 1
        self._released = False

    def release(self) -> None:
        with _guard:
            if self._released:
                return
            self._released = True
            held = _held[self.path]
            held.references -= 1
            if held.references == 0:
                del _held[self.path]
                os.close(held.descriptor)  # closing the last descriptor of the open file drops the flock


def holder(data_dir: Path) -> dict:
    """What the lock file says about its holder ({} when there is none or it cannot be read)."""
    try:
        return json.loads((data_dir / LOCK_FILE).read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}


def _acquire(path: Path) -> int:
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        os.close(descriptor)
        if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        found = holder(path.parent)
        who = (f"process {found.get('pid')} on {found.get('host')} since {found.get('since')} ({found.get('command')})"
               if found else "another process")
        raise DataFolderLockedError(
            f"data folder {path.parent} is held by its writer, {who}: one process writes a data folder; "
            "start this one as a read replica (serve --read-only, storage.read_only) or stop the writer"
        ) from None
    os.ftruncate(descriptor, 0)  # the holder's description: written only once the lock is ours
    os.write(descriptor, json.dumps({
        "pid": os.getpid(), "host": socket.gethostname(),
        "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": " ".join(sys.argv[:3]),
    }).encode())
    os.fsync(descriptor)
    return descriptor
