"""The bounded timer on coalesced MMIO: stores never wait in a ring for long.

The exit loop drains its vCPU's coalesced ring before it handles each exit (holding
those stores, and one that found the ring full, when that exit is itself such a
store), so in a guest that keeps exiting a queued store is handed on at the next exit
that is not a posted store.  A guest that spins on memory without exiting would leave
its queued stores unhandled, so one thread looks at every registered ring each
FLUSH_PERIOD_S and kicks the vCPU thread of a ring that holds stores (in the ring, or
held by the exit loop) and has not moved since its last look (the guest has not exited
for a whole period; a guest that keeps exiting is left alone): KVM_RUN returns EINTR
and the loop drains before it re-enters.  So no store waits much over two periods.  A
kick is not an exit of the modelled system (nothing is counted or ticked for it).
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

from gpuvm.vmm.kvm.kick import kick

FLUSH_PERIOD_S = 0.01


class Ring(Protocol):
    """A vCPU's coalesced-MMIO ring, as the flusher sees it: (first, last, held) -- stores
    wait in the ring while first and last differ, and `held` more after it."""

    def ring_state(self) -> tuple[int, int, int]: ...


class RingFlusher:
    """Kicks the vCPU threads whose coalesced rings hold stores, every `period_s`."""

    def __init__(self, period_s: float = FLUSH_PERIOD_S) -> None:
        self.period_s = period_s
        self._rings: dict[int, Ring] = {}  # vCPU thread ident -> its loop
        self._seen: dict[int, tuple[int, int]] = {}  # its ring's (first, last) last look
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, thread_ident: int, ring: Ring) -> None:
        with self._lock:
            self._rings[thread_ident] = ring
            if self._thread is None:
                self._thread = threading.Thread(target=self._main, name="coalesced-flusher",
                                                daemon=True)
                self._thread.start()
            self._lock.notify()

    def remove(self, thread_ident: int) -> None:
        """Stop looking at the ring (before its mapping goes away)."""
        with self._lock:
            self._rings.pop(thread_ident, None)
            self._seen.pop(thread_ident, None)

    def _main(self) -> None:
        while True:
            with self._lock:
                while not self._rings:
                    self._lock.wait()
                for ident, ring in self._rings.items():
                    state = ring.ring_state()
                    waiting = state[0] != state[1] or state[2]
                    if waiting and self._seen.get(ident) == state:
                        kick(ident)  # under the lock: the thread is still in its loop
                    self._seen[ident] = state
            time.sleep(self.period_s)


FLUSHER = RingFlusher()
