"""Removing ended VMs' vGPUs on a virtual clock, each removal on a thread of its own.

A vGPU is removed at its VM's last virtual time: the scheduler handles the removal once
device time reaches that time, and the caller waits for it.  A VM that ends a little
later in wall time may have ended earlier in virtual time; the timer its vCPU left behind
holds device time at its own last time until its vGPU is removed.  A run loop that
removed VMs one after another on its own thread waited in the first removal while the
VM holding device time back could not be removed before that returned, until the
scheduler forced the removal after 5 s -- at a time of its own choosing, not the VM's
last time.  (So did reading its scheduler record first, which waits for its last GPU
work.)  With each removal on its own thread, record read first, every ended VM's
removal is under way at once, and the scheduler handles them in virtual-time order
whatever order they began in.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from gpuvm.run.spec import Machine, VmSpec

log = logging.getLogger(__name__)

# how long a run cut short by an error waits for the removals under way: each ends
# within the scheduler's own limit (Submissions.REMOVE_WAIT_S) and the teardown after
REMOVAL_WAIT_S = 30.0


class Removals:
    """The removals a run loop has begun, each on its own thread: what each returns
    (`take`, on the run loop's thread), and `join`, which waits for them all and raises
    the first one's error."""

    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []
        self._errors: list[BaseException] = []
        self._done: list[Any] = []
        self._lock = threading.Lock()

    def start(self, name: str, remove: Callable[[], Any]) -> None:
        def run() -> None:
            try:
                done = remove()
            except BaseException as exc:  # handed to the run loop's thread at join
                log.exception("%s: removal failed", name)
                self._errors.append(exc)
                return
            with self._lock:
                self._done.append(done)
        thread = threading.Thread(target=run, name=f"{name} removal", daemon=True)
        thread.start()
        self._threads.append(thread)

    def take(self) -> list[Any]:
        """What the removals finished since the last look returned."""
        with self._lock:
            done, self._done = self._done, []
        return done

    def join(self, timeout: float | None = None) -> None:
        for thread in self._threads:
            thread.join(timeout)
        self._threads = [t for t in self._threads if t.is_alive()]
        if self._errors:
            raise self._errors.pop(0)


def detach_at_last_time(machine: Machine, spec: VmSpec, party: Any, leaving: Any) -> None:
    """Give back a VM's device on a virtual clock at its vCPU's last time: the calling
    thread stamps the removal with `party`'s (last) time, and `leaving`, the timer that
    holds device time there (None: none does), is let go whatever happens."""
    clock = party.clock
    clock.bind_thread(party)
    try:
        machine.detach(spec)
    finally:
        clock.bind_thread(None)
        if leaving is not None:
            leaving.leave()
