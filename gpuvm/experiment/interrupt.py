"""Ctrl-C and SIGTERM stop an experiment the same way.

Both become a KeyboardInterrupt in the main thread (Python runs signal handlers there), so
the runner's clean-up stops the running guests whichever one arrived, and the exit status
says which (130 or 143).  A signal that arrives while rows are being written waits until
they are: a run's rows reach the disk all together or not at all.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from types import FrameType
from typing import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """While entered, SIGINT and SIGTERM raise KeyboardInterrupt (outside `deferred()`)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._depth = 0
        self._pending = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
        if self._depth:
            self._pending = True
            return
        raise KeyboardInterrupt

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """A stop signal inside this block takes effect at its end."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth and self._pending:
                self._pending = False
                raise KeyboardInterrupt

    @property
    def exit_status(self) -> int:
        """128 + the signal, as a shell reports a process killed by it (130 by default)."""
        return 128 + (self.received or signal.SIGINT)
