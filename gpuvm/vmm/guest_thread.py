"""One thread per guest, whichever backend runs it: start, join with a deadline, alive.

Both runners (KVM vCPU, in-process library call) run their guest on a thread of its own
and leave a GuestOutcome when it ends; a guest that overstays its deadline is asked to
stop and given a short grace.  What differs -- how to run the guest, how to stop it, what
to say if its thread will not return -- is the subclass's.
"""

from __future__ import annotations

import threading
import time

from gpuvm.vmm.guest_session import GuestOutcome, GuestSession

STOP_GRACE_S = 5.0


class GuestThread:
    """A guest on a thread of its own, whichever backend runs it: start, deadline, stop; the
    subclass says how to run and stop it."""

    name: str
    backend: str
    session: GuestSession
    thread_prefix = "guest"

    def _init_thread(self) -> None:
        self._thread: threading.Thread | None = None
        self._outcome: GuestOutcome | None = None

    def _main(self) -> None:
        raise NotImplementedError

    def stop(self, reason: str) -> None:
        raise NotImplementedError

    def _not_returned(self) -> str:
        """The failure to report when the guest's thread has not come back after stop."""
        raise NotImplementedError

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self.name}: already started")
        self._thread = threading.Thread(target=self._main,
                                        name=f"{self.thread_prefix}-{self.name}", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> GuestOutcome:
        """Wait for the guest; past `timeout` seconds it is stopped and reported."""
        if self._thread is None:
            raise RuntimeError(f"{self.name}: join() before start()")
        give_up = time.monotonic() + STOP_GRACE_S
        while True:
            try:
                self._thread.join(timeout)
                break
            except RuntimeError:  # a stop signal landed inside start(): not up yet
                if time.monotonic() > give_up:
                    return GuestOutcome(self.name, self.backend, self.session,
                                        failure=self._not_returned())
                time.sleep(0.001)
        if self._thread.is_alive():
            self.stop(f"timed out after {timeout:g} s")
            self._thread.join(STOP_GRACE_S)
        if self._outcome is not None:
            return self._outcome
        return GuestOutcome(self.name, self.backend, self.session, failure=self._not_returned())

    def started(self) -> bool:
        """True once start() was called (its thread may still be on its way up)."""
        return self._thread is not None

    def alive(self) -> bool:
        """True while the guest's thread runs (its RAM and its GPU must stay mapped)."""
        return self._thread is not None and self._thread.is_alive()
