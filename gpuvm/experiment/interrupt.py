"""Ctrl-C and SIGTERM stop an experiment the same way.

Both become a KeyboardInterrupt in the main thread (Python runs signal handlers there), so
the runner's clean-up stops the running guests whichever one arrived, and the exit status
says which (130 or 143).  A signal that arrives while rows are being written waits until
they are: a run's rows reach the disk all together or not at all.

Python ignores an exception raised where it cannot propagate -- a weakref callback, a
`__del__` -- and prints "Exception ignored in ..." with a traceback.  A signal landing
there would be lost and the experiment would run on (a SIGTERM during a KVM run did
exactly that, 2026-11-29).  So a stop that was received is raised again at the next
`deferred()` block -- before the next run's rows -- and Python's report of the ignored
KeyboardInterrupt is not printed (`sys.unraisablehook`), every other one is.
"""

from __future__ import annotations

import signal
import sys
from contextlib import contextmanager
from types import FrameType
from typing import Any, Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """While entered, SIGINT and SIGTERM raise KeyboardInterrupt (outside `deferred()`)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._depth = 0
        self._pending = False
        self._previous: dict[int, object] = {}
        self._previous_hook = sys.unraisablehook

    def __enter__(self) -> StopSignals:
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        self._previous_hook = sys.unraisablehook
        sys.unraisablehook = self._unraisable
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        sys.unraisablehook = self._previous_hook

    def _unraisable(self, info: Any) -> None:
        """Our own stop, raised where Python ignores exceptions: not reported, since it
        is raised again at the next `deferred()`; anything else as before."""
        if info.exc_type is KeyboardInterrupt and self.received is not None:
            return
        self._previous_hook(info)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
        if self._depth:
            self._pending = True
            return
        raise KeyboardInterrupt

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """A stop signal inside this block takes effect at its end; one received before
        it (its KeyboardInterrupt ignored where it landed) at its start."""
        if self.received is not None and not self._depth:
            raise KeyboardInterrupt
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
