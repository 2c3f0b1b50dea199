"""Triton's log copied beside the results as it grows. The first H200 run copied it once, at the end: a command
killed at its time limit would have returned none of it, and a start that hangs is exactly when it is wanted."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable, Optional

LIMIT_BYTES = 4 << 20  # what one command's $OUT should carry of it at most


class TritonLogMirror:
    """Appends what Triton writes to its log (`source()`: its path once known) to `destination` every `interval_s`,
    in a thread, up to `limit_bytes`; past that only a note. stop() copies what is left."""

    def __init__(self, source: Callable[[], Optional[Path]], destination: Path, interval_s: float = 1.0,
                 limit_bytes: int = LIMIT_BYTES):
        self.source, self.destination = source, destination
        self.interval_s, self.limit_bytes = interval_s, limit_bytes
        self.copied = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="triton-log-mirror", daemon=True)
        self._lock = threading.Lock()
        self._truncated = False

    def start(self) -> "TritonLogMirror":
        self.destination.write_bytes(b"")
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sync()

    def sync(self) -> None:
        with self._lock:
            path = self.source()
            if path is None or not path.is_file() or self._truncated:
                return
            with open(path, "rb") as log:
                log.seek(self.copied)
                data = log.read(self.limit_bytes - self.copied + 1)
            if not data:
                return
            with open(self.destination, "ab") as out:
                if self.copied + len(data) > self.limit_bytes:
                    data = data[: self.limit_bytes - self.copied]
                    self._truncated = True
                out.write(data)
                if self._truncated:
                    out.write(f"\n[thinkserve: the log goes on past {self.limit_bytes} bytes; not copied]\n".encode())
            self.copied += len(data)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.sync()
