"""A child's output reaches its log file only through the redactor (see ``redact.py``).

A server given ``HF_TOKEN`` in its environment may print it (a config dump, a failed download's
URL); written straight to the log, the token would be on disk and in the report's log tail. So the
child writes to a pipe, and a thread copies the pipe to the log line by line, redacted.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import IO

from bisect_tool.redact import LineRedactor


class LogPump:
    """``fd`` is the write end to give the child (``stdout=pump.fd``); call ``child_started``
    once the child holds it, and ``drain`` to wait until everything it wrote is in the log."""

    def __init__(self, log: IO[bytes]) -> None:
        self._read, self.fd = os.pipe()
        self._log = log
        self._redactor = LineRedactor()
        self._thread = threading.Thread(target=self._copy, daemon=True)
        self._thread.start()

    def child_started(self) -> None:
        """Close our copy of the write end: the pipe then ends when the child's group does."""
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def _copy(self) -> None:
        try:
            while chunk := os.read(self._read, 65536):
                self._log.write(self._redactor.feed(chunk))
            self._log.write(self._redactor.flush())
        except (OSError, ValueError):
            pass
        finally:
            with contextlib.suppress(OSError):
                os.close(self._read)

    def drain(self, timeout_s: float = 10.0) -> None:
        """Wait (bounded: a grandchild that left the process group may hold the pipe open)
        until the copy has reached the end of the child's output."""
        self._thread.join(timeout_s)


def open_pump(path: Path) -> tuple[IO[bytes], LogPump]:
    path.parent.mkdir(parents=True, exist_ok=True)
    log = path.open("ab", buffering=0)
    return log, LogPump(log)
